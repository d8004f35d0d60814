//! The service's composition root: one [`AppState`] handed to every handler and task.
//!
//! It owns the components and wires them one way: a change is a [`FleetEvent`] applied to
//! the [`Fleet`] and then offered to the [`SharedStore`]; the store's inbound events (other
//! replicas, a warm start) come back through a channel and are applied the same way. No
//! component holds the `AppState` itself.

use crate::config::{Config, WorkerConfig};
use crate::feeds::Feeds;
use crate::fleet::{AddWorkerError, Applied, Fleet, FleetEvent, WorkerEntry};
use crate::index::KvIndex;
use crate::load::Scraper;
use crate::metrics::{ExpiryKind, Metrics};
use crate::score::{Policy, Selector};
use crate::store::{memory::MemoryStore, SharedStore};
use crate::tokenize::{collector::TokenizerCollector, Tokenization};
use crate::types::WorkerId;
use parking_lot::{Mutex, RwLock};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

pub struct Shared {
    pub config: Arc<Config>,
    pub fleet: Arc<Fleet>,
    pub metrics: Metrics,
    /// Where shared state goes (memory: nowhere; redis: other replicas).
    pub store: Arc<dyn SharedStore>,
    /// Text/chat prompts -> token ids (local tokenizers, worker `/tokenize`).
    pub tokenization: Tokenization,
    pub(crate) selector: Selector,
    policy: RwLock<Policy>,
    scraper: Scraper,
    /// Slots for picks being decided (`resilience.max_concurrent_picks`).
    pub pick_slots: tokio::sync::Semaphore,
    /// Tenants' budgets: admission at the pick, settlement from the reports.
    pub tenants: crate::tenancy::Tenants,
    /// Which worker stores each Responses API response.
    pub owners: crate::responses::Owners,
    /// Set once [`AppState::start_feeds`] ran: workers registered later start theirs at once.
    /// Held while starting, so a worker registered concurrently is started exactly once.
    feeds: Mutex<Option<Feeds>>,
}

#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// Builds the state and registers the configured workers (their feeds start later, with
    /// [`AppState::start_feeds`]).
    pub fn new(config: Config, index: Arc<dyn KvIndex>) -> Result<AppState, AddWorkerError> {
        AppState::with_store(config, index, Arc::new(MemoryStore))
    }

    /// [`AppState::new`] with a shared store, attached once built: what it already knows (a
    /// warm start) is applied before this returns; later inbound events by a task.
    pub fn with_store(config: Config, index: Arc<dyn KvIndex>, store: Arc<dyn SharedStore>) -> Result<AppState, AddWorkerError> {
        let config = Arc::new(config);
        let mut metrics = Metrics::new();
        let fleet = Arc::new(Fleet::new(config.clone(), index, metrics.assignments_in_flight.clone()));
        metrics.register_collector(Box::new(crate::fleet::collector::FleetCollector(fleet.clone())));
        if let Some(collector) = store.collector() {
            metrics.register_collector(collector);
        }
        let tokenization = Tokenization::new(&config);
        metrics.register_collector(Box::new(TokenizerCollector { local: tokenization.local.clone() }));
        let t = &config.timeouts;
        let scraper = Scraper {
            client: reqwest::Client::new(),
            interval: Duration::from_millis(t.scrape_interval_ms),
            timeout: Duration::from_millis(t.scrape_timeout_ms),
            unhealthy_after: config.unhealthy_after,
        };
        let state = AppState(Arc::new(Shared {
            selector: Selector::new(config.seed),
            policy: RwLock::new(config.policy),
            fleet,
            metrics,
            store: store.clone(),
            tokenization,
            scraper,
            feeds: Mutex::new(None),
            pick_slots: tokio::sync::Semaphore::new(config.resilience.max_concurrent_picks),
            tenants: crate::tenancy::Tenants::new(config.tenancy.clone(), store.ledger(), t.assignment_ttl_ms),
            owners: crate::responses::Owners::new(config.responses.clone()),
            config: config.clone(),
        }));
        for worker in config.workers.iter().cloned() {
            state.add_worker(worker)?;
        }
        state.attach_store();
        Ok(state)
    }

    fn attach_store(&self) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.store.attach(tx);
        while let Ok(event) = rx.try_recv() {
            self.apply_remote(event);
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            let state = self.clone();
            tokio::spawn(async move {
                while let Some(event) = rx.recv().await {
                    state.apply_remote(event);
                }
            });
        }
    }

    pub fn policy(&self) -> Policy {
        *self.policy.read()
    }

    /// Switches the policy; returns the previous one.
    pub fn set_policy(&self, policy: Policy) -> Policy {
        std::mem::replace(&mut *self.policy.write(), policy)
    }

    /// How load is scraped (tests scrape by hand).
    pub fn scraper(&self) -> &Scraper {
        &self.scraper
    }

    /// Applies a change made on this replica and offers it to the store.
    pub fn apply(&self, event: FleetEvent) -> Applied {
        self.apply_at(event, Instant::now())
    }

    /// [`AppState::apply`] at `now` (a pick already read the clock).
    pub fn apply_at(&self, event: FleetEvent, now: Instant) -> Applied {
        let applied = self.fleet.apply(&event, now);
        self.store.publish(&event, &applied);
        applied
    }

    /// Applies a change another replica made (or a warm start found). Workers it adds get
    /// their feeds; a worker this replica refuses is handed back to the store.
    fn apply_remote(&self, event: FleetEvent) {
        match event {
            FleetEvent::WorkerAdded(config) => {
                let id = config.id.clone();
                match self.add_worker(*config) {
                    Ok(_) => tracing::info!(worker = %id, "worker registered by another replica"),
                    // Registered meanwhile (by this replica's admin API): it stays shared.
                    Err(AddWorkerError::Registry(crate::fleet::RegistryError::Duplicate(_))) => {}
                    Err(e) => {
                        self.store.worker_rejected(&id);
                        tracing::warn!(worker = %id, error = %e, "shared worker rejected here");
                    }
                }
            }
            FleetEvent::WorkerRemoved(id) => {
                if self.remove_worker(id.as_str()) {
                    tracing::info!(worker = %id, "worker removed by another replica");
                }
            }
            other => {
                self.fleet.apply(&other, Instant::now());
            }
        }
    }

    /// Starts the feeds (metrics scraper, KV-event ingestion) of every worker registered so
    /// far, and of every worker registered from now on.
    pub fn start_feeds(&self) {
        let mut slot = self.feeds.lock();
        let feeds = Feeds { scraper: self.scraper.clone(), index: self.fleet.index().clone(), store: self.store.clone() };
        for worker in self.fleet.workers() {
            feeds.start(&worker);
        }
        *slot = Some(feeds);
        if self.tenants.is_shared() {
            let state = self.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(crate::tenancy::OVERRIDES_REFRESH);
                loop {
                    tick.tick().await;
                    if let Err(e) = state.tenants.refresh().await {
                        tracing::debug!(error = %e, "budget overrides not refreshed");
                    }
                }
            });
        }
    }

    /// Validates and registers a worker, and starts its feeds once feeds run.
    pub fn add_worker(&self, worker: WorkerConfig) -> Result<Arc<WorkerEntry>, AddWorkerError> {
        let feeds = self.feeds.lock();
        match self.fleet.apply(&FleetEvent::WorkerAdded(Box::new(worker)), Instant::now()) {
            Applied::WorkerAdded(entry) => {
                if let Some(feeds) = feeds.as_ref() {
                    feeds.start(&entry);
                }
                Ok(entry)
            }
            Applied::Rejected(e) => Err(e),
            other => Err(AddWorkerError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Unregisters a worker, stops its feeds and forgets everything learned about it.
    pub fn remove_worker(&self, id: &str) -> bool {
        // The feed slot first, as in `add_worker`: a worker being registered has its feeds
        // started before it can be removed (and stopped here).
        let feeds = self.feeds.lock();
        let applied = self.fleet.apply(&FleetEvent::WorkerRemoved(WorkerId::new(id)), Instant::now());
        drop(feeds);
        match applied {
            Applied::WorkerRemoved(entry) => {
                entry.stop_tasks();
                self.fleet.clear_engines(&entry);
                true
            }
            _ => false,
        }
    }

    /// Stops new picks to worker `id` on every replica, then removes it once its in-flight
    /// requests have ended (or `resilience.drain_timeout_ms` passed). Returns how many were
    /// in flight, `None` for an unknown worker. Draining twice is one drain.
    pub fn drain(&self, id: &str) -> Option<u32> {
        let entry = self.fleet.worker(id)?;
        let first = matches!(self.apply(FleetEvent::Draining(entry.id.clone())), Applied::Marked(_));
        let in_flight = self.fleet.in_flight(&entry.id);
        if first {
            tracing::info!(worker = %entry.id, in_flight, "draining worker");
            let state = self.clone();
            let deadline = Instant::now() + Duration::from_millis(self.config.resilience.drain_timeout_ms);
            tokio::spawn(async move {
                while state.fleet.in_flight(&entry.id) > 0 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let left = state.fleet.in_flight(&entry.id);
                if let Err(e) = state.retire(entry.id.as_str()).await {
                    tracing::warn!(worker = %entry.id, error = %e, "drained worker could not be unshared; it stays, draining");
                    return;
                }
                tracing::info!(worker = %entry.id, abandoned = left, "drained worker removed");
            });
        }
        Some(in_flight)
    }

    /// Removes worker `id` now: from every replica when it is shared, else from this one.
    pub async fn retire(&self, id: &str) -> Result<(), crate::store::ShareError> {
        if self.store.is_shared(id) {
            self.store.unshare_worker(id).await?;
        }
        self.remove_worker(id);
        Ok(())
    }

    /// Frees expired assignments and speculative credit. Run periodically and before any
    /// answer that reports assignments, so paused-time tests see expiry without a timer.
    pub fn sweep(&self) {
        let (first_token, complete) = self.fleet.sweep(Instant::now());
        self.metrics.count_expired(ExpiryKind::FirstToken, first_token);
        self.metrics.count_expired(ExpiryKind::Complete, complete);
    }

    /// Forgets what was learned from traffic (see [`Fleet::reset`]) and restarts round robin.
    pub fn reset(&self) {
        self.fleet.reset();
        self.selector.reset();
    }

    /// Ready: at least one worker registered and healthy.
    pub fn ready(&self) -> bool {
        self.fleet.ready()
    }
}
