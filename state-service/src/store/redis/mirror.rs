//! The warm-start mirror: each engine's block set (engine hash -> kvroute key + tiers) and
//! the sequence number it is current to, kept in Redis by the replica holding the engine's
//! ingestion lease.
//!
//! [`MirroredIndex`] is the replica's [`KvIndex`]: the memory index plus, for engines this
//! replica mirrors, the set of engine hashes touched since the last flush. A flush reads the
//! engine's `last_seq` *before* taking the changes, so what it writes is at least as new as
//! the seq it writes (replaying from there re-applies a few batches, which is idempotent).
//! An `AllBlocksCleared`, a reset, a lost write or a newly acquired lease asks for a full
//! rewrite instead of a diff.
//!
//! Layout (both keys on the shard owning `{prefix}:mirror:{worker}:{rank}`): that key is a
//! hash, field = engine hash (8 bytes BE), value = kvroute key (8 bytes BE) + tier bits
//! (1 byte); `...:seq` holds the seq. Diffs and rewrites go in one MULTI, so a reader never
//! sees blocks and a seq that disagree.

use super::shards::{ShardId, Shards};
use super::StoreError;
use kvroute_kv::index::memory::snapshot::BlockEntry;
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_kv::index::{ApplyStats, KvIndex, PrefixMatch};
use kvroute_kv::types::{BlockKey, EngineHash, EngineSlot, KvEvent};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};

/// Where one engine's mirror lives.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MirrorKey {
    pub blocks: String,
    pub seq: String,
}

impl MirrorKey {
    pub fn new(prefix: &str, worker: &str, rank: u32) -> Self {
        let blocks = format!("{prefix}:mirror:{worker}:{rank}");
        MirrorKey { seq: format!("{blocks}:seq"), blocks }
    }
}

/// An engine's mirror as read back from Redis.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mirror {
    pub blocks: Vec<BlockEntry>,
    pub seq: Option<u64>,
}

/// What changed on an engine since the last flush.
#[derive(Debug, PartialEq)]
pub enum Changes {
    Full(Vec<BlockEntry>),
    Diff { set: Vec<BlockEntry>, del: Vec<EngineHash> },
}

#[derive(Default)]
struct Dirty {
    hashes: HashSet<EngineHash>,
    full: bool,
}

/// The memory index plus change tracking for mirrored engines. See the module docs.
#[derive(Default)]
pub struct MirroredIndex {
    inner: MemoryIndex,
    dirty: Mutex<HashMap<EngineSlot, Dirty>>,
}

impl MirroredIndex {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn memory(&self) -> &MemoryIndex {
        &self.inner
    }

    /// Starts (with a full rewrite pending) or stops tracking `engine`'s changes.
    pub fn track(&self, engine: EngineSlot, on: bool) {
        let mut d = self.dirty.lock();
        match on {
            true => d.entry(engine).or_default().full = true,
            false => {
                d.remove(&engine);
            }
        }
    }

    /// The next flush of a tracked engine rewrites its whole mirror.
    pub fn request_full(&self, engine: EngineSlot) {
        if let Some(d) = self.dirty.lock().get_mut(&engine) {
            d.full = true;
        }
    }

    /// Takes `engine`'s pending changes; `None` when it is not tracked or nothing changed.
    pub fn take_changes(&self, engine: EngineSlot) -> Option<Changes> {
        let d = {
            let mut all = self.dirty.lock();
            let d = all.get_mut(&engine)?;
            if !d.full && d.hashes.is_empty() {
                return None;
            }
            std::mem::take(d)
        };
        if d.full {
            return Some(Changes::Full(self.inner.export(engine)));
        }
        let (mut set, mut del) = (Vec::new(), Vec::new());
        for h in d.hashes {
            match self.inner.entry(engine, h) {
                Some(e) => set.push(e),
                None => del.push(h),
            }
        }
        Some(Changes::Diff { set, del })
    }

    fn mark(&self, engine: EngineSlot, events: &[KvEvent]) {
        let mut all = self.dirty.lock();
        let Some(d) = all.get_mut(&engine) else { return };
        for ev in events {
            match ev {
                KvEvent::Stored { hashes, .. } | KvEvent::Removed { hashes, .. } => d.hashes.extend(hashes),
                KvEvent::AllCleared => d.full = true,
            }
        }
        if d.full {
            d.hashes.clear();
        }
    }
}

impl KvIndex for MirroredIndex {
    fn apply(&self, engine: EngineSlot, model: &str, block_size: u32, events: &[KvEvent]) -> ApplyStats {
        let stats = self.inner.apply(engine, model, block_size, events);
        self.mark(engine, events);
        if stats.evicted > 0 {
            // Dropped blocks of earlier batches are in no diff: rewrite (bounded by the cap).
            self.request_full(engine);
        }
        stats
    }

    fn set_capacity(&self, engine: EngineSlot, blocks: Option<usize>) -> u64 {
        let dropped = self.inner.set_capacity(engine, blocks);
        if dropped > 0 {
            self.request_full(engine);
        }
        dropped
    }

    fn clear_engine(&self, engine: EngineSlot) {
        self.inner.clear_engine(engine);
        self.request_full(engine);
    }

    fn match_prefix(&self, keys: &[BlockKey]) -> Vec<PrefixMatch> {
        self.inner.match_prefix(keys)
    }

    fn engine_blocks(&self, engine: EngineSlot) -> usize {
        self.inner.engine_blocks(engine)
    }
}

fn encode(e: &BlockEntry) -> ([u8; 8], [u8; 9]) {
    let mut v = [0u8; 9];
    v[..8].copy_from_slice(&e.key.0.to_be_bytes());
    v[8] = e.tiers;
    (e.hash.0.to_be_bytes(), v)
}

fn decode(field: &[u8], value: &[u8]) -> Option<BlockEntry> {
    let hash = u64::from_be_bytes(field.try_into().ok()?);
    let key = u64::from_be_bytes(value.get(..8)?.try_into().ok()?);
    Some(BlockEntry { hash: EngineHash(hash), key: BlockKey(key), tiers: *value.get(8)? })
}

/// Fields per HSET / HDEL command (keeps single commands small for huge caches).
const CHUNK: usize = 1024;

/// Writes `changes` and `seq` in one transaction on `shard`.
pub async fn write(shards: &Shards, shard: ShardId, key: &MirrorKey, changes: &Changes, seq: Option<u64>) -> Result<(), StoreError> {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let set = match changes {
        Changes::Full(all) => {
            pipe.del(&key.blocks).ignore();
            all.as_slice()
        }
        Changes::Diff { set, del } => {
            for chunk in del.chunks(CHUNK) {
                let fields: Vec<Vec<u8>> = chunk.iter().map(|h| h.0.to_be_bytes().to_vec()).collect();
                pipe.hdel(&key.blocks, fields).ignore();
            }
            set.as_slice()
        }
    };
    for chunk in set.chunks(CHUNK) {
        let items: Vec<(Vec<u8>, Vec<u8>)> = chunk.iter().map(encode).map(|(f, v)| (f.to_vec(), v.to_vec())).collect();
        pipe.hset_multiple(&key.blocks, &items).ignore();
    }
    match seq {
        Some(s) => pipe.set(&key.seq, s).ignore(),
        None => pipe.del(&key.seq).ignore(),
    };
    shards.pipe::<()>(shard, &pipe).await
}

/// Reads an engine's mirror (empty when there is none). Undecodable fields are skipped.
pub async fn load(shards: &Shards, shard: ShardId, key: &MirrorKey) -> Result<Mirror, StoreError> {
    let mut pipe = redis::pipe();
    pipe.atomic().hgetall(&key.blocks).get(&key.seq);
    type Fields = Vec<(Vec<u8>, Vec<u8>)>;
    let (raw, seq): (Fields, Option<u64>) = shards.pipe(shard, &pipe).await?;
    let mut blocks: Vec<BlockEntry> = raw.iter().filter_map(|(f, v)| decode(f, v)).collect();
    blocks.sort_unstable();
    Ok(Mirror { blocks, seq })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_through_the_encoding() {
        let e = BlockEntry { hash: EngineHash(u64::MAX - 3), key: BlockKey(0x0102_0304_0506_0708), tiers: 5 };
        let (f, v) = encode(&e);
        assert_eq!(decode(&f, &v), Some(e));
        assert_eq!(decode(&f[..7], &v), None);
        assert_eq!(decode(&f, &v[..8]), None);
    }
}
