//! The Redis-backed mirror equals the reference model: every batch goes through a
//! [`MirroredIndex`], its changes are flushed to a 3-shard Redis, and every lookup is answered
//! by a fresh memory index restored from what Redis holds. So the mirror (diffs, full
//! rewrites, encoding, sharding) plus the index it restores are held to the same streams as
//! the memory index.

use super::support::{shards, RedisServer};
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_kv::index::reference::differential::check;
use kvroute_kv::index::{ApplyStats, KvIndex, PrefixMatch};
use kvroute_state::store::redis::shards::Shards;
use kvroute_state::store::redis::{mirror, MirrorKey, MirroredIndex};
use kvroute_kv::types::{BlockKey, EngineSlot, KvEvent};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;

struct MirrorRoundTrip {
    rt: Arc<Runtime>,
    shards: Arc<Shards>,
    prefix: String,
    subject: MirroredIndex,
    tracked: Mutex<HashSet<EngineSlot>>,
    restored: MemoryIndex,
    seq: AtomicU64,
}

impl MirrorRoundTrip {
    fn key(&self, engine: EngineSlot) -> MirrorKey {
        MirrorKey::new(&self.prefix, &format!("e{}", engine.0), 0)
    }

    /// Flushes `engine`'s changes to Redis and restores it from there.
    fn round_trip(&self, engine: EngineSlot) {
        if self.tracked.lock().insert(engine) {
            self.subject.track(engine, true);
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let key = self.key(engine);
        let shard = self.shards.owner(&key.blocks);
        let (wrote, loaded) = self.rt.block_on(async {
            let changes = self.subject.take_changes(engine);
            if let Some(changes) = &changes {
                mirror::write(&self.shards, shard, &key, changes, Some(seq)).await.expect("mirror write");
            }
            (changes.is_some(), mirror::load(&self.shards, shard, &key).await.expect("mirror load"))
        });
        if wrote {
            assert_eq!(loaded.seq, Some(seq), "seq written with the blocks");
        }
        self.restored.restore(engine, &loaded.blocks);
    }
}

impl KvIndex for MirrorRoundTrip {
    fn apply(&self, engine: EngineSlot, model: &str, block_size: u32, events: &[KvEvent]) -> ApplyStats {
        if self.tracked.lock().insert(engine) {
            self.subject.track(engine, true);
        }
        let stats = self.subject.apply(engine, model, block_size, events);
        self.round_trip(engine);
        stats
    }

    fn clear_engine(&self, engine: EngineSlot) {
        self.subject.clear_engine(engine);
        self.round_trip(engine);
    }

    fn match_prefix(&self, keys: &[BlockKey]) -> Vec<PrefixMatch> {
        self.restored.match_prefix(keys)
    }

    fn engine_blocks(&self, engine: EngineSlot) -> usize {
        self.restored.engine_blocks(engine)
    }
}

#[test]
fn redis_mirror_and_its_index_equal_the_reference() {
    let servers: Vec<RedisServer> = shards(3);
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let rt = Arc::new(tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"));
    let shards = {
        let _guard = rt.enter();
        Arc::new(Shards::new(&urls, Duration::from_secs(2)).expect("shards"))
    };
    let run = AtomicU64::new(0);
    let make = || {
        Box::new(MirrorRoundTrip {
            rt: rt.clone(),
            shards: shards.clone(),
            prefix: format!("diff{}", run.fetch_add(1, Ordering::Relaxed)),
            subject: MirroredIndex::new(),
            tracked: Mutex::new(HashSet::new()),
            restored: MemoryIndex::new(),
            seq: AtomicU64::new(0),
        }) as Box<dyn KvIndex>
    };
    let seeds = std::env::var("KVROUTE_DIFF_SEEDS_REDIS").ok().and_then(|s| s.parse().ok()).unwrap_or(20u64);
    let cov = check(&make, 0..seeds, 120).unwrap_or_else(|e| panic!("{e}"));
    let t = cov.totals;
    assert!(t.blocks_stored > 200 && t.blocks_removed > 50 && t.clears > 2, "{cov:?}");
    assert!(cov.clear_engine_calls > 2 && cov.nonempty_matches > 200 && cov.max_engines >= 3, "{cov:?}");
    // Every engine's mirror really is spread over the shards.
    let owners: HashSet<_> = (0..200u32).map(|e| shards.owner(&MirrorKey::new("diff0", &format!("e{e}"), 0).blocks)).collect();
    assert_eq!(owners.len(), 3);
}
