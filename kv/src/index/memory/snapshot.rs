//! Reading and restoring one engine's block map wholesale: what the Redis mirror writes
//! (`export`, `entry`) and what a warm start loads back (`restore`).
//!
//! A restored entry carries its kvroute key, so no tokens are needed: later `BlockStored`
//! events whose parent is a restored hash chain from that key exactly as if the replica had
//! seen the original store.

use super::{gslot, split, tier_bit, MemoryIndex, GPU, TIER_BITS, TIER_MASK};
use crate::types::{BlockKey, EngineHash, EngineSlot, Tier};

/// One block of an engine: its engine hash, kvroute key and tier bits (GPU 1, CPU 2,
/// storage 4; never 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockEntry {
    pub hash: EngineHash,
    pub key: BlockKey,
    pub tiers: u8,
}

/// Every tier bit a [`BlockEntry`] may carry.
pub const ALL_TIERS: u8 = 7;

impl BlockEntry {
    pub fn holds(&self, tier: Tier) -> bool {
        u32::from(self.tiers) & tier_bit(tier) != 0
    }
}

impl MemoryIndex {
    /// Every block `engine` holds, sorted by engine hash.
    pub fn export(&self, engine: EngineSlot) -> Vec<BlockEntry> {
        let handle = self.engines.read().get(&engine).cloned();
        let Some(handle) = handle else { return Vec::new() };
        let e = handle.lock();
        // Keys read shard by shard: one read lock a shard, not one a block.
        let mut blocks: Vec<(u32, EngineHash)> = e.blocks.iter().map(|(h, b)| (b, h)).collect();
        blocks.sort_unstable_by_key(|(b, _)| split(gslot(*b)).0);
        let mut out = Vec::with_capacity(blocks.len());
        for run in blocks.chunk_by(|a, b| split(gslot(a.0)).0 == split(gslot(b.0)).0) {
            let shard = self.shards[split(gslot(run[0].0)).0].read();
            for &(b, hash) in run {
                out.push(BlockEntry { hash, key: shard.key(split(gslot(b)).1), tiers: (b & TIER_MASK) as u8 });
            }
        }
        out.sort_unstable();
        out
    }

    /// The block `engine` holds under `hash`, if any.
    pub fn entry(&self, engine: EngineSlot, hash: EngineHash) -> Option<BlockEntry> {
        let handle = self.engines.read().get(&engine).cloned()?;
        let e = handle.lock();
        let b = e.blocks.block(e.blocks.get(hash)?);
        Some(BlockEntry { hash, key: self.key_of(b), tiers: (b & TIER_MASK) as u8 })
    }

    /// Replaces everything `engine` holds with `entries` (invalid tier bits are masked; an
    /// entry left with none is skipped). Returns how many blocks were restored.
    pub fn restore(&self, engine: EngineSlot, entries: &[BlockEntry]) -> usize {
        let handle = self.engine(engine);
        let mut e = handle.lock();
        let had_cold = !e.cold.is_empty();
        self.clear_locked(engine, &mut e);
        for b in entries {
            let tiers = u32::from(b.tiers & ALL_TIERS);
            if tiers == 0 {
                continue;
            }
            let vacant = match e.blocks.get_or_vacant(b.hash) {
                Ok(_) | Err(None) => continue,
                Err(Some(v)) => v,
            };
            let Some(g) = self.hold(engine, &mut e.extra_refs, b.key) else { continue };
            e.blocks.fill(vacant, b.hash, g << TIER_BITS | tiers);
            if tiers & GPU == 0 {
                e.cool(b.key);
            }
        }
        self.track_cold(had_cold, &e);
        e.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::KvIndex;
    use crate::types::KvEvent;

    #[test]
    fn export_restore_round_trips_and_chains_on() {
        let (a, b) = (MemoryIndex::new(), MemoryIndex::new());
        let e = EngineSlot(3);
        let store = |hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>| KvEvent::Stored {
            hashes: hashes.into_iter().map(EngineHash).collect(),
            parent: parent.map(EngineHash),
            token_ids: tokens,
            block_size: 2,
            lora_name: None,
            cache_salt: None,
            tier: Tier::Gpu,
        };
        a.apply(e, "m", 2, &[store(vec![1, 2], None, vec![1, 2, 3, 4])]);
        let snap = a.export(e);
        assert_eq!(snap.len(), 2);
        assert_eq!(b.restore(e, &snap), 2);
        assert_eq!(b.export(e), snap);
        // A later store chaining from a restored block gets the same key on both.
        let next = store(vec![3], Some(2), vec![5, 6]);
        a.apply(e, "m", 2, std::slice::from_ref(&next));
        b.apply(e, "m", 2, &[next]);
        assert_eq!(a.export(e), b.export(e));
        assert_eq!(b.entry(e, EngineHash(3)), a.entry(e, EngineHash(3)));
        assert_eq!(b.entry(e, EngineHash(99)), None);
    }
}
