//! One shard of the global map: block key -> the engines holding it.
//!
//! Memory is the constraint (<= 64 B per (block, engine) pair at fleet scale), and most keys
//! are held by exactly one engine (conversation tails) while a few are held by all (system
//! prompts). So a map value is one `u64` word: either the single holder inline, or an index
//! into an overflow slab of sorted holder lists. A map entry is 16 bytes either way.
//!
//! A holder carries a reference count: one engine can reach the same kvroute key through
//! several of its own block hashes (vLLM hashes extra keys such as multimodal inputs or the
//! LoRA path that kvroute's keys do not), and the engine holds the key while any does.

use super::hasher::SeededState;
use crate::types::BlockKey;
use std::collections::HashMap;

/// Bit 63 set: `low 32 bits` index `overflow`. Clear: inline holder, slot in the low 32
/// bits, reference count in bits 32..63.
#[derive(Clone, Copy)]
struct Word(u64);

const OVERFLOW: u64 = 1 << 63;
const MAX_REFS: u32 = (1 << 31) - 1;

impl Word {
    fn inline(slot: u32, refs: u32) -> Word {
        Word(u64::from(slot) | (u64::from(refs.min(MAX_REFS)) << 32))
    }
    fn overflow(idx: u32) -> Word {
        Word(OVERFLOW | u64::from(idx))
    }
    fn slot(self) -> u32 {
        self.0 as u32
    }
    fn refs(self) -> u32 {
        ((self.0 & !OVERFLOW) >> 32) as u32
    }
    fn is_overflow(self) -> bool {
        self.0 & OVERFLOW != 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    slot: u32,
    refs: u32,
}

#[derive(Default)]
pub(super) struct Shard {
    map: HashMap<BlockKey, Word, SeededState>,
    /// Holder lists sorted by slot, each with >= 2 holders; `free` recycles emptied ones.
    overflow: Vec<Vec<Holder>>,
    free: Vec<u32>,
}

impl Shard {
    /// One more reference from `slot` to `key`.
    pub(super) fn add(&mut self, key: BlockKey, slot: u32) {
        let Some(word) = self.map.get(&key).copied() else {
            self.map.insert(key, Word::inline(slot, 1));
            return;
        };
        if !word.is_overflow() {
            if word.slot() == slot {
                self.map.insert(key, Word::inline(slot, word.refs().saturating_add(1)));
                return;
            }
            let mut list = vec![Holder { slot: word.slot(), refs: word.refs() }, Holder { slot, refs: 1 }];
            list.sort_unstable_by_key(|h| h.slot);
            let idx = self.alloc(list);
            self.map.insert(key, Word::overflow(idx));
            return;
        }
        let list = &mut self.overflow[word.slot() as usize];
        match list.binary_search_by_key(&slot, |h| h.slot) {
            Ok(i) => list[i].refs = list[i].refs.saturating_add(1).min(MAX_REFS),
            Err(i) => list.insert(i, Holder { slot, refs: 1 }),
        }
    }

    /// One reference fewer; the engine stops holding `key` when its count reaches zero.
    pub(super) fn release(&mut self, key: BlockKey, slot: u32) {
        let Some(word) = self.map.get(&key).copied() else { return };
        if !word.is_overflow() {
            if word.slot() == slot {
                match word.refs() {
                    0 | 1 => drop(self.map.remove(&key)),
                    n => drop(self.map.insert(key, Word::inline(slot, n - 1))),
                }
            }
            return;
        }
        let idx = word.slot();
        let list = &mut self.overflow[idx as usize];
        let Ok(i) = list.binary_search_by_key(&slot, |h| h.slot) else { return };
        list[i].refs -= 1;
        if list[i].refs > 0 {
            return;
        }
        list.remove(i);
        if let [only] = list[..] {
            self.overflow[idx as usize] = Vec::new();
            self.free.push(idx);
            self.map.insert(key, Word::inline(only.slot, only.refs));
        }
    }

    /// Calls `f` with every slot holding `key`; false if nobody does.
    #[inline]
    pub(super) fn for_each_holder(&self, key: BlockKey, mut f: impl FnMut(u32)) -> bool {
        let Some(word) = self.map.get(&key).copied() else { return false };
        if word.is_overflow() {
            for h in &self.overflow[word.slot() as usize] {
                f(h.slot);
            }
        } else {
            f(word.slot());
        }
        true
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    fn alloc(&mut self, list: Vec<Holder>) -> u32 {
        if let Some(idx) = self.free.pop() {
            self.overflow[idx as usize] = list;
            return idx;
        }
        self.overflow.push(list);
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
        s.add(k, 7);
        s.add(k, 7);
        assert_eq!(holders(&s, 1), vec![7]);
        s.add(k, 3);
        s.add(k, 9);
        assert_eq!(holders(&s, 1), vec![3, 7, 9]);
        s.release(k, 7);
        assert_eq!(holders(&s, 1), vec![3, 7, 9], "7 still has one reference");
        s.release(k, 7);
        s.release(k, 9);
        assert_eq!(holders(&s, 1), vec![3]);
        assert_eq!(s.free, vec![0]);
        s.add(BlockKey(2), 1);
        s.add(BlockKey(2), 2);
        assert!(s.free.is_empty(), "slab slot recycled");
        s.release(k, 3);
        s.release(k, 3);
        assert!(!s.for_each_holder(k, |_| {}));
        assert_eq!(s.len(), 1);
    }
}
