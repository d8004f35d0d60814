//! The fleet model: which workers serve which models, how loaded they are, how fast they
//! prefill (calibration), what we assigned them and have not heard the end of, and the
//! short-lived credit a pick gives its worker.
//!
//! What other replicas must agree on changes only through one typed [`FleetEvent`] and
//! [`Fleet::apply`], whether the event comes from this replica (a pick, a report, the admin
//! API) or from another replica through the shared store: the calibration branch, the
//! assignment bookkeeping and worker registration each exist once. Reads are snapshots
//! ([`Fleet::model_view`]) that the pick computes on without holding any fleet lock. Outside
//! the events stay what is this replica's own and never replicated: scraped load (the scraper
//! writes a worker's [`LoadState`] cell), learned text-chunk routes ([`Fleet::learn`]), expiry
//! ([`Fleet::sweep`]) and the benchmark [`Fleet::reset`]; speculative credit also expires as it
//! is read.
//!
//! Locks are parking_lot mutexes held for microseconds and never across an `.await`. Order,
//! where more than one is taken: registry, then assignments, then a worker's own locks (load,
//! calibration); speculative and approx are only ever taken alone.

pub mod collector;
pub mod event;
pub mod feed;
pub mod registry;

pub use event::{Applied, FleetEvent, Usage};
pub use feed::{FeedSnapshot, FeedStats};
pub use registry::{Engine, Registry, RegistryError, WorkerEntry};

use crate::assign::{Assignment, Assignments, Insert, ReportOutcome, Speculative};
use crate::config::{Config, ConfigError, WorkerConfig};
use crate::index::KvIndex;
use crate::load::LoadState;
use crate::score::prefix_sets::{Evict, PrefixSets, SetMatch};
use crate::score::{peers, ApproxMap, Calibration, Policy};
use crate::types::{BlockKey, WorkerId};
use parking_lot::{Mutex, MutexGuard, RwLock};
use prometheus_client::metrics::gauge::Gauge;
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

/// A pick's one snapshot of its model: the workers serving `model` (a base model or a LoRA
/// adapter) that take picks (healthy, not suspect, not draining), their block size, and
/// whether any is registered at all.
pub struct ModelView {
    pub workers: Vec<WorkerView>,
    pub block_size: u32,
    /// Some worker serves the model, healthy or not.
    pub known: bool,
}

/// What tokenizing a prompt for `model` needs: the base model (its tokenizer and chat
/// template), the block size to cut keys with, and healthy workers to ask for `/tokenize`.
pub struct TokenizeTarget {
    pub base_model: String,
    pub block_size: u32,
    pub workers: Vec<Arc<WorkerEntry>>,
}

/// The approximate peers' per-worker prefix memories, bounded as they bound them.
struct PeerSets {
    sglang: PrefixSets,
    llmd: PrefixSets,
}

impl Default for PeerSets {
    fn default() -> Self {
        PeerSets {
            sglang: PrefixSets::new(peers::sglang::MAX_TREE_CHUNKS, Evict::TailFirst),
            llmd: PrefixSets::new(peers::llmd::LRU_CAPACITY_PER_SERVER, Evict::InOrder),
        }
    }
}

impl PeerSets {
    fn of(&self, policy: Policy) -> Option<&PrefixSets> {
        match policy {
            Policy::SglangCacheAware => Some(&self.sglang),
            Policy::LlmdDefault => Some(&self.llmd),
            _ => None,
        }
    }

    fn of_mut(&mut self, policy: Policy) -> Option<&mut PrefixSets> {
        match policy {
            Policy::SglangCacheAware => Some(&mut self.sglang),
            Policy::LlmdDefault => Some(&mut self.llmd),
            _ => None,
        }
    }

    fn forget_worker(&mut self, worker: &WorkerId) {
        self.sglang.forget_worker(worker);
        self.llmd.forget_worker(worker);
    }
}

pub struct Fleet {
    config: Arc<Config>,
    registry: RwLock<Registry>,
    assignments: Mutex<Assignments>,
    speculative: Mutex<Speculative>,
    approx: Mutex<ApproxMap>,
    /// What the approximate peer policies remember (SGLang's trees, llm-d's per-pod LRUs).
    peer_sets: Mutex<PeerSets>,
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
            assignments: Mutex::new(Assignments::with_capacity(
                ms(t.assignment_ttl_ms),
                ms(t.first_token_ttl_ms),
                config.resilience.max_assignments,
            )),
            speculative: Mutex::new(Speculative::new(ms(t.speculative_ttl_ms))),
            approx: Mutex::new(ApproxMap::new(config.approx_capacity)),
            peer_sets: Mutex::new(PeerSets::default()),
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
            FleetEvent::Completed { id, .. } => match self.table(|t| t.finish(*id)) {
                ReportOutcome::Freed(a) => Applied::Freed(a),
                _ => Applied::Unknown,
            },
            // A cancel may overtake its pick (the proxy gave up on a slow answer): remembered,
            // so the pick is discarded when it is recorded.
            FleetEvent::Cancelled { id } => match self.table(|t| t.finish(*id)) {
                ReportOutcome::Freed(a) => Applied::Freed(a),
                _ => {
                    self.assignments.lock().remember_cancel(*id, now);
                    Applied::Unknown
                }
            },
            FleetEvent::WorkerAdded(config) => match self.add_worker(config) {
                Ok(entry) => Applied::WorkerAdded(entry),
                Err(e) => Applied::Rejected(e),
            },
            FleetEvent::WorkerRemoved(id) => self.remove_worker(id).map_or(Applied::Unknown, Applied::WorkerRemoved),
            FleetEvent::CalibrationRestored { worker, calibration } => match self.worker(worker.as_str()) {
                Some(w) => {
                    *w.calibration.lock() = *calibration;
                    Applied::Calibrated
                }
                None => Applied::Unknown,
            },
            FleetEvent::Suspected { worker, reason } => self.mark(worker, |l| l.suspect(*reason, now)),
            FleetEvent::Draining(worker) => self.mark(worker, |l| !std::mem::replace(&mut l.draining, true)),
        };
        applied
    }

    /// Marks a worker's health cell; `mark` says whether it changed anything.
    fn mark(&self, worker: &WorkerId, mark: impl FnOnce(&mut LoadState) -> bool) -> Applied {
        let Some(entry) = self.worker(worker.as_str()) else { return Applied::Unknown };
        let changed = mark(&mut entry.load.lock());
        if changed {
            Applied::Marked(entry)
        } else {
            Applied::Duplicate
        }
    }

    /// Runs `f` on the assignment table and keeps `kvroute_assignments_in_flight` equal to its
    /// size, under the same lock.
    fn table<R>(&self, f: impl FnOnce(&mut Assignments) -> R) -> R {
        let mut table = self.assignments.lock();
        let r = f(&mut table);
        self.in_flight.set(table.len() as i64);
        r
    }

    fn assign(&self, assignment: &Assignment, credit: &[BlockKey], now: Instant) -> Applied {
        match self.table(|table| table.insert(assignment.clone())) {
            Insert::Known => return Applied::Duplicate,
            Insert::Cancelled => return Applied::Abandoned,
            Insert::Inserted => {}
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

    /// Unregisters a worker and forgets what picks learned about it. Its feeds are the
    /// caller's to stop (they may join threads: not under a fleet lock), and only then its
    /// engines' index entries to clear ([`Fleet::clear_engines`]): a batch ingested between a
    /// clear and the stop would otherwise stay in the index for good.
    fn remove_worker(&self, id: &WorkerId) -> Option<Arc<WorkerEntry>> {
        let entry = self.registry.write().remove(id.as_str())?;
        self.table(|t| t.forget_worker(&entry.id));
        self.speculative.lock().forget_worker(&entry.id);
        self.approx.lock().forget_worker(&entry.id);
        self.peer_sets.lock().forget_worker(&entry.id);
        tracing::info!(worker = %entry.id, "worker removed");
        Some(entry)
    }

    /// Drops a removed worker's engines from the index, once its feeds are stopped.
    pub fn clear_engines(&self, entry: &WorkerEntry) {
        for slot in entry.slots() {
            self.index.clear_engine(slot);
        }
    }

    /// Frees expired assignments and speculative credit; returns (first-token, complete)
    /// expiries for the metrics.
    pub fn sweep(&self, now: Instant) -> (u64, u64) {
        let expired = self.table(|t| t.expire(now));
        self.speculative.lock().purge(now);
        (expired.first_token, expired.complete)
    }

    /// Forgets learned approximate keys, speculative credit, assignments and calibration
    /// (between benchmark passes: each starts from the same priors, so one policy's overload
    /// does not shape the next one's costs). Index and load are facts about the workers and stay.
    pub fn reset(&self) {
        for worker in self.registry.read().all() {
            worker.calibration.lock().reset();
        }
        self.table(|t| t.clear());
        self.speculative.lock().clear();
        self.approx.lock().clear();
        *self.peer_sets.lock() = PeerSets::default();
    }

    pub fn worker(&self, id: &str) -> Option<Arc<WorkerEntry>> {
        self.registry.read().get(id)
    }

    pub fn workers(&self) -> Vec<Arc<WorkerEntry>> {
        self.registry.read().all()
    }

    /// Requests assigned to `worker` and not yet reported complete, cancelled or expired.
    pub fn in_flight(&self, worker: &WorkerId) -> u32 {
        self.assignments.lock().pending(worker).in_flight
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
        self.view(model, None)
    }

    /// [`Fleet::model_view`] of `worker` alone, whether or not it takes picks (suspect,
    /// draining): a request only it can serve (a stored Responses API conversation) goes to it
    /// while it is registered.
    pub fn pinned_view(&self, model: &str, worker: &WorkerId) -> ModelView {
        self.view(model, Some(worker))
    }

    fn view(&self, model: &str, pinned: Option<&WorkerId>) -> ModelView {
        let registry = self.registry.read();
        let (mut known, mut block_size) = (false, 0);
        let table = self.assignments.lock();
        let workers = registry
            .serving(model)
            .filter_map(|entry| {
                known = true;
                block_size = entry.block_size;
                if pinned.is_some_and(|p| *p != entry.id) {
                    return None;
                }
                let load = {
                    let l: parking_lot::MutexGuard<'_, LoadState> = entry.load.lock();
                    if pinned.is_none() && !l.takes_picks() {
                        return None;
                    }
                    l.load.clone()
                };
                let (per_token_ms, overhead_ms) = {
                    let c = entry.calibration.lock();
                    (c.per_token_ms(), c.overhead_ms())
                };
                Some(WorkerView { pending: table.pending(&entry.id), load, per_token_ms, overhead_ms, entry: entry.clone() })
            })
            .collect();
        ModelView { workers, block_size, known }
    }

    /// What tokenizing for `model` needs; `None` when no healthy worker serves it (the pick
    /// then falls back without tokenizing).
    pub fn tokenize_target(&self, model: &str) -> Option<TokenizeTarget> {
        let workers: Vec<_> = self.registry.read().for_model(model).into_iter().filter(|w| w.load.lock().takes_picks()).collect();
        let first = workers.first()?;
        Some(TokenizeTarget { base_model: first.config.model.clone(), block_size: first.block_size, workers })
    }

    /// Leading keys each worker of `view` holds by the KV index (its best engine, any tier)
    /// or by speculative credit (counted as GPU: the worker is prefilling them), and how
    /// many of those are on the GPU, in `view` order.
    pub fn exact_matches(&self, workers: &[WorkerView], keys: &[BlockKey], now: Instant) -> Vec<(u32, u32)> {
        // Engines holding any of the prompt: a short list, scanned rather than hashed.
        let held = self.index.match_prefix(keys);
        let speculative = self.speculative.lock().matches(keys, now);
        workers
            .iter()
            .map(|w| {
                let indexed = held
                    .iter()
                    .filter(|m| w.entry.slots().any(|s| s == m.engine))
                    .map(|m| (m.matched_blocks, m.gpu_blocks))
                    .max()
                    .unwrap_or((0, 0));
                let credited = speculative.iter().find(|(id, _)| id == &w.entry.id).map_or(0, |(_, n)| *n);
                if credited >= indexed.0 {
                    (credited, credited)
                } else {
                    (indexed.0, indexed.1.max(credited))
                }
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

    /// What `policy`'s per-worker prefix memory says of `keys` (SGLang, llm-d; `None` for
    /// the others).
    pub fn peer_matches(&self, policy: Policy, workers: &[WorkerView], keys: &[BlockKey]) -> Option<Vec<SetMatch>> {
        if !matches!(policy, Policy::SglangCacheAware | Policy::LlmdDefault) {
            return None;
        }
        let ids: Vec<&WorkerId> = workers.iter().map(|w| &w.entry.id).collect();
        let sets = self.peer_sets.lock();
        sets.of(policy).map(|s| s.matches(&ids, keys))
    }

    /// `policy` routed `keys` to `worker`: its prefix memory learns them.
    pub fn peer_learn(&self, policy: Policy, keys: &[BlockKey], worker: &WorkerId) {
        if let Some(s) = self.peer_sets.lock().of_mut(policy) {
            s.learn(keys, worker);
        }
    }
}
