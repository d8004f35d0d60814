//! The service's shared state: one [`AppState`] handed to every handler and background task.
//!
//! Locks are parking_lot mutexes held for microseconds and never across an `.await`. Order,
//! where more than one is taken: registry, then a worker's own locks, then assignments,
//! speculative, approx, rng.

use crate::assign::{Assignments, Speculative};
use crate::config::{Config, ConfigError, WorkerConfig};
use crate::index::KvIndex;
use crate::load::Scraper;
use crate::metrics::{fleet::FleetCollector, ExpiryKind, Metrics};
use crate::registry::{Registry, RegistryError, WorkerEntry};
use crate::score::{ApproxMap, Calibration, Policy};
use crate::store::{memory::MemoryStore, SharedStore};
use crate::tokenize::{collector::TokenizerCollector, Tokenization};
use parking_lot::{Mutex, RwLock};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::ops::Deref;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Starts what feeds a worker (metrics scraper, KV-event ingestion). Absent in unit tests,
/// which drive state directly.
pub trait WorkerTasks: Send + Sync + 'static {
    fn start(&self, state: &AppState, worker: &Arc<WorkerEntry>);
}

pub struct Shared {
    pub config: Config,
    pub registry: Arc<RwLock<Registry>>,
    pub index: Arc<dyn KvIndex>,
    pub assignments: Arc<Mutex<Assignments>>,
    pub speculative: Mutex<Speculative>,
    pub approx: Mutex<ApproxMap>,
    pub policy: RwLock<Policy>,
    pub rng: Mutex<StdRng>,
    pub round_robin: AtomicUsize,
    pub metrics: Metrics,
    pub scraper: Scraper,
    /// Where shared state goes (memory: nowhere; redis: other replicas).
    pub store: Arc<dyn SharedStore>,
    /// Text/chat prompts -> token ids (local tokenizers, worker `/tokenize`).
    pub tokenization: Tokenization,
    tasks: Mutex<Option<Arc<dyn WorkerTasks>>>,
}

#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AddWorkerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl AppState {
    /// Builds the state and registers the configured workers (their tasks start later, with
    /// [`AppState::set_worker_tasks`]).
    pub fn new(config: Config, index: Arc<dyn KvIndex>) -> Result<AppState, AddWorkerError> {
        AppState::with_store(config, index, Arc::new(MemoryStore))
    }

    /// [`AppState::new`] with a shared store, attached (its tasks started) once built.
    pub fn with_store(config: Config, index: Arc<dyn KvIndex>, store: Arc<dyn SharedStore>) -> Result<AppState, AddWorkerError> {
        let t = &config.timeouts;
        let registry = Arc::new(RwLock::new(Registry::new()));
        let assignments = Arc::new(Mutex::new(Assignments::new(ms(t.assignment_ttl_ms), ms(t.first_token_ttl_ms))));
        let mut metrics = Metrics::new();
        metrics.register_fleet(FleetCollector { registry: registry.clone(), index: index.clone(), assignments: assignments.clone() });
        if let Some(collector) = store.collector() {
            metrics.register_collector(collector);
        }
        let tokenization = Tokenization::new(&config);
        metrics.register_collector(Box::new(TokenizerCollector { local: tokenization.local.clone() }));
        let rng = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        let scraper = Scraper {
            client: reqwest::Client::new(),
            interval: ms(t.scrape_interval_ms),
            timeout: ms(t.scrape_timeout_ms),
            unhealthy_after: config.unhealthy_after,
        };
        let shared = Shared {
            registry,
            index,
            assignments,
            speculative: Mutex::new(Speculative::new(ms(t.speculative_ttl_ms))),
            approx: Mutex::new(ApproxMap::new(config.approx_capacity)),
            policy: RwLock::new(config.policy),
            rng: Mutex::new(rng),
            round_robin: AtomicUsize::new(0),
            metrics,
            scraper,
            store,
            tokenization,
            tasks: Mutex::new(None),
            config,
        };
        let state = AppState(Arc::new(shared));
        for worker in state.config.workers.clone() {
            state.add_worker(worker)?;
        }
        state.store.attach(&state);
        Ok(state)
    }

    /// Installs the task starter and starts it for every worker registered so far.
    pub fn set_worker_tasks(&self, tasks: Arc<dyn WorkerTasks>) {
        // Held while starting, so a worker registered concurrently (a replica adopting a
        // shared one) is started exactly once: here or by `add_worker`.
        let mut slot = self.tasks.lock();
        *slot = Some(tasks.clone());
        for worker in self.registry.read().all() {
            tasks.start(self, &worker);
        }
    }

    /// Validates and registers a worker, and starts its tasks if a starter is installed.
    pub fn add_worker(&self, worker: WorkerConfig) -> Result<Arc<WorkerEntry>, AddWorkerError> {
        self.config.validate_worker(&worker)?;
        let block_size = self.config.worker_block_size(&worker);
        let p = &self.config.priors;
        let calibration = Calibration::new(
            worker.overhead_ms.unwrap_or(p.overhead_ms),
            worker.per_token_ms.unwrap_or(p.per_token_ms),
            p.default_request_tokens,
        );
        let tasks = self.tasks.lock();
        let entry = self.registry.write().add(worker, block_size, calibration)?;
        if let Some(tasks) = tasks.as_ref() {
            tasks.start(self, &entry);
        }
        drop(tasks);
        tracing::info!(worker = %entry.id, engines = entry.engines.len(), "worker registered");
        Ok(entry)
    }

    /// Unregisters a worker, stops its tasks and forgets everything learned about it.
    pub fn remove_worker(&self, id: &str) -> bool {
        // The task slot first, as in `add_worker`: a worker being registered has its tasks
        // started before it can be removed (and stopped here).
        let tasks = self.tasks.lock();
        let Some(entry) = self.registry.write().remove(id) else { return false };
        drop(tasks);
        entry.stop_tasks();
        for slot in entry.slots() {
            self.index.clear_engine(slot);
        }
        self.assignments.lock().forget_worker(&entry.id);
        self.speculative.lock().forget_worker(&entry.id);
        self.approx.lock().forget_worker(&entry.id);
        self.update_in_flight();
        tracing::info!(worker = %entry.id, "worker removed");
        true
    }

    /// Frees expired assignments and speculative credit. Run periodically and before any
    /// answer that reports assignments, so paused-time tests see expiry without a timer.
    pub fn sweep(&self) {
        let now = Instant::now();
        let expired = self.assignments.lock().expire(now);
        self.speculative.lock().purge(now);
        self.metrics.count_expired(ExpiryKind::FirstToken, expired.first_token);
        self.metrics.count_expired(ExpiryKind::Complete, expired.complete);
        self.update_in_flight();
    }

    /// Forgets learned approximate keys, speculative credit, assignments and calibration
    /// (between benchmark passes: each starts from the same priors, so one policy's overload
    /// does not shape the next one's costs). Index and load are facts about the workers and stay.
    pub fn reset(&self) {
        for worker in self.registry.read().all() {
            worker.calibration.lock().reset();
        }
        self.assignments.lock().clear();
        self.speculative.lock().clear();
        self.approx.lock().clear();
        self.round_robin.store(0, std::sync::atomic::Ordering::Relaxed);
        self.update_in_flight();
    }

    pub fn update_in_flight(&self) {
        let n = self.assignments.lock().len();
        self.metrics.assignments_in_flight.set(n as i64);
    }

    /// Ready: at least one worker registered and healthy.
    pub fn ready(&self) -> bool {
        self.registry.read().all().iter().any(|w| w.load.lock().healthy)
    }
}
