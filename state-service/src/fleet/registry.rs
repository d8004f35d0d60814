//! The fleet: workers and their engines, from the config file and the registration API.
//!
//! A worker is what the proxy routes to; an engine is one (worker, data-parallel rank), the
//! unit that publishes KV events and owns a cache. Engines get dense [`EngineSlot`]s, never
//! reused within a process, so a late event of a removed worker can never land on a new one.
//! Each worker record also carries its mutable runtime state (load, calibration, the tasks
//! that feed it), so removing a worker drops all of it at once.

use super::feed::FeedStats;
use crate::config::WorkerConfig;
use crate::load::{Check, LoadState, ScrapeTarget};
use kvroute_score::Calibration;
use kvroute_kv::types::{EngineSlot, WorkerId};
use parking_lot::Mutex;
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::task::AbortHandle;

/// One (worker, rank) engine.
pub struct Engine {
    pub slot: EngineSlot,
    pub rank: u32,
    /// Set once ingestion for this engine runs.
    pub feed: Mutex<Option<Arc<dyn FeedStats>>>,
}

/// A registered worker and its runtime state.
pub struct WorkerEntry {
    pub id: WorkerId,
    pub config: WorkerConfig,
    pub block_size: u32,
    pub engines: Vec<Engine>,
    /// Written by the worker's scraper, read by picks.
    pub load: Arc<Mutex<LoadState>>,
    pub calibration: Mutex<Calibration>,
    /// Background tasks (scraper) aborted when the worker is removed.
    tasks: Mutex<Vec<AbortHandle>>,
    /// Handles whose drop stops something (ingestion threads), dropped on removal.
    guards: Mutex<Vec<Box<dyn Any + Send>>>,
}

impl std::fmt::Debug for WorkerEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerEntry").field("id", &self.id).field("engines", &self.engines.len()).finish_non_exhaustive()
    }
}

impl WorkerEntry {
    pub fn slots(&self) -> impl Iterator<Item = EngineSlot> + '_ {
        self.engines.iter().map(|e| e.slot)
    }

    /// What the scraper checks of this worker: its metrics URL, else its endpoint's
    /// `/health` (probed only while suspect); `None` without either.
    pub fn scrape_target(&self) -> Option<ScrapeTarget> {
        let (url, check) = match (&self.config.metrics_url, self.config.endpoint.is_empty()) {
            (Some(url), _) => (url.clone(), Check::Metrics),
            (None, false) => (format!("http://{}/health", self.config.endpoint), Check::Health),
            (None, true) => return None,
        };
        Some(ScrapeTarget { worker: self.id.clone(), url, check, load: self.load.clone(), on_capacity: None })
    }

    pub fn add_task(&self, task: AbortHandle) {
        self.tasks.lock().push(task);
    }

    /// Keeps `guard` alive until the worker is removed.
    pub fn add_guard(&self, guard: Box<dyn Any + Send>) {
        self.guards.lock().push(guard);
    }

    /// Aborts the worker's tasks and drops its guards (which may join threads: call it
    /// without holding the registry lock).
    pub fn stop_tasks(&self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
        let guards: Vec<_> = self.guards.lock().drain(..).collect();
        drop(guards);
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    #[error("worker {0:?} already exists")]
    Duplicate(String),
    #[error("worker {id:?}: block_size {got} differs from {want} of the other workers of model {model:?}")]
    BlockSize { id: String, model: String, got: u32, want: u32 },
    /// A name must mean one thing fleet-wide: a base model, or an adapter of one base model
    /// (its tokenizer, block size and key root follow from that).
    #[error("worker {id:?}: {name:?} is {conflict}")]
    ModelName { id: String, name: String, conflict: String },
}

#[derive(Default)]
pub struct Registry {
    workers: BTreeMap<WorkerId, Arc<WorkerEntry>>,
    next_slot: u32,
}

impl Registry {
    pub fn new() -> Self {
        Registry::default()
    }

    /// Registers a validated worker; `calibration` starts from its priors.
    pub fn add(&mut self, config: WorkerConfig, block_size: u32, calibration: Calibration) -> Result<Arc<WorkerEntry>, RegistryError> {
        let id = WorkerId::new(&config.id);
        if self.workers.contains_key(&id) {
            return Err(RegistryError::Duplicate(config.id));
        }
        if let Some(want) = self.model_block_size(&config.model) {
            if want != block_size {
                return Err(RegistryError::BlockSize { id: config.id, model: config.model, got: block_size, want });
            }
        }
        self.check_names(&config)?;
        let engines = (0..config.dp_ranks)
            .map(|rank| {
                self.next_slot += 1;
                Engine { slot: EngineSlot(self.next_slot - 1), rank, feed: Mutex::new(None) }
            })
            .collect();
        let entry = Arc::new(WorkerEntry {
            id: id.clone(),
            config,
            block_size,
            engines,
            load: Arc::new(Mutex::new(LoadState::default())),
            calibration: Mutex::new(calibration),
            tasks: Mutex::new(Vec::new()),
            guards: Mutex::new(Vec::new()),
        });
        self.workers.insert(id, entry.clone());
        Ok(entry)
    }

    /// Unregisters a worker. The caller stops its tasks and clears its engines from the index.
    pub fn remove(&mut self, id: &str) -> Option<Arc<WorkerEntry>> {
        self.workers.remove(&WorkerId::new(id))
    }

    pub fn get(&self, id: &str) -> Option<Arc<WorkerEntry>> {
        self.workers.get(&WorkerId::new(id)).cloned()
    }

    /// Workers serving `model` (their base model, or one of their LoRA adapters), in id order.
    pub fn for_model(&self, model: &str) -> Vec<Arc<WorkerEntry>> {
        self.serving(model).cloned().collect()
    }

    /// [`Registry::for_model`] without collecting.
    pub fn serving<'a>(&'a self, model: &'a str) -> impl Iterator<Item = &'a Arc<WorkerEntry>> + 'a {
        self.workers.values().filter(move |w| w.config.serves(model))
    }

    pub fn all(&self) -> Vec<Arc<WorkerEntry>> {
        self.workers.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// A new worker's base model must not be another's adapter, and its adapters must not be
    /// another's base model or another base model's adapter.
    fn check_names(&self, config: &WorkerConfig) -> Result<(), RegistryError> {
        let conflict = |name: &str, conflict: String| RegistryError::ModelName { id: config.id.clone(), name: name.to_string(), conflict };
        for w in self.workers.values() {
            if w.config.lora_adapters.contains(&config.model) {
                return Err(conflict(&config.model, format!("a LoRA adapter of worker {:?}", w.id.as_str())));
            }
            for adapter in &config.lora_adapters {
                if w.config.model == *adapter {
                    return Err(conflict(adapter, format!("the base model of worker {:?}", w.id.as_str())));
                }
                if w.config.lora_adapters.contains(adapter) && w.config.model != config.model {
                    return Err(conflict(adapter, format!("an adapter of {:?} on worker {:?}", w.config.model, w.id.as_str())));
                }
            }
        }
        Ok(())
    }

    /// The block size of `model`'s workers, if any is registered.
    pub fn model_block_size(&self, model: &str) -> Option<u32> {
        self.workers.values().find(|w| w.config.model == model).map(|w| w.block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(r: &mut Registry, id: &str, ranks: u32, block_size: u32) -> Result<Arc<WorkerEntry>, RegistryError> {
        let config = WorkerConfig { dp_ranks: ranks, ..WorkerConfig::new(id, "m") };
        r.add(config, block_size, Calibration::new(15.0, 0.1, 512))
    }

    #[test]
    fn engines_get_dense_slots_never_reused() {
        let mut r = Registry::new();
        let a = add(&mut r, "a", 2, 16).unwrap();
        assert_eq!(a.slots().collect::<Vec<_>>(), vec![EngineSlot(0), EngineSlot(1)]);
        assert!(r.remove("a").is_some());
        let b = add(&mut r, "b", 1, 16).unwrap();
        assert_eq!(b.slots().collect::<Vec<_>>(), vec![EngineSlot(2)]);
        assert!(r.remove("a").is_none());
    }

    #[test]
    fn a_name_is_a_base_model_or_one_base_model_s_adapter() {
        let mut r = Registry::new();
        let with = |id: &str, model: &str, adapters: &[&str]| WorkerConfig {
            lora_adapters: adapters.iter().map(|a| a.to_string()).collect(),
            ..WorkerConfig::new(id, model)
        };
        let cal = || Calibration::new(15.0, 0.1, 512);
        r.add(with("a", "m", &["sql"]), 16, cal()).unwrap();
        r.add(with("b", "m", &["sql", "chat"]), 16, cal()).unwrap();
        for bad in [with("c", "other", &["sql"]), with("d", "sql", &[]), with("e", "other", &["m"])] {
            assert!(matches!(r.add(bad.clone(), 16, cal()), Err(RegistryError::ModelName { .. })), "{bad:?}");
        }
        assert_eq!(r.for_model("sql").len(), 2);
        assert_eq!(r.for_model("chat").len(), 1);
    }

    #[test]
    fn rejects_duplicates_and_block_size_conflicts() {
        let mut r = Registry::new();
        add(&mut r, "a", 1, 16).unwrap();
        assert_eq!(add(&mut r, "a", 1, 16).err(), Some(RegistryError::Duplicate("a".into())));
        assert!(matches!(add(&mut r, "b", 1, 32), Err(RegistryError::BlockSize { .. })));
        assert_eq!(r.for_model("m").len(), 1);
        assert_eq!(r.model_block_size("m"), Some(16));
    }
}
