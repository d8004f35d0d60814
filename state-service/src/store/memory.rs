//! The embedded store: one instance, nothing shared, nothing survives a restart. Every
//! contract is answered locally, at once.

use super::{Inbound, Replication, ResponseDirectory, ResponseFuture, Store, StoreFuture, WarmStart, WorkerSharing};
use crate::config::WorkerConfig;
use crate::fleet::{Change, WorkerEntry};
use crate::ingest::IngestStats;
use crate::stored::Owner;
use kvroute_kv::index::KvIndex;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryStore;

impl MemoryStore {
    /// The store bundle around `index`.
    pub fn store(index: Arc<dyn KvIndex>) -> Store {
        let me = Arc::new(MemoryStore);
        Store { index, replication: me.clone(), warm_start: me.clone(), workers: me.clone(), responses: me, ledger: None, collector: None }
    }
}

impl Replication for MemoryStore {
    fn attach(&self, _inbound: Inbound) {}
    fn publish(&self, _change: Change<'_>) {}
    fn degraded(&self) -> bool {
        false
    }
    fn id_salt(&self) -> u64 {
        0
    }
}

impl WarmStart for MemoryStore {
    fn engine_started(&self, _worker: &Arc<WorkerEntry>, _rank: u32, _stats: &Arc<IngestStats>) -> Option<u64> {
        None
    }
}

impl WorkerSharing for MemoryStore {
    fn share_worker(&self, _worker: &WorkerConfig) -> StoreFuture {
        Box::pin(async { Ok(()) })
    }
    fn is_shared(&self, _id: &str) -> bool {
        false
    }
    fn unshare_worker(&self, _id: &str) -> StoreFuture {
        Box::pin(async { Ok(()) })
    }
    fn worker_rejected(&self, _id: &str) {}
}

/// Responses are known to this replica's own map only.
impl ResponseDirectory for MemoryStore {
    fn share_response(&self, _id: &str, _owner: &Owner, _ttl: Duration) {}
    fn find_response(&self, _id: &str) -> ResponseFuture {
        Box::pin(async { None })
    }
}
