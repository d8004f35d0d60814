//! Workers registered or removed through any replica's admin API: stored without TTL
//! (`{prefix}:worker:{id}`, `SET NX`: the first registration of an id wins) and published;
//! other replicas adopt or drop them, never a worker of their own config.

use super::{unavailable, Handle, RedisStore, StoreError};
use crate::config::WorkerConfig;
use crate::fleet::FleetEvent;
use crate::store::{Inbound, ShareError, StoreFuture, WorkerSharing};
use super::shards::ShardId;
use super::wire::Event;
use kvroute_kv::types::WorkerId;
use std::sync::atomic::Ordering;

impl RedisStore {
    pub(super) fn worker_key(&self, id: &str) -> String {
        format!("{}:worker:{id}", self.config.key_prefix)
    }

    /// The runtime-registered workers stored on `shard`.
    pub(super) async fn load_workers(&self, shard: ShardId) -> Result<Vec<WorkerConfig>, StoreError> {
        let values = self.scan_values(shard, &format!("{}:worker:*", self.config.key_prefix)).await?;
        Ok(values
            .into_iter()
            .filter_map(|json| match serde_json::from_slice::<WorkerConfig>(&json) {
                Ok(w) => Some(w),
                Err(e) => {
                    self.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "stored worker unreadable");
                    None
                }
            })
            .collect())
    }

    /// The shared workers whose keys live on `shard`.
    pub(super) fn shared_on(&self, shard: ShardId) -> Vec<String> {
        self.shared.lock().iter().filter(|id| self.shards.owner(&self.worker_key(id)) == shard).cloned().collect()
    }

    /// Offers a worker another replica registered (or found stored) to this replica, unless
    /// a config worker of the same id is this replica's own.
    pub(super) fn adopt_worker(&self, inbound: &Inbound, worker: WorkerConfig) {
        if self.config_workers.contains(&worker.id) {
            return;
        }
        self.shared.lock().insert(worker.id.clone());
        let _ = inbound.send(FleetEvent::WorkerAdded(Box::new(worker)));
    }

    /// Removes a shared worker another replica removed; never a config worker.
    pub(super) fn drop_worker(&self, inbound: &Inbound, id: &str) {
        if !self.shared.lock().remove(id) || self.config_workers.contains(id) {
            return;
        }
        let _ = inbound.send(FleetEvent::WorkerRemoved(WorkerId::new(id)));
    }

    /// Stores a worker registered through the admin API (`SET NX`: the first registration of
    /// an id wins) and publishes it, before the admin call answers.
    async fn register_now(&self, worker: &WorkerConfig) -> Result<(), ShareError> {
        let key = self.worker_key(&worker.id);
        let shard = self.shards.owner(&key);
        let json = serde_json::to_string(worker).map_err(|e| ShareError::Unavailable(e.to_string()))?;
        let stored: Option<String> = self.shards.cmd(shard, redis::cmd("SET").arg(&key).arg(json).arg("NX")).await.map_err(|e| unavailable(shard, e))?;
        if stored.is_none() {
            return Err(ShareError::Exists(worker.id.clone()));
        }
        let mut pipe = redis::pipe();
        self.publish(&mut pipe, Event::WorkerAdded(Box::new(worker.clone())));
        self.shards.pipe::<()>(shard, &pipe).await.map_err(|e| unavailable(shard, e))
    }

    /// Deletes a shared worker and publishes its removal, before the admin call answers.
    async fn unregister_now(&self, id: &str) -> Result<(), ShareError> {
        let key = self.worker_key(id);
        let shard = self.shards.owner(&key);
        let mut pipe = redis::pipe();
        pipe.del(&key).ignore();
        self.publish(&mut pipe, Event::WorkerRemoved { id: id.to_string() });
        self.shards.pipe::<()>(shard, &pipe).await.map_err(|e| unavailable(shard, e))
    }
}

impl WorkerSharing for Handle {
    fn share_worker(&self, worker: &WorkerConfig) -> StoreFuture {
        let (me, worker) = (self.0.clone(), worker.clone());
        Box::pin(async move {
            let id = worker.id.clone();
            me.register_now(&worker).await?;
            me.shared.lock().insert(id);
            Ok(())
        })
    }

    fn is_shared(&self, id: &str) -> bool {
        self.0.shared.lock().contains(id)
    }

    fn unshare_worker(&self, id: &str) -> StoreFuture {
        let (me, id) = (self.0.clone(), id.to_string());
        Box::pin(async move {
            me.unregister_now(&id).await?;
            me.shared.lock().remove(&id);
            Ok(())
        })
    }

    fn worker_rejected(&self, id: &str) {
        self.0.shared.lock().remove(id);
    }
}
