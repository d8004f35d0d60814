//! Which workers the fleet has: registered from the config, the admin API or another replica,
//! each with its feeds (metrics scraper, KV-event ingestion) running while it is registered;
//! drained and removed on request.
//!
//! Workers registered at runtime are shared through the store before they are registered
//! here ([`WorkerSharing`]), so a refused id never reaches any fleet; another replica's
//! registrations and removals arrive with the other replicated changes
//! ([`Membership::apply_replicated`]).

use crate::assign::Assignment;
use crate::tenancy::Ending;
use crate::config::WorkerConfig;
use crate::feeds::Feeds;
use crate::fleet::{AddWorkerError, Fleet, FleetEvent, RegistryError, WorkerEntry};
use crate::store::{ShareError, WorkerSharing};
use kvroute_kv::types::WorkerId;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Why an admin registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// Invalid here (config rules, block size).
    #[error(transparent)]
    Invalid(AddWorkerError),
    /// Registered already, here or on another replica.
    #[error("{0}")]
    Exists(String),
    /// The shared store did not take it.
    #[error("worker not registered: {0}")]
    Unavailable(ShareError),
}

pub struct Membership {
    fleet: Arc<Fleet>,
    sharing: Arc<dyn WorkerSharing>,
    feeds: Feeds,
    /// Set once [`Membership::start_feeds`] ran: workers registered later start theirs at
    /// once. Held while starting, so a worker registered concurrently is started exactly once.
    running: Mutex<bool>,
    drain_timeout: Duration,
}

impl Membership {
    pub fn new(fleet: Arc<Fleet>, sharing: Arc<dyn WorkerSharing>, feeds: Feeds, drain_timeout: Duration) -> Membership {
        Membership { fleet, sharing, feeds, running: Mutex::new(false), drain_timeout }
    }

    /// How workers' metrics are scraped (tests scrape by hand).
    pub fn scraper(&self) -> &crate::load::Scraper {
        &self.feeds.scraper
    }

    /// Starts the feeds of every worker registered so far, and of every worker registered
    /// from now on.
    pub fn start_feeds(&self) {
        let mut running = self.running.lock();
        for worker in self.fleet.workers() {
            self.feeds.start(&worker);
        }
        *running = true;
    }

    /// Validates and registers a worker, and starts its feeds once feeds run.
    pub fn add_worker(&self, worker: &WorkerConfig) -> Result<Arc<WorkerEntry>, AddWorkerError> {
        let running = self.running.lock();
        let entry = self.fleet.register(worker)?;
        if *running {
            self.feeds.start(&entry);
        }
        Ok(entry)
    }

    /// The admin API's registration: shared first (with Redis: stored for every replica),
    /// then registered here; taken back from the store when this replica refuses it.
    pub async fn add_shared(&self, worker: WorkerConfig) -> Result<Arc<WorkerEntry>, RegisterError> {
        if self.fleet.worker(&worker.id).is_some() {
            return Err(RegisterError::Exists(RegistryError::Duplicate(worker.id).to_string()));
        }
        self.fleet.validate_worker(&worker).map_err(|e| RegisterError::Invalid(e.into()))?;
        self.sharing.share_worker(&worker).await.map_err(|e| match e {
            ShareError::Exists(_) => RegisterError::Exists(e.to_string()),
            ShareError::Unavailable(_) => RegisterError::Unavailable(e),
        })?;
        match self.add_worker(&worker) {
            Ok(entry) => Ok(entry),
            // Registered meanwhile (a shared registration of the same id arrived): keep it.
            Err(AddWorkerError::Registry(e @ RegistryError::Duplicate(_))) => Err(RegisterError::Exists(e.to_string())),
            Err(e) => {
                // So no replica adopts a worker this one refused.
                if let Err(undo) = self.sharing.unshare_worker(&worker.id).await {
                    tracing::warn!(worker = %worker.id, error = %undo, "rejected worker could not be unshared");
                }
                Err(RegisterError::Invalid(e))
            }
        }
    }

    /// Unregisters a worker, stops its feeds and forgets everything learned about it.
    pub fn remove_worker(&self, id: &str) -> bool {
        // The feed slot first, as in `add_worker`: a worker being registered has its feeds
        // started before it can be removed (and stopped here).
        let running = self.running.lock();
        let removed = self.fleet.unregister(&WorkerId::new(id));
        drop(running);
        match removed {
            Some(entry) => {
                entry.stop_tasks();
                self.fleet.clear_engines(&entry);
                true
            }
            None => false,
        }
    }

    /// Stops new picks to worker `id` on every replica, then removes it once its in-flight
    /// requests have ended (or `resilience.drain_timeout_ms` passed). Returns how many were
    /// in flight, `None` for an unknown worker. Draining twice is one drain.
    pub fn drain(self: &Arc<Self>, id: &str) -> Option<u32> {
        let entry = self.fleet.worker(id)?;
        let first = self.fleet.drain(&entry.id).is_some();
        let in_flight = self.fleet.in_flight(&entry.id);
        if first {
            tracing::info!(worker = %entry.id, in_flight, "draining worker");
            let (me, deadline) = (self.clone(), Instant::now() + self.drain_timeout);
            tokio::spawn(async move {
                while me.fleet.in_flight(&entry.id) > 0 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let left = me.fleet.in_flight(&entry.id);
                if let Err(e) = me.retire(entry.id.as_str()).await {
                    tracing::warn!(worker = %entry.id, error = %e, "drained worker could not be unshared; it stays, draining");
                    return;
                }
                tracing::info!(worker = %entry.id, abandoned = left, "drained worker removed");
            });
        }
        Some(in_flight)
    }

    /// Removes worker `id` now: from every replica when it is shared, else from this one.
    pub async fn retire(&self, id: &str) -> Result<(), ShareError> {
        if self.sharing.is_shared(id) {
            self.sharing.unshare_worker(id).await?;
        }
        self.remove_worker(id);
        Ok(())
    }

    /// Applies a change another replica made (or a warm start found). Workers it adds get
    /// their feeds; a worker this replica refuses is handed back to the store. Returns an
    /// assignment freed with how it ended, for its budget (see [`Fleet::apply_replicated`]).
    pub fn apply_replicated(&self, event: FleetEvent) -> Option<(Assignment, Ending)> {
        match event {
            FleetEvent::WorkerAdded(config) => {
                let id = config.id.clone();
                match self.add_worker(&config) {
                    Ok(_) => tracing::info!(worker = %id, "worker registered by another replica"),
                    // Registered meanwhile (by this replica's admin API): it stays shared.
                    Err(AddWorkerError::Registry(RegistryError::Duplicate(_))) => {}
                    Err(e) => {
                        self.sharing.worker_rejected(&id);
                        tracing::warn!(worker = %id, error = %e, "shared worker rejected here");
                    }
                }
            }
            FleetEvent::WorkerRemoved(id) => {
                if self.remove_worker(id.as_str()) {
                    tracing::info!(worker = %id, "worker removed by another replica");
                }
            }
            other => return self.fleet.apply_replicated(&other, Instant::now()),
        }
        None
    }
}
