//! Worker discovery: each `[[worker_groups]]` entry is watched by one task that finds the
//! group's workers (DNS: `discovery/dns.rs`; a file: `discovery/file.rs`) and reconciles the
//! fleet with what it found:
//! - a new address is registered from the group's template (its feeds start at once);
//! - a vanished one is drained: no new picks, removed when its running requests end
//!   (`resilience.drain_timeout_ms` at most), never mid-request;
//! - a changed entry (a file's new labels or model) is drained and registered again once
//!   gone (its cache index is relearned from its events and replay);
//! - a failed lookup or an unreadable file keeps the last good set, counted and logged.
//!
//! Each replica discovers on its own (they ask the same DNS, read the same file); discovered
//! workers are not shared through the store.

pub mod dns;
pub mod file;

use crate::config::groups::{Source, WorkerGroup};
use crate::config::WorkerConfig;
use crate::fleet::Fleet;
use crate::membership::Membership;
use crate::metrics::Registry;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// One look at a group's source: the workers it names now, and when to look again.
pub struct Found {
    pub workers: Vec<WorkerConfig>,
    pub next: Duration,
}

/// What happened to a discovered worker (the `change` label).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Change {
    added,
    drained,
    /// Registered differently before: drained, added again once gone.
    updated,
    /// Refused by validation (e.g. a block size another worker of the model contradicts).
    refused,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
    group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChangeLabels {
    group: String,
    change: Change,
}

struct DiscoveryMetrics {
    workers: Family<GroupLabels, Gauge>,
    failures: Family<GroupLabels, Counter>,
    changes: Family<ChangeLabels, Counter>,
}

pub struct Discovery {
    membership: Arc<Membership>,
    fleet: Arc<Fleet>,
    groups: Vec<WorkerGroup>,
    metrics: DiscoveryMetrics,
}

impl Discovery {
    pub fn new(membership: Arc<Membership>, fleet: Arc<Fleet>, groups: Vec<WorkerGroup>, registry: &mut Registry) -> Arc<Discovery> {
        let metrics = DiscoveryMetrics { workers: Family::default(), failures: Family::default(), changes: Family::default() };
        registry.register("discovered_workers", "Workers a group's source names now, per group", metrics.workers.clone());
        registry.register(
            "discovery_failures",
            "Failed lookups of a group's source (DNS error, unreadable or invalid file): the last good set stays",
            metrics.failures.clone(),
        );
        registry.register("discovery_changes", "Discovered workers added, drained, updated or refused, per group", metrics.changes.clone());
        Arc::new(Discovery { membership, fleet, groups, metrics })
    }

    /// One task per group, for the life of the process.
    pub fn start(self: &Arc<Self>) {
        for group in self.groups.clone() {
            tokio::spawn(self.clone().watch(group));
        }
    }

    async fn watch(self: Arc<Self>, group: WorkerGroup) {
        let min = Duration::from_millis(group.min_refresh_ms);
        let mut finder = match Finder::new(&group) {
            Ok(finder) => finder,
            Err(e) => {
                self.metrics.failures.get_or_create(&GroupLabels { group: group.name.clone() }).inc();
                tracing::error!(group = %group.name, error = %e, "worker group not watched: no resolver");
                return;
            }
        };
        let mut state = GroupState::default();
        loop {
            let next = match finder.find(&group).await {
                Ok(found) => {
                    self.metrics.workers.get_or_create(&GroupLabels { group: group.name.clone() }).set(found.workers.len() as i64);
                    self.reconcile(&group.name, &mut state, found.workers);
                    found.next
                }
                Err(e) => {
                    self.metrics.failures.get_or_create(&GroupLabels { group: group.name.clone() }).inc();
                    tracing::warn!(group = %group.name, error = %e, "worker group lookup failed; keeping the last good set");
                    min
                }
            };
            tokio::time::sleep(next).await;
        }
    }

    /// Brings the fleet to `want` for the workers this group registered. Idempotent: run
    /// again, it finishes what could not be done yet (registering again a worker whose
    /// earlier registration is still draining).
    pub fn reconcile(&self, group: &str, state: &mut GroupState, want: Vec<WorkerConfig>) {
        let count = |change| self.metrics.changes.get_or_create(&ChangeLabels { group: group.to_string(), change }).inc();
        // Drained and removed: no longer ours.
        state.owned.retain(|id, _| self.fleet.worker(id).is_some());
        let wanted: BTreeMap<String, WorkerConfig> = want.into_iter().map(|w| (w.id.clone(), w)).collect();
        for (id, config) in &state.owned {
            let change = match wanted.get(id) {
                None => Change::drained,
                Some(w) if w != config => Change::updated,
                Some(_) => continue,
            };
            let draining = self.fleet.worker(id).is_some_and(|e| e.load.lock().draining);
            if !draining && self.membership.drain(id).is_some() {
                tracing::info!(group, worker = %id, ?change, "discovered worker draining");
                count(change);
            }
        }
        state.refused.retain(|id, w| wanted.get(id) == Some(w));
        for (id, worker) in wanted {
            if state.owned.contains_key(&id) || state.refused.contains_key(&id) || self.fleet.worker(&id).is_some() {
                continue;
            }
            match self.membership.add_worker(&worker) {
                Ok(_) => {
                    tracing::info!(group, worker = %id, endpoint = %worker.endpoint, "discovered worker registered");
                    count(Change::added);
                    state.owned.insert(id, worker);
                }
                Err(e) => {
                    tracing::warn!(group, worker = %id, error = %e, "discovered worker refused");
                    count(Change::refused);
                    state.refused.insert(id, worker);
                }
            }
        }
    }
}

/// What a group's task knows between looks.
#[derive(Default)]
pub struct GroupState {
    /// Workers it registered (by id, as registered); a draining one stays until removed.
    owned: BTreeMap<String, WorkerConfig>,
    /// Entries the fleet refused, so each is counted and logged once (until it changes).
    refused: BTreeMap<String, WorkerConfig>,
}

/// A group's source, ready to be asked.
enum Finder {
    Dns(Box<dns::Dns>),
    File(file::Watched),
}

impl Finder {
    fn new(group: &WorkerGroup) -> Result<Finder, hickory_resolver::ResolveError> {
        Ok(match group.source() {
            Some(Source::File(path)) => Finder::File(file::Watched::new(path)),
            _ => Finder::Dns(Box::new(dns::Dns::new(group.resolver)?)),
        })
    }

    async fn find(&mut self, group: &WorkerGroup) -> Result<Found, String> {
        let (min, max) = (Duration::from_millis(group.min_refresh_ms), Duration::from_millis(group.max_refresh_ms));
        let answer = match (self, group.source()) {
            (Finder::File(watched), _) => {
                let workers = watched.read(group).map_err(|e| e.to_string())?;
                return Ok(Found { workers, next: min });
            }
            (Finder::Dns(dns), Some(Source::Dns { name, port })) => dns.addresses(name, port).await,
            (Finder::Dns(dns), Some(Source::Srv(name))) => dns.services(name).await,
            (Finder::Dns(_), _) => return Err("the group names no source".into()),
        }
        .map_err(|e| e.to_string())?;
        let workers = answer.addresses.iter().map(|(host, port)| group.worker_at(host, *port)).collect();
        Ok(Found { workers, next: answer.ttl.unwrap_or(min).clamp(min, max) })
    }
}
