//! Ingestion leases: one replica per engine writes that engine's mirror.
//!
//! Every replica ingests every engine (each needs its own index), but only the holder of
//! `{prefix}:lease:{worker}:{rank}` writes the mirror, so writers never interleave. The lease
//! is a Redis key with a TTL holding the replica's id; one script acquires it when free and
//! renews it when ours, every third of the TTL. A replica that dies stops renewing and
//! another takes over within one TTL. Losing the lease (or its shard) stops mirroring at once;
//! gaining it starts with a full rewrite, since the previous holder's last writes may be lost.

use super::mirror::{self, MirrorKey};
use super::RedisStore;
use crate::ingest::IngestStats;
use kvroute_kv::types::EngineSlot;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Acquire when free, renew when ours; 1 = held, 0 = someone else's.
const ACQUIRE_OR_RENEW: &str = r"
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0";

/// One engine as its lease/mirror task sees it.
pub struct EngineMirror {
    pub slot: EngineSlot,
    pub lease_key: String,
    pub key: MirrorKey,
    pub stats: Arc<IngestStats>,
}

/// Runs until aborted (the worker's removal): keeps the lease and flushes mirror changes.
pub async fn run(store: Arc<RedisStore>, engine: EngineMirror) {
    let ttl = Duration::from_millis(store.config.lease_ttl_ms.max(30));
    let flush_every = Duration::from_millis(store.config.mirror_interval_ms.max(1));
    let shard = store.shards.owner(&engine.key.blocks);
    let lease_shard = store.shards.owner(&engine.lease_key);
    let mut held = false;
    let mut renew_at = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(flush_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if tokio::time::Instant::now() >= renew_at {
            let cmd = redis::cmd("EVAL").arg(ACQUIRE_OR_RENEW).arg(1).arg(&engine.lease_key).arg(&store.replica).arg(ttl.as_millis() as u64).to_owned();
            let now_held = matches!(store.shards.cmd::<i64>(lease_shard, &cmd).await, Ok(1));
            if now_held != held {
                tracing::info!(engine = engine.slot.0, lease = %engine.lease_key, held = now_held, "ingestion lease changed hands");
                store.index.track(engine.slot, now_held);
                held = now_held;
            }
            renew_at = tokio::time::Instant::now() + ttl / 3;
        }
        if !held {
            continue;
        }
        if !store.shards.is_up(shard) {
            store.index.request_full(engine.slot);
            continue;
        }
        // The seq first: the changes taken after it are at least as new (module docs).
        let seq = engine.stats.last_seq();
        let Some(changes) = store.index.take_changes(engine.slot) else { continue };
        match mirror::write(&store.shards, shard, &engine.key, &changes, seq).await {
            Ok(()) => {
                store.stats.mirror_flushes.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::debug!(error = %e, engine = engine.slot.0, "mirror write failed; rewriting when the shard returns");
                store.stats.mirror_failures.fetch_add(1, Ordering::Relaxed);
                store.index.request_full(engine.slot);
            }
        }
    }
}
