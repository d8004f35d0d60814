//! Reading and restoring one engine's block map wholesale: what the Redis mirror writes
//! (`export`, `entry`) and what a warm start loads back (`restore`).
//!
//! A restored entry carries its kvroute key, so no tokens are needed: later `BlockStored`
//! events whose parent is a restored hash chain from that key exactly as if the replica had
//! seen the original store.

use super::{tier_bit, Entry, MemoryIndex, GPU};
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
        self.tiers & tier_bit(tier) != 0
    }
}

impl MemoryIndex {
    /// Every block `engine` holds, sorted by engine hash.
    pub fn export(&self, engine: EngineSlot) -> Vec<BlockEntry> {
        let handle = self.engines.read().get(&engine).cloned();
        let Some(handle) = handle else { return Vec::new() };
        let e = handle.lock();
        let mut out: Vec<BlockEntry> =
            e.blocks.iter().map(|(h, en)| BlockEntry { hash: *h, key: en.key, tiers: en.tiers }).collect();
        out.sort_unstable();
        out
    }

    /// The block `engine` holds under `hash`, if any.
    pub fn entry(&self, engine: EngineSlot, hash: EngineHash) -> Option<BlockEntry> {
        let handle = self.engines.read().get(&engine).cloned()?;
        let e = handle.lock();
        e.blocks.get(&hash).map(|en| BlockEntry { hash, key: en.key, tiers: en.tiers })
    }

    /// Replaces everything `engine` holds with `entries` (invalid tier bits are masked; an
    /// entry left with none is skipped). Returns how many blocks were restored.
    pub fn restore(&self, engine: EngineSlot, entries: &[BlockEntry]) -> usize {
        let handle = self.engine(engine);
        let mut e = handle.lock();
        let had_cold = !e.cold.is_empty();
        self.clear_locked(engine, &mut e);
        for b in entries {
            let tiers = b.tiers & ALL_TIERS;
            if tiers == 0 || e.blocks.contains_key(&b.hash) {
                continue;
            }
            e.blocks.insert(b.hash, Entry { key: b.key, tiers });
            self.hold(engine, &mut e.extra_refs, b.key);
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
