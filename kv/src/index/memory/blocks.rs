//! One engine's blocks: `EngineHash -> BlockRef` (its kvroute key's global slot and tiers).
//!
//! A dense [`Chunked`] array of 12-byte `Entry { hash, block }` (removal moves the last
//! entry into the gap) and an [`IdTable`] from the hash to the entry's position: 12 bytes
//! plus 4 / load a block, ~18 B.

use super::table::{Chunked, IdTable, Vacant};
use crate::hasher::SeededState;
use crate::types::EngineHash;
use std::hash::BuildHasher;

/// Positions within one engine: 26 bits (67M blocks an engine).
const POS_BITS: u32 = 26;
type PosIndex = IdTable<POS_BITS>;

#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Entry {
    hash_lo: u32,
    hash_hi: u32,
    block: u32,
}

impl Entry {
    fn hash(&self) -> u64 {
        u64::from(self.hash_lo) | (u64::from(self.hash_hi) << 32)
    }
}

pub(super) struct Blocks {
    index: PosIndex,
    entries: Chunked<Entry>,
    hasher: SeededState,
}

impl Blocks {
    pub(super) fn new(hasher: SeededState) -> Self {
        Blocks { index: PosIndex::default(), entries: Chunked::default(), hasher }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    #[inline]
    fn mix(&self, h: EngineHash) -> u64 {
        self.hasher.hash_one(h.0)
    }

    /// The position of `hash`.
    #[inline]
    pub(super) fn get(&self, hash: EngineHash) -> Option<u32> {
        self.index.find(self.mix(hash), |p| self.entries.get(p).hash() == hash.0)
    }

    /// Starts fetching the index bucket a probe for `hash` reads first.
    #[inline]
    pub(super) fn prefetch(&self, hash: EngineHash) {
        self.index.prefetch(self.mix(hash));
    }

    /// The position of `hash`, or where [`fill`](Self::fill) puts it. Err(None): full.
    #[inline]
    pub(super) fn get_or_vacant(&mut self, hash: EngineHash) -> Result<u32, Option<Vacant>> {
        let h = self.mix(hash);
        let (entries, hasher) = (&self.entries, &self.hasher);
        let all = || entries.iter().enumerate().map(|(p, e)| (p as u32, hasher.hash_one(e.hash())));
        let found = self.index.find_or_vacant(h, |p| entries.get(p).hash() == hash.0, all);
        match found {
            Ok(p) => Ok(p),
            Err(_) if self.entries.len() as u32 > PosIndex::max_id() => Err(None),
            Err(v) => Err(Some(v)),
        }
    }

    /// Adds `hash -> block` where [`get_or_vacant`](Self::get_or_vacant) said.
    #[inline]
    pub(super) fn fill(&mut self, v: Vacant, hash: EngineHash, block: u32) {
        let p = self.entries.push(Entry { hash_lo: hash.0 as u32, hash_hi: (hash.0 >> 32) as u32, block });
        self.index.fill(v, p);
    }

    #[cfg(test)]
    /// Inserts `hash -> block` unless `hash` is there; false if it was (or the map is full).
    pub(super) fn insert(&mut self, hash: EngineHash, block: u32) -> bool {
        match self.get_or_vacant(hash) {
            Err(Some(v)) => {
                self.fill(v, hash, block);
                true
            }
            _ => false,
        }
    }

    #[inline]
    pub(super) fn block(&self, pos: u32) -> u32 {
        self.entries.get(pos).block
    }

    #[inline]
    pub(super) fn set_block(&mut self, pos: u32, block: u32) {
        self.entries.get_mut(pos).block = block;
    }

    /// Removes the entry at `pos` (positions of others may change).
    pub(super) fn remove(&mut self, pos: u32) {
        let hash = self.entries.get(pos).hash();
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.index.remove(hasher.hash_one(hash), pos, |p| hasher.hash_one(entries.get(p).hash()));
        let last = self.entries.pop().expect("an entry at pos");
        let last_pos = self.entries.len() as u32;
        if last_pos != pos {
            *self.entries.get_mut(pos) = last;
            self.index.rename(self.hasher.hash_one(last.hash()), last_pos, pos);
        }
    }

    /// Every `(hash, block)`, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (EngineHash, u32)> + '_ {
        self.entries.iter().map(|e| (EngineHash(e.hash()), e.block))
    }

    #[allow(dead_code)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.index.capacity_bytes() + self.entries.capacity_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn equals_a_hash_map_under_churn() {
        let mut b = Blocks::new(SeededState::default());
        let mut want: HashMap<u64, u32> = HashMap::new();
        let mut x = 99u64;
        for round in 0..40_000u32 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Hashes over the whole u64 range, few enough to repeat.
            let h = EngineHash(((x >> 33) % 3_000).wrapping_mul(0xD6E8_FEB8_6659_FD93));
            match (x >> 20) % 4 {
                0 | 1 => {
                    let fresh = !want.contains_key(&h.0);
                    assert_eq!(b.insert(h, round), fresh, "insert");
                    if fresh {
                        want.insert(h.0, round);
                    }
                }
                2 => {
                    if let Some(p) = b.get(h) {
                        b.set_block(p, round);
                        want.insert(h.0, round);
                    }
                }
                _ => {
                    let got = b.get(h);
                    assert_eq!(got.is_some(), want.remove(&h.0).is_some());
                    if let Some(p) = got {
                        b.remove(p);
                    }
                }
            }
            if round % 997 == 0 {
                assert_eq!(b.len(), want.len());
                for (k, v) in &want {
                    assert_eq!(b.get(EngineHash(*k)).map(|p| b.block(p)), Some(*v));
                }
            }
        }
        let mut all: Vec<_> = b.iter().map(|(h, v)| (h.0, v)).collect();
        all.sort_unstable();
        let mut w: Vec<_> = want.into_iter().collect();
        w.sort_unstable();
        assert_eq!(all, w);
    }
}
