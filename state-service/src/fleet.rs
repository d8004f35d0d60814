//! The fleet model: which workers serve which models, how loaded they are, how fast they
//! prefill (calibration), what we assigned them and have not heard the end of, and the
//! short-lived credit a pick gives its worker.
//!
//! What other replicas must agree on changes through a few typed operations ([`Fleet::assign`],
//! [`Fleet::first_token`], [`Fleet::finish`], [`Fleet::suspect`], [`Fleet::drain`]), each of
//! which hands what it changed to the [`Replication`] sink; another replica's change arrives
//! as a [`FleetEvent`] and goes through the same code ([`Fleet::apply_replicated`]) without
//! being shared again: the calibration branch, the assignment bookkeeping and worker
//! registration each exist once. Reads are snapshots
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
pub mod replication;

pub use event::{Assigned, Change, End, FirstToken, FleetEvent, Usage};
pub use replication::Replication;
pub use feed::{FeedSnapshot, FeedStats};
pub use registry::{Engine, Registry, RegistryError, WorkerEntry};

use crate::assign::{Assignment, AssignmentId, Assignments, Insert, ReportOutcome, Speculative};
use crate::config::{Config, ConfigError, WorkerConfig};
use crate::tenancy::Ending;
use kvroute_kv::index::KvIndex;
use crate::load::LoadState;
use kvroute_score::prefix_sets::{Evict, PrefixSets, SetMatch};
use kvroute_score::{peers, ApproxMap, Calibration, Policy};
use kvroute_kv::types::{BlockKey, WorkerId};
use parking_lot::{Mutex, MutexGuard, RwLock};
use crate::metrics::{self, ExpiryKind, ExpiryLabels};
use kvroute_core::wire::UpstreamFailure;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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
#[derive(Clone)]
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
    /// Where this replica's own changes go (other replicas; nowhere with the memory store).
    replication: Arc<dyn Replication>,
    metrics: FleetMetrics,
}

/// The fleet's own metric families.
struct FleetMetrics {
    /// `kvroute_assignments_in_flight`, kept equal to the table's size.
    in_flight: Gauge,
    /// Assignments freed by a TTL because nobody reported them.
    expired: Family<ExpiryLabels, Counter>,
}

impl FleetMetrics {
    fn register(registry: &mut metrics::Registry) -> FleetMetrics {
        let m = FleetMetrics { in_flight: Gauge::default(), expired: Family::default() };
        registry.register("assignments_in_flight", "Assignments not yet completed, cancelled or expired", m.in_flight.clone());
        registry.register("assignments_expired", "Assignments freed by a TTL, by which TTL", m.expired.clone());
        m
    }

    fn count_expired(&self, ttl: ExpiryKind, n: u64) {
        if n > 0 {
            self.expired.get_or_create(&ExpiryLabels { ttl }).inc_by(n);
        }
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl Fleet {
    /// An empty fleet whose changes go to `replication`; registers its metrics (and its
    /// scrape-time collector) in `registry`.
    pub fn new(config: Arc<Config>, index: Arc<dyn KvIndex>, replication: Arc<dyn Replication>, registry: &mut metrics::Registry) -> Arc<Fleet> {
        let t = &config.timeouts;
        let fleet = Arc::new(Fleet {
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
            replication,
            metrics: FleetMetrics::register(registry),
            config,
        });
        registry.register_collector(Box::new(collector::FleetCollector(fleet.clone())));
        fleet
    }

    /// Records a pick's assignment and credits its worker with `credit` until the worker's
    /// own events arrive; shared with the other replicas when recorded.
    pub fn assign(&self, assignment: &Assignment, credit: &Arc<[BlockKey]>, now: Instant) -> Assigned {
        let assigned = self.insert(assignment, credit, now);
        if assigned == Assigned::Recorded {
            self.replication.publish(Change::Assigned { assignment, credit });
        }
        assigned
    }

    /// The first token of assignment `id` arrived `elapsed_ms` after it was forwarded: the
    /// one calibration branch (a usable elapsed time refits the worker's cost model from the
    /// features its pick predicted with). Shared when it marked a live assignment.
    pub fn first_token(&self, id: AssignmentId, elapsed_ms: f64, now: Instant) -> FirstToken {
        let first = self.mark_first_token(id, elapsed_ms, now);
        if let FirstToken::Marked { assignment, calibration } = &first {
            self.replication.publish(Change::FirstToken { assignment, elapsed_ms, calibration: calibration.as_ref() });
        }
        first
    }

    /// Frees assignment `id` (completed or cancelled); shared when it was live. A cancel may
    /// overtake its pick (the proxy gave up on a slow answer): it is remembered, so the pick
    /// is discarded when it is recorded. The end of an id not held here is shared too: the
    /// replica that recorded it may be the only one that still holds it.
    pub fn finish(&self, id: AssignmentId, end: End, ending: Ending, now: Instant) -> Option<Assignment> {
        let freed = self.free(id, end, now);
        match (&freed, end) {
            (Some(_), _) => self.replication.publish(Change::Freed { id }),
            // Not recorded here: perhaps by a replica that answered the pick after the proxy
            // gave up on it (it was slow, or frozen). Every replica hears of the cancel, so
            // whichever holds the pick, now or later, lets it go and settles it by `ending`.
            (None, End::Cancelled) => self.replication.publish(Change::CancelledUnknown { id, ending }),
            (None, End::Completed) => self.replication.publish(Change::CompletedUnknown { id, ending }),
        }
        freed
    }

    /// The proxy saw `worker` fail: no picks until a check of it succeeds. The entry when it
    /// was not suspect before (then shared).
    pub fn suspect(&self, worker: &WorkerId, reason: UpstreamFailure, now: Instant) -> Option<Arc<WorkerEntry>> {
        let marked = self.mark(worker, |l| l.suspect(reason, now));
        if marked.is_some() {
            self.replication.publish(Change::Suspected { worker, reason });
        }
        marked
    }

    /// No new picks to `worker`. The entry when it was not draining before (then shared).
    pub fn drain(&self, worker: &WorkerId) -> Option<Arc<WorkerEntry>> {
        let marked = self.mark(worker, |l| !std::mem::replace(&mut l.draining, true));
        if marked.is_some() {
            self.replication.publish(Change::Draining { worker });
        }
        marked
    }

    /// Applies a change another replica made (or a warm start found); nothing is shared
    /// again. Workers come and go through [`Fleet::register`] / [`Fleet::unregister`], which
    /// start and stop their feeds too: the caller routes those two.
    ///
    /// Returns the assignment an end freed here when the end came with how the request ended:
    /// the replica that heard the report did not hold the pick, so nothing has settled its
    /// budget reservation yet (the caller does, by that ending).
    pub fn apply_replicated(&self, event: &FleetEvent, now: Instant) -> Option<(Assignment, Ending)> {
        match event {
            FleetEvent::Assigned { assignment, credit } => {
                self.insert(assignment, credit, now);
            }
            FleetEvent::FirstToken { id, elapsed_ms } => {
                self.mark_first_token(*id, *elapsed_ms, now);
            }
            FleetEvent::Completed { id, ending } => return self.free(*id, End::Completed, now).zip(*ending),
            FleetEvent::Cancelled { id, ending } => return self.free(*id, End::Cancelled, now).zip(*ending),
            FleetEvent::CalibrationRestored { worker, calibration } => {
                if let Some(w) = self.worker(worker.as_str()) {
                    *w.calibration.lock() = *calibration;
                }
            }
            FleetEvent::Suspected { worker, reason } => {
                self.mark(worker, |l| l.suspect(*reason, now));
            }
            FleetEvent::Draining(worker) => {
                self.mark(worker, |l| !std::mem::replace(&mut l.draining, true));
            }
            FleetEvent::WorkerAdded(_) | FleetEvent::WorkerRemoved(_) => {
                tracing::warn!("a worker change reached the fleet without its feeds: ignored");
            }
        }
        None
    }

    /// Marks a worker's health cell; `mark` says whether it changed anything.
    fn mark(&self, worker: &WorkerId, mark: impl FnOnce(&mut LoadState) -> bool) -> Option<Arc<WorkerEntry>> {
        let entry = self.worker(worker.as_str())?;
        let changed = mark(&mut entry.load.lock());
        changed.then_some(entry)
    }

    /// Runs `f` on the assignment table and keeps `kvroute_assignments_in_flight` equal to its
    /// size, under the same lock.
    fn table<R>(&self, f: impl FnOnce(&mut Assignments) -> R) -> R {
        let mut table = self.assignments.lock();
        let r = f(&mut table);
        self.metrics.in_flight.set(table.len() as i64);
        r
    }

    fn insert(&self, assignment: &Assignment, credit: &[BlockKey], now: Instant) -> Assigned {
        match self.table(|table| table.insert(assignment.clone())) {
            Insert::Known => return Assigned::Taken,
            Insert::Cancelled => return Assigned::Abandoned,
            Insert::Inserted => {}
        }
        if !credit.is_empty() {
            self.speculative.lock().credit(credit, &assignment.worker, now);
        }
        Assigned::Recorded
    }

    fn mark_first_token(&self, id: AssignmentId, elapsed_ms: f64, now: Instant) -> FirstToken {
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
                FirstToken::Marked { assignment: a, calibration }
            }
            ReportOutcome::Duplicate => FirstToken::Duplicate,
            ReportOutcome::Freed(_) | ReportOutcome::Unknown => FirstToken::Unknown,
        }
    }

    fn free(&self, id: AssignmentId, end: End, now: Instant) -> Option<Assignment> {
        match self.table(|t| t.finish(id)) {
            ReportOutcome::Freed(a) => Some(a),
            _ => {
                if end == End::Cancelled {
                    self.assignments.lock().remember_cancel(id, now);
                }
                None
            }
        }
    }

    /// Whether `worker` may join this fleet (the config's rules, checked again at runtime).
    pub fn validate_worker(&self, worker: &WorkerConfig) -> Result<(), ConfigError> {
        self.config.validate_worker(worker)
    }

    /// Validates and registers a worker (its feeds are the caller's to start).
    pub fn register(&self, worker: &WorkerConfig) -> Result<Arc<WorkerEntry>, AddWorkerError> {
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
    pub fn unregister(&self, id: &WorkerId) -> Option<Arc<WorkerEntry>> {
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

    /// Frees expired assignments and speculative credit, and counts the expiries. Run
    /// periodically and before any answer that reports assignments, so paused-time tests see
    /// expiry without a timer.
    pub fn sweep(&self, now: Instant) {
        let expired = self.table(|t| t.expire(now));
        self.speculative.lock().purge(now);
        self.metrics.count_expired(ExpiryKind::FirstToken, expired.first_token);
        self.metrics.count_expired(ExpiryKind::Complete, expired.complete);
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

    /// Where this replica's changes go: whether shared state is reachable, the id salt.
    pub fn replication(&self) -> &dyn Replication {
        self.replication.as_ref()
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

    /// The one base model every registered worker serves, if there is exactly one.
    pub fn only_model(&self) -> Option<String> {
        let registry = self.registry.read();
        let mut models = registry.all().into_iter().map(|w| w.config.model.clone());
        let first = models.next()?;
        models.all(|m| m == first).then_some(first)
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

    /// The most leading keys of `keys` any engine holds, by the KV index or speculative credit.
    pub fn longest_match(&self, keys: &[BlockKey], now: Instant) -> u32 {
        let indexed = self.index.match_prefix(keys).iter().map(|m| m.matched_blocks).max().unwrap_or(0);
        let credited = self.speculative.lock().matches(keys, now).into_iter().map(|(_, n)| n).max().unwrap_or(0);
        indexed.max(credited)
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
