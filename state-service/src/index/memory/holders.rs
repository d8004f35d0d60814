//! One shard of the global map: block key -> the engines holding it.
//!
//! Memory is the constraint (<= 64 B per (block, engine) pair at fleet scale), and most keys
//! are held by exactly one engine (conversation tails) while a few are held by all (system
//! prompts). So a map value is one `u64` word: either the single holder's slot inline, or an
//! index into an overflow slab of slot bitmasks. A map entry is 16 bytes either way, and a
//! lookup of a widely shared key ORs one mask word per 64 slots instead of walking a list:
//! that is what keeps a 512-block walk over 64 engines in tens of microseconds.
//!
//! A shard records presence only. One engine reaching the same key through several of its
//! own block hashes is counted by the engine (see `memory.rs`), not here.

use crate::hasher::SeededState;
use crate::types::BlockKey;
use std::collections::HashMap;

/// Bit 63 set: the low 32 bits index `overflow`. Clear: the only holder's slot.
#[derive(Clone, Copy)]
struct Word(u64);

const OVERFLOW: u64 = 1 << 63;

impl Word {
    fn low(self) -> u32 {
        self.0 as u32
    }
    fn is_overflow(self) -> bool {
        self.0 & OVERFLOW != 0
    }
}

#[derive(Default)]
pub(super) struct Shard {
    map: HashMap<BlockKey, Word, SeededState>,
    /// Slot bitmasks with >= 2 bits set; `free` recycles emptied ones.
    overflow: Vec<Vec<u64>>,
    free: Vec<u32>,
}

fn set_bit(mask: &mut Vec<u64>, slot: u32) -> bool {
    let (w, b) = (slot as usize / 64, slot % 64);
    if mask.len() <= w {
        mask.resize(w + 1, 0);
    }
    let was = mask[w] & (1 << b) != 0;
    mask[w] |= 1 << b;
    !was
}

impl Shard {
    /// Marks `slot` as holding `key`; false if it already did.
    pub(super) fn add(&mut self, key: BlockKey, slot: u32) -> bool {
        let Some(word) = self.map.get(&key).copied() else {
            self.map.insert(key, Word(u64::from(slot)));
            return true;
        };
        if word.is_overflow() {
            return set_bit(&mut self.overflow[word.low() as usize], slot);
        }
        if word.low() == slot {
            return false;
        }
        let mut mask = Vec::new();
        set_bit(&mut mask, word.low());
        set_bit(&mut mask, slot);
        let idx = self.alloc(mask);
        self.map.insert(key, Word(OVERFLOW | u64::from(idx)));
        true
    }

    /// `slot` no longer holds `key` (a no-op if it did not).
    pub(super) fn release(&mut self, key: BlockKey, slot: u32) {
        let Some(word) = self.map.get(&key).copied() else { return };
        if !word.is_overflow() {
            if word.low() == slot {
                self.map.remove(&key);
            }
            return;
        }
        let idx = word.low() as usize;
        let mask = &mut self.overflow[idx];
        if let Some(w) = mask.get_mut(slot as usize / 64) {
            *w &= !(1 << (slot % 64));
        }
        let total: u32 = mask.iter().map(|w| w.count_ones()).sum();
        if total > 1 {
            return;
        }
        let only = mask.iter().enumerate().find(|(_, w)| **w != 0).map(|(i, w)| i as u32 * 64 + w.trailing_zeros());
        self.overflow[idx] = Vec::new();
        self.free.push(idx as u32);
        match only {
            Some(s) => drop(self.map.insert(key, Word(u64::from(s)))),
            None => drop(self.map.remove(&key)),
        }
    }

    /// ORs the holders of `key` into `mask` (slots beyond it are ignored); false if none.
    #[inline]
    pub(super) fn holders_into(&self, key: BlockKey, mask: &mut [u64]) -> bool {
        let Some(word) = self.map.get(&key).copied() else { return false };
        if word.is_overflow() {
            for (m, w) in mask.iter_mut().zip(&self.overflow[word.low() as usize]) {
                *m |= w;
            }
        } else if let Some(m) = mask.get_mut(word.low() as usize / 64) {
            *m |= 1 << (word.low() % 64);
        }
        true
    }

    /// Calls `f` with every slot holding `key`; false if nobody does.
    pub(super) fn for_each_holder(&self, key: BlockKey, mut f: impl FnMut(u32)) -> bool {
        let Some(word) = self.map.get(&key).copied() else { return false };
        if !word.is_overflow() {
            f(word.low());
            return true;
        }
        for (i, &w) in self.overflow[word.low() as usize].iter().enumerate() {
            let mut bits = w;
            while bits != 0 {
                f(i as u32 * 64 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        true
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    fn alloc(&mut self, mask: Vec<u64>) -> u32 {
        if let Some(idx) = self.free.pop() {
            self.overflow[idx as usize] = mask;
            return idx;
        }
        self.overflow.push(mask);
        (self.overflow.len() - 1) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holders(s: &Shard, k: u64) -> Vec<u32> {
        let mut v = Vec::new();
        s.for_each_holder(BlockKey(k), |x| v.push(x));
        v
    }

    #[test]
    fn inline_overflow_and_back() {
        let mut s = Shard::default();
        let k = BlockKey(1);
        assert!(s.add(k, 7));
        assert!(!s.add(k, 7));
        assert_eq!(holders(&s, 1), vec![7]);
        assert!(s.add(k, 3));
        assert!(s.add(k, 130));
        assert_eq!(holders(&s, 1), vec![3, 7, 130]);
        let mut mask = [0u64; 2];
        assert!(s.holders_into(k, &mut mask[..1]));
        assert_eq!(mask, [(1 << 3) | (1 << 7), 0], "slots past the mask are ignored");
        s.release(k, 7);
        s.release(k, 130);
        assert_eq!(holders(&s, 1), vec![3]);
        assert_eq!(s.free, vec![0]);
        s.add(BlockKey(2), 1);
        s.add(BlockKey(2), 2);
        assert!(s.free.is_empty(), "slab slot recycled");
        s.release(k, 3);
        s.release(k, 3);
        assert!(!s.holders_into(k, &mut mask));
        assert!(!s.for_each_holder(k, |_| {}));
        assert_eq!(s.len(), 1);
    }
}
