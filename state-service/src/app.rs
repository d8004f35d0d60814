//! The composition root: builds every component from a validated config and a store, wires
//! them one way, and starts what runs in the background (every worker's feeds, the sweep of
//! expired assignments, the replicated-changes loop, the budget overrides' refresh).
//!
//! Each component owns what it uses and registers its own metrics here, once: the [`Picker`]
//! (the pick path), the [`Reporter`] (the proxy's reports), [`Membership`] (workers and their
//! feeds), [`Discovery`] (workers found by DNS or in files), the [`Tenants`] (budgets), [`Tokenization`] and the [`Fleet`] they share. `main`
//! calls [`App::start`] and serves [`App::router`]; tests build an [`App`] without
//! background tasks ([`App::build`]) and drive its components directly.

use crate::config::Config;
use crate::discovery::Discovery;
use crate::feeds::Feeds;
use crate::fleet::{AddWorkerError, Fleet};
use crate::load::Scraper;
use crate::membership::Membership;
use crate::metrics::Registry;
use crate::pick::{Picker, PickerParts};
use crate::reporter::Reporter;
use crate::store::memory::MemoryStore;
use crate::store::Store;
use crate::stored::Owners;
use crate::tenancy::{settled_tokens, Tenants, OVERRIDES_REFRESH};
use crate::tokenization::Tokenization;
use kvroute_kv::index::KvIndex;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How often expired assignments and speculative credit are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The service's components, built once; cheap to clone (the API's state).
#[derive(Clone)]
pub struct App {
    pub config: Arc<Config>,
    pub fleet: Arc<Fleet>,
    pub picker: Arc<Picker>,
    pub reporter: Arc<Reporter>,
    pub membership: Arc<Membership>,
    /// Workers found by DNS or in files (`[[worker_groups]]`).
    pub discovery: Arc<Discovery>,
    pub tenants: Arc<Tenants>,
    pub tokenization: Arc<Tokenization>,
    /// Every metric family, for `/metrics` (filled while building; read-only after).
    pub metrics: Arc<Registry>,
    /// The API's own metric handles (registered with the rest).
    pub api_metrics: Arc<crate::api::ApiMetrics>,
}

impl App {
    /// The service on the memory store over `index`, with the configured workers registered
    /// (their feeds start with [`App::start`]).
    pub fn new(config: Config, index: Arc<dyn KvIndex>) -> Result<App, AddWorkerError> {
        App::build(config, MemoryStore::store(index))
    }

    /// [`App::new`] on `store`. What the store knows already (a warm start) is applied before
    /// this returns; other replicas' later changes by a task when a runtime runs.
    pub fn build(config: Config, store: Store) -> Result<App, AddWorkerError> {
        let Store { index, replication, warm_start, workers, responses, ledger, collector } = store;
        let config = Arc::new(config);
        let mut registry = Registry::default();
        if let Some(collector) = collector {
            registry.register_collector(collector);
        }
        let fleet = Fleet::new(config.clone(), index.clone(), replication.clone(), &mut registry);
        let tokenization = Arc::new(Tokenization::new(&config, &mut registry));
        let tenants = Arc::new(Tenants::new(config.tenancy.clone(), ledger, config.timeouts.assignment_ttl_ms, &mut registry));
        let owners = Arc::new(Owners::new(config.responses.clone()));
        let parts = PickerParts {
            fleet: fleet.clone(),
            tokenization: tokenization.clone(),
            tenants: tenants.clone(),
            owners: owners.clone(),
            responses: responses.clone(),
        };
        let picker = Arc::new(Picker::new(parts, &config, &mut registry));
        let reporter = Arc::new(Reporter::new(fleet.clone(), tenants.clone(), owners, responses, &mut registry));
        let t = &config.timeouts;
        let scraper = Scraper {
            client: reqwest::Client::new(),
            interval: Duration::from_millis(t.scrape_interval_ms),
            timeout: Duration::from_millis(t.scrape_timeout_ms),
            unhealthy_after: config.unhealthy_after,
        };
        let feeds = Feeds { scraper, index, warm_start, index_capacity_factor: config.resilience.index_capacity_factor };
        let membership = Arc::new(Membership::new(fleet.clone(), workers, feeds, Duration::from_millis(config.resilience.drain_timeout_ms)));
        for worker in &config.workers {
            membership.add_worker(worker)?;
        }
        let discovery = Discovery::new(membership.clone(), fleet.clone(), config.worker_groups.clone(), &mut registry);
        let api_metrics = Arc::new(crate::api::ApiMetrics::register(&mut registry));
        // Other replicas' changes: what is known already now, the rest as it comes. A pick an
        // end freed here, with how it ended, was reported to a replica that did not hold it:
        // it is settled here (every replica holding a copy does so; a settle is idempotent).
        // An end that came without it (a tombstone) leaves the reservation charged: an
        // estimate, never free.
        let (tx, mut rx) = mpsc::unbounded_channel();
        replication.attach(tx);
        let apply = {
            let (membership, tenants) = (membership.clone(), tenants.clone());
            move |event| {
                if let Some((a, ending)) = membership.apply_replicated(event) {
                    if let Some(scope) = a.budget {
                        tenants.settle_charged(scope, a.id.0, settled_tokens(&ending, a.uncached_tokens, a.reserved), a.reserved);
                    }
                }
            }
        };
        while let Ok(event) = rx.try_recv() {
            apply(event);
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(async move {
                while let Some(event) = rx.recv().await {
                    apply(event);
                }
            });
        }
        let metrics = Arc::new(registry);
        Ok(App { config, fleet, picker, reporter, membership, discovery, tenants, tokenization, metrics, api_metrics })
    }

    /// [`App::build`], then starts the background work: tokenizer loads, every worker's
    /// feeds, the sweeper, the queue's dispatcher and the budget overrides' refresh. Needs a tokio runtime.
    pub fn start(config: Config, store: Store) -> Result<App, AddWorkerError> {
        let app = App::build(config, store)?;
        let templates = app.config.worker_groups.iter().map(|g| g.template.model.clone()).filter(|m| !m.is_empty());
        app.tokenization.preload(app.fleet.workers().iter().map(|w| w.config.model.clone()).chain(templates).collect());
        app.membership.start_feeds();
        app.discovery.start();
        let fleet = app.fleet.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            loop {
                tick.tick().await;
                fleet.sweep(Instant::now());
            }
        });
        tokio::spawn(app.picker.clone().dispatch_forever());
        if app.tenants.is_shared() {
            let tenants = app.tenants.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(OVERRIDES_REFRESH);
                loop {
                    tick.tick().await;
                    if let Err(e) = tenants.refresh().await {
                        tracing::debug!(error = %e, "budget overrides not refreshed");
                    }
                }
            });
        }
        Ok(app)
    }

    /// The HTTP API over these components.
    pub fn router(&self) -> axum::Router {
        crate::api::app(crate::api::ApiState {
            config: self.config.clone(),
            fleet: self.fleet.clone(),
            picker: self.picker.clone(),
            reporter: self.reporter.clone(),
            membership: self.membership.clone(),
            tenants: self.tenants.clone(),
            tokenization: self.tokenization.clone(),
            registry: self.metrics.clone(),
            metrics: self.api_metrics.clone(),
        })
    }
}
