//! The fleet model: which workers serve which models, how loaded they are, how fast they
//! prefill (calibration), what we assigned them and have not heard the end of, and the
//! short-lived credit a pick gives its worker.
//!
//! It changes only through one typed [`FleetEvent`] and [`Fleet::apply`], whether the event
//! comes from this replica (a pick, a report, the admin API) or from another replica through
//! the shared store: the calibration branch, the assignment bookkeeping and worker removal
//! each exist once. Reads are snapshots ([`Fleet::model_view`]) that the pick computes on
//! without holding any fleet lock. Scraped load is the one exception to "events only": the
//! scraper writes a worker's own [`LoadState`] cell directly (a fact about the worker, not a
//! decision to replicate).
//!
//! Locks are parking_lot mutexes held for microseconds and never across an `.await`. Order,
//! where more than one is taken: registry, then a worker's own locks, then assignments, then
//! speculative, then approx.

pub mod collector;
pub mod event;
pub mod feed;
pub mod registry;

pub use event::{Applied, FleetEvent, Usage};
pub use feed::{FeedSnapshot, FeedStats};
pub use registry::{Engine, Registry, RegistryError, WorkerEntry};

use crate::assign::{Assignment, Assignments, ReportOutcome, Speculative};
use crate::config::{Config, ConfigError, WorkerConfig};
use crate::index::KvIndex;
use crate::load::LoadState;
use crate::score::{ApproxMap, Calibration};
use crate::types::{BlockKey, WorkerId};
use parking_lot::{Mutex, MutexGuard, RwLock};
use prometheus_client::metrics::gauge::Gauge;
use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Why a worker was not registered.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AddWorkerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The fleet answered a registration with something else (a bug, logged, never a panic).
    #[error("unexpected registration outcome: {0}")]
    Unexpected(String),
}

/// A read-only view of the assignment table (API listings, tests).
pub struct AssignmentsView<'a>(MutexGuard<'a, Assignments>);

impl Deref for AssignmentsView<'_> {
    type Target = Assignments;
    fn deref(&self) -> &Assignments {
        &self.0
    }
}

/// One worker of a model as a pick sees it: copied out under the locks, consistent per worker.
#[derive(Clone)]
pub struct WorkerView {
    pub entry: Arc<WorkerEntry>,
    pub load: crate::load::VllmLoad,
    pub pending: crate::assign::Pending,
    pub per_token_ms: f64,
    pub overhead_ms: f64,
}

/// A pick's one snapshot of its model: the healthy workers serving `model` (a base model
/// or a LoRA adapter), their block size, and whether any is registered at all.
pub struct ModelView {
    pub workers: Vec<WorkerView>,
    pub block_size: u32,
    /// Some worker serves the model, healthy or not.
    pub known: bool,
    /// The base model whose tokenizer and chat template render the prompt.
    pub base_model: String,
}

/// What tokenizing a prompt for `model` needs: the base model (its tokenizer and chat
/// template), the block size to cut keys with, and healthy workers to ask for `/tokenize`.
pub struct TokenizeTarget {
    pub base_model: String,
    pub block_size: u32,
    pub workers: Vec<Arc<WorkerEntry>>,
}

pub struct Fleet {
    config: Arc<Config>,
    registry: RwLock<Registry>,
    assignments: Mutex<Assignments>,
    speculative: Mutex<Speculative>,
    approx: Mutex<ApproxMap>,
    index: Arc<dyn KvIndex>,
    /// `kvroute_assignments_in_flight`, kept equal to the table's size.
    in_flight: Gauge,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl Fleet {
    /// An empty fleet; `in_flight` is the gauge it keeps current.
    pub fn new(config: Arc<Config>, index: Arc<dyn KvIndex>, in_flight: Gauge) -> Fleet {
        let t = &config.timeouts;
        Fleet {
            registry: RwLock::new(Registry::new()),
            assignments: Mutex::new(Assignments::new(ms(t.assignment_ttl_ms), ms(t.first_token_ttl_ms))),
            speculative: Mutex::new(Speculative::new(ms(t.speculative_ttl_ms))),
            approx: Mutex::new(ApproxMap::new(config.approx_capacity)),
            index,
            in_flight,
            config,
        }
    }

    /// Applies one change. Idempotent where replication needs it: an assignment already
    /// known, a worker already registered or already gone changes nothing.
    pub fn apply(&self, event: &FleetEvent, now: Instant) -> Applied {
        let applied = match event {
            FleetEvent::Assigned { assignment, credit } => self.assign(assignment, credit, now),
            FleetEvent::FirstToken { id, elapsed_ms } => self.first_token(*id, *elapsed_ms, now),
            FleetEvent::Completed { id, .. } | FleetEvent::Cancelled { id } => match self.assignments.lock().finish(*id) {
                ReportOutcome::Freed(a) => Applied::Freed(a),
                _ => Applied::Unknown,
            },
            FleetEvent::WorkerAdded(config) => match self.add_worker(config) {
                Ok(entry) => Applied::WorkerAdded(entry),
                Err(e) => Applied::Rejected(e),
            },
            FleetEvent::WorkerRemoved(id) => self.remove_worker(id).map_or(Applied::Unknown, Applied::WorkerRemoved),
            FleetEvent::CalibrationRestored { worker, calibration } => match self.worker(worker.as_str()) {
                Some(w) => {
                    *w.calibration.lock() = *calibration;
                    Applied::Calibrated(worker.clone(), *calibration)
                }
                None => Applied::Unknown,
            },
        };
        self.in_flight.set(self.assignments.lock().len() as i64);
        applied
    }

    fn assign(&self, assignment: &Assignment, credit: &[BlockKey], now: Instant) -> Applied {
        {
            let mut table = self.assignments.lock();
            if table.contains(assignment.id) {
                return Applied::Duplicate;
            }
            table.insert(assignment.clone());
        }
        if !credit.is_empty() {
            self.speculative.lock().credit(credit, &assignment.worker, now);
        }
        Applied::Assigned
    }

    /// The one calibration branch: a first token with a usable elapsed time refits the
    /// worker's cost model from the features its pick predicted with.
    fn first_token(&self, id: crate::assign::AssignmentId, elapsed_ms: f64, now: Instant) -> Applied {
        let outcome = self.assignments.lock().first_token(id, now);
        match outcome {
            ReportOutcome::FirstToken(a) => {
                let calibration = (elapsed_ms.is_finite() && elapsed_ms > 0.0)
                    .then(|| self.worker(a.worker.as_str()))
                    .flatten()
                    .map(|w| {
                        let mut c = w.calibration.lock();
                        c.observe(&a.features, elapsed_ms);
                        *c
                    });
                Applied::FirstToken { assignment: a, calibration }
            }
            ReportOutcome::Duplicate => Applied::Duplicate,
            ReportOutcome::Freed(_) | ReportOutcome::Unknown => Applied::Unknown,
        }
    }

    fn add_worker(&self, worker: &WorkerConfig) -> Result<Arc<WorkerEntry>, AddWorkerError> {
        self.config.validate_worker(worker)?;
        let block_size = self.config.worker_block_size(worker);
        let p = &self.config.priors;
        let calibration = Calibration::new(
            worker.overhead_ms.unwrap_or(p.overhead_ms),
            worker.per_token_ms.unwrap_or(p.per_token_ms),
            p.default_request_tokens,
        );
        let entry = self.registry.write().add(worker.clone(), block_size, calibration)?;
        tracing::info!(worker = %entry.id, engines = entry.engines.len(), "worker registered");
        Ok(entry)
    }

    /// Unregisters a worker and forgets everything learned about it. Its tasks are the
    /// caller's to stop (they may join threads: not under a fleet lock).
    fn remove_worker(&self, id: &WorkerId) -> Option<Arc<WorkerEntry>> {
        let entry = self.registry.write().remove(id.as_str())?;
        for slot in entry.slots() {
            self.index.clear_engine(slot);
        }
        self.assignments.lock().forget_worker(&entry.id);
        self.speculative.lock().forget_worker(&entry.id);
        self.approx.lock().forget_worker(&entry.id);
        tracing::info!(worker = %entry.id, "worker removed");
        Some(entry)
    }

    /// Frees expired assignments and speculative credit; returns (first-token, complete)
    /// expiries for the metrics.
    pub fn sweep(&self, now: Instant) -> (u64, u64) {
        let expired = self.assignments.lock().expire(now);
        self.speculative.lock().purge(now);
        self.in_flight.set(self.assignments.lock().len() as i64);
        (expired.first_token, expired.complete)
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
        self.in_flight.set(0);
    }

    pub fn worker(&self, id: &str) -> Option<Arc<WorkerEntry>> {
        self.registry.read().get(id)
    }

    pub fn workers(&self) -> Vec<Arc<WorkerEntry>> {
        self.registry.read().all()
    }

    pub fn assignments(&self) -> AssignmentsView<'_> {
        AssignmentsView(self.assignments.lock())
    }

    pub fn index(&self) -> &Arc<dyn KvIndex> {
        &self.index
    }

    /// At least one worker registered and healthy.
    pub fn ready(&self) -> bool {
        self.registry.read().all().iter().any(|w| w.load.lock().healthy)
    }

    /// The one snapshot a pick decides on: `model`'s healthy workers with their load, pending
    /// assignments and calibration, read under one registry lock and one table lock.
    pub fn model_view(&self, model: &str) -> ModelView {
        let registry = self.registry.read();
        let serving = registry.for_model(model);
        let known = !serving.is_empty();
        let base_model = serving.first().map_or_else(|| model.to_string(), |w| w.config.model.clone());
        let block_size = serving.first().map_or(0, |w| w.block_size);
        let table = self.assignments.lock();
        let workers = serving
            .into_iter()
            .filter_map(|entry| {
                let load = {
                    let l: parking_lot::MutexGuard<'_, LoadState> = entry.load.lock();
                    if !l.healthy {
                        return None;
                    }
                    l.load.clone()
                };
                let (per_token_ms, overhead_ms) = {
                    let c = entry.calibration.lock();
                    (c.per_token_ms(), c.overhead_ms())
                };
                Some(WorkerView { pending: table.pending(&entry.id), load, per_token_ms, overhead_ms, entry })
            })
            .collect();
        ModelView { workers, block_size, known, base_model }
    }

    /// What tokenizing for `model` needs; `None` when no healthy worker serves it (the pick
    /// then falls back without tokenizing).
    pub fn tokenize_target(&self, model: &str) -> Option<TokenizeTarget> {
        let workers: Vec<_> = self.registry.read().for_model(model).into_iter().filter(|w| w.load.lock().healthy).collect();
        let first = workers.first()?;
        Some(TokenizeTarget { base_model: first.config.model.clone(), block_size: first.block_size, workers })
    }

    /// Leading keys each worker of `view` holds by the KV index (any of its engines) or by
    /// speculative credit, in `view` order.
    pub fn exact_matches(&self, workers: &[WorkerView], keys: &[BlockKey], now: Instant) -> Vec<u32> {
        let by_engine: HashMap<_, _> = self.index.match_prefix(keys).into_iter().map(|m| (m.engine, m.matched_blocks)).collect();
        let speculative = self.speculative.lock().matches(keys, now);
        workers
            .iter()
            .map(|w| {
                let indexed = w.entry.slots().filter_map(|s| by_engine.get(&s).copied()).max().unwrap_or(0);
                let credited = speculative.iter().find(|(id, _)| id == &w.entry.id).map_or(0, |(_, n)| *n);
                indexed.max(credited)
            })
            .collect()
    }

    /// Leading keys each worker of `view` was routed by learned text-chunk (or approximate)
    /// routing, in `view` order.
    pub fn learned_matches(&self, workers: &[WorkerView], keys: &[BlockKey]) -> Vec<u32> {
        let learned = self.approx.lock().matches(keys);
        workers.iter().map(|w| learned.get(&w.entry.id).copied().unwrap_or(0)).collect()
    }

    /// Remembers that `keys` were routed to `worker` (approximate routing learns from its
    /// own decisions; nothing replicates it).
    pub fn learn(&self, keys: &[BlockKey], worker: &WorkerId) {
        self.approx.lock().learn(keys, worker);
    }
}
