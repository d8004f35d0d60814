//! One shard of the global table: block keys interned to small slot numbers, and per slot
//! the engines holding that key.
//!
//! Layout (12 bytes a key plus 4 / load of index, ~18 B for a key one engine holds):
//! - `slots`: a dense [`Chunked`] array of `Slot { key, holders }` (12 bytes, packed). A
//!   slot's number is stable while any engine holds its key, so engine maps store it (4
//!   bytes) instead of the 8-byte key. Freed slots are chained into a free list and reused.
//! - `index`: an [`IdTable`] from the key's hash to its slot.
//! - `holders` is one `u32`: below [`OVERFLOW`] the only holder's engine slot, inline (most
//!   keys: conversation tails); at or above it an index into `sets`, where a key held by
//!   several engines keeps them as a sorted list of engine slots or, once that list would be
//!   larger than a bitmask over slots, as the bitmask. A prefix lookup over keys every engine
//!   holds ANDs one mask word per 64 engines per key.
//!
//! A shard records presence only. One engine reaching the same key through several of its
//! own block hashes is counted by the engine (see `memory.rs`), not here.

use super::table::{Chunked, Grown, IdTable};
use crate::types::BlockKey;

/// Slot numbers within one shard: 24 bits (16.7M keys a shard).
pub(super) const SLOT_BITS: u32 = 24;
type SlotIndex = IdTable<SLOT_BITS>;

/// `holders` values at or above this index `sets`; below it they are the only holder.
const OVERFLOW: u32 = 1 << 31;
/// `holders` of a slot on the free list (its key field then links the list).
const FREE: u32 = u32::MAX;
const NO_SLOT: u32 = u32::MAX;

#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Slot {
    // The key as two halves: a `u64` field would pad the slot to 16 bytes.
    key_lo: u32,
    key_hi: u32,
    holders: u32,
}

impl Slot {
    fn key(&self) -> u64 {
        u64::from(self.key_lo) | (u64::from(self.key_hi) << 32)
    }
}

/// The engines holding a key, as a lookup reads them.
#[derive(Clone, Copy, Debug)]
pub(super) enum Holders<'a> {
    One(u32),
    /// Sorted, at least one.
    List(&'a [u32]),
    /// Bit `s % 64` of word `s / 64` for engine slot `s`; at least one set.
    Mask(&'a [u64]),
}

impl Holders<'_> {
    pub(super) fn count(&self) -> usize {
        match self {
            Holders::One(_) => 1,
            Holders::List(l) => l.len(),
            Holders::Mask(m) => m.iter().map(|w| w.count_ones() as usize).sum(),
        }
    }

    /// Every engine slot, ascending.
    pub(super) fn slots(&self) -> Vec<u32> {
        match self {
            Holders::One(s) => vec![*s],
            Holders::List(l) => l.to_vec(),
            Holders::Mask(m) => {
                let mut l = Vec::with_capacity(self.count());
                for (i, &w) in m.iter().enumerate() {
                    let mut bits = w;
                    while bits != 0 {
                        l.push(i as u32 * 64 + bits.trailing_zeros());
                        bits &= bits - 1;
                    }
                }
                l
            }
        }
    }

    /// The largest engine slot.
    pub(super) fn max(&self) -> u32 {
        match self {
            Holders::One(s) => *s,
            Holders::List(l) => l.last().copied().unwrap_or(0),
            Holders::Mask(m) => {
                let (w, bits) = m.iter().enumerate().rev().find(|(_, w)| **w != 0).map_or((0, 1), |(i, w)| (i, *w));
                w as u32 * 64 + 63 - bits.leading_zeros()
            }
        }
    }
}

/// The holders of a key held by several engines (see the module docs for when each form).
enum Set {
    /// A one-word mask (every holder below 64), kept inline: a lookup reads no further.
    Word(u64),
    /// Sorted.
    List(Vec<u32>),
    Mask(Vec<u64>),
}

fn mask_words(max_slot: u32) -> usize {
    max_slot as usize / 64 + 1
}

fn mask_of(slots: &[u32]) -> Set {
    let words = mask_words(slots.last().copied().unwrap_or(0));
    let mut m = vec![0u64; words];
    for &s in slots {
        m[s as usize / 64] |= 1 << (s % 64);
    }
    if words == 1 {
        Set::Word(m[0])
    } else {
        Set::Mask(m)
    }
}

impl Set {
    fn view(&self) -> Holders<'_> {
        match self {
            Set::Word(w) => Holders::Mask(std::slice::from_ref(w)),
            Set::List(l) => Holders::List(l),
            Set::Mask(m) => Holders::Mask(m),
        }
    }

    /// Adds `engine`; false if it was there. A list grows into a mask once the mask is at
    /// most half its size; a mask that would need more words than it has holders becomes a
    /// list (the same bound as [`release`](Self::release)).
    fn add(&mut self, engine: u32) -> bool {
        let (w, bit) = (engine as usize / 64, 1u64 << (engine % 64));
        match self {
            Set::Word(m) if w == 0 => {
                let was = *m & bit != 0;
                *m |= bit;
                !was
            }
            Set::Mask(m) if w < m.len() => {
                let was = m[w] & bit != 0;
                m[w] |= bit;
                !was
            }
            Set::Word(_) | Set::Mask(_) => {
                // Past the mask's words: grow it, or list the holders if that is smaller.
                let mut slots = self.view().slots();
                slots.push(engine);
                *self = if slots.len() < w + 1 { Set::List(slots) } else { mask_of(&slots) };
                true
            }
            Set::List(l) => {
                let Err(at) = l.binary_search(&engine) else { return false };
                l.insert(at, engine);
                if l.len() > 2 * mask_words(l[l.len() - 1]) {
                    *self = mask_of(l);
                }
                true
            }
        }
    }

    /// Removes `engine` (a no-op if absent). A mask with fewer holders than words becomes a
    /// list again (half the list-to-mask bound, so a key does not flip at the boundary).
    fn release(&mut self, engine: u32) {
        let (w, bit) = (engine as usize / 64, 1u64 << (engine % 64));
        match self {
            Set::Word(m) => {
                if w == 0 {
                    *m &= !bit;
                }
            }
            Set::List(l) => {
                if let Ok(at) = l.binary_search(&engine) {
                    l.remove(at);
                }
            }
            Set::Mask(m) => {
                if let Some(x) = m.get_mut(w) {
                    *x &= !bit;
                }
                let count: usize = m.iter().map(|w| w.count_ones() as usize).sum();
                if count < m.len() {
                    *self = Set::List(Holders::Mask(m).slots());
                }
            }
        }
    }

    /// The holders below 64, as one mask word.
    fn low(&self) -> u64 {
        match self {
            Set::Word(w) => *w,
            Set::Mask(m) => m.first().copied().unwrap_or(0),
            Set::List(l) => l.iter().take_while(|&&s| s < 64).fold(0, |m, s| m | 1 << s),
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Set::Word(_) => 0,
            Set::List(l) => l.capacity() * 4,
            Set::Mask(m) => m.capacity() * 8,
        }
    }
}

pub(super) struct Shard {
    index: SlotIndex,
    slots: Chunked<Slot>,
    /// Head of the free-slot list.
    free: u32,
    sets: Vec<Set>,
    /// Per set, its holders below 64 as one word: what a walk over at most 64 engines reads.
    low: Vec<u64>,
    free_sets: Vec<u32>,
    len: usize,
}

/// The table's hash of a key, given the index-wide mixed hash `h` (whose top bits chose the
/// shard, so they are shifted out).
#[inline]
fn table_hash(h: u64, shard_bits: u32) -> u64 {
    h << shard_bits
}

impl Shard {
    pub(super) fn new() -> Self {
        Shard { index: SlotIndex::default(), slots: Chunked::default(), free: NO_SLOT, sets: Vec::new(), low: Vec::new(), free_sets: Vec::new(), len: 0 }
    }

    /// Distinct keys held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The slot of `key`, whose mixed hash is `h`.
    #[inline]
    pub(super) fn find(&self, key: BlockKey, h: u64, shard_bits: u32) -> Option<u32> {
        self.index.find(table_hash(h, shard_bits), |s| self.slots.get(s).key() == key.0)
    }

    /// The holders word of `key` (see [`view`](Self::view)), whose mixed hash is `h`.
    #[inline]
    pub(super) fn find_holders(&self, key: BlockKey, h: u64, shard_bits: u32) -> Option<u32> {
        let mut holders = 0;
        self.index.find(table_hash(h, shard_bits), |s| {
            let slot = self.slots.get(s);
            holders = slot.holders;
            slot.key() == key.0
        })?;
        Some(holders)
    }

    /// The engines a holders word names.
    #[inline]
    pub(super) fn view(&self, holders: u32) -> Holders<'_> {
        if holders < OVERFLOW {
            Holders::One(holders)
        } else {
            self.sets[(holders - OVERFLOW) as usize].view()
        }
    }

    /// The engines below 64 a holders word names, as one mask word.
    #[inline]
    pub(super) fn word0(&self, holders: u32) -> u64 {
        if holders < OVERFLOW {
            1u64.checked_shl(holders).unwrap_or(0)
        } else {
            self.low.get((holders - OVERFLOW) as usize).copied().unwrap_or(0)
        }
    }

    /// [`word0`](Self::word0) of `key`'s holders (mixed hash `h`); 0 if nobody holds it.
    #[inline]
    pub(super) fn find_word0(&self, key: BlockKey, h: u64, shard_bits: u32) -> u64 {
        self.find_holders(key, h, shard_bits).map_or(0, |w| self.word0(w))
    }

    pub(super) fn key(&self, slot: u32) -> BlockKey {
        BlockKey(self.slots.get(slot).key())
    }

    #[cfg(test)]
    pub(super) fn holders(&self, slot: u32) -> Holders<'_> {
        self.view(self.slots.get(slot).holders)
    }

    /// Marks `engine` as holding `key` (mixed hash `h`, `mix` computes it for any key):
    /// the key's slot, and whether the engine newly holds it. None when the shard is full.
    /// Whether the next new key grows the index (see [`grown`](Self::grown)).
    pub(super) fn full(&self) -> bool {
        self.index.full()
    }

    /// The index grown for more keys, built without changing this shard: the caller holds
    /// it read-locked against other writers only (an upgradable read), so lookups go on
    /// while the slots are rehashed, then [`install`](Self::install)s it write-locked.
    pub(super) fn grown(&self, shard_bits: u32, mix: impl Fn(u64) -> u64) -> Grown {
        let slots = &self.slots;
        self.index.grown(&|| {
            let live = slots.iter().enumerate().filter(|(_, s)| s.holders != FREE);
            live.map(|(i, s)| (i as u32, table_hash(mix(s.key()), shard_bits)))
        })
    }

    pub(super) fn install(&mut self, g: Grown) {
        self.index.install(g);
    }

    pub(super) fn add(
        &mut self,
        key: BlockKey,
        h: u64,
        engine: u32,
        shard_bits: u32,
        mix: impl Fn(u64) -> u64,
    ) -> Option<(u32, bool)> {
        let slots = &self.slots;
        let all = || {
            let live = slots.iter().enumerate().filter(|(_, s)| s.holders != FREE);
            live.map(|(i, s)| (i as u32, table_hash(mix(s.key()), shard_bits)))
        };
        let found = self.index.find_or_vacant(table_hash(h, shard_bits), |s| slots.get(s).key() == key.0, all);
        let vacant = match found {
            Ok(slot) => return Some((slot, self.add_holder(slot, engine))),
            Err(v) => v,
        };
        let slot = self.alloc_slot()?;
        let holders = if engine < OVERFLOW { engine } else { self.alloc_set(Set::List(vec![engine])) };
        *self.slots.get_mut(slot) = Slot { key_lo: key.0 as u32, key_hi: (key.0 >> 32) as u32, holders };
        self.index.fill(vacant, slot);
        self.len += 1;
        Some((slot, true))
    }

    fn add_holder(&mut self, slot: u32, engine: u32) -> bool {
        let h = self.slots.get(slot).holders;
        if h >= OVERFLOW {
            let idx = (h - OVERFLOW) as usize;
            let added = self.sets[idx].add(engine);
            self.low[idx] = self.sets[idx].low();
            return added;
        }
        if h == engine {
            return false;
        }
        let pair = [h.min(engine), h.max(engine)];
        // Two holders: a list unless both fit one mask word.
        let set = if mask_words(pair[1]) == 1 { mask_of(&pair) } else { Set::List(pair.to_vec()) };
        let idx = self.alloc_set(set);
        self.slots.get_mut(slot).holders = idx;
        true
    }

    /// `engine` no longer holds the key in `slot` (a no-op if it did not); the last holder
    /// frees the slot. `mix` as for [`add`](Self::add).
    pub(super) fn release(&mut self, slot: u32, engine: u32, shard_bits: u32, mix: impl Fn(u64) -> u64) {
        let h = self.slots.get(slot).holders;
        if h == FREE {
            return;
        }
        if h < OVERFLOW {
            if h == engine {
                self.free_slot(slot, shard_bits, mix);
            }
            return;
        }
        let idx = (h - OVERFLOW) as usize;
        let set = &mut self.sets[idx];
        set.release(engine);
        self.low[idx] = set.low();
        let view = set.view();
        let count = view.count();
        let only = (count == 1).then(|| view.max());
        match (count, only) {
            (0, _) => {
                self.drop_set(idx as u32);
                self.free_slot(slot, shard_bits, mix);
            }
            (1, Some(s)) if s < OVERFLOW => {
                self.drop_set(idx as u32);
                self.slots.get_mut(slot).holders = s;
            }
            _ => {}
        }
    }

    fn alloc_slot(&mut self) -> Option<u32> {
        if self.free != NO_SLOT {
            let slot = self.free;
            self.free = self.slots.get(slot).key_lo;
            return Some(slot);
        }
        if self.slots.len() as u32 > SlotIndex::max_id() {
            return None;
        }
        Some(self.slots.push(Slot::default()))
    }

    fn free_slot(&mut self, slot: u32, shard_bits: u32, mix: impl Fn(u64) -> u64) {
        let key = self.slots.get(slot).key();
        let slots = &self.slots;
        self.index.remove(table_hash(mix(key), shard_bits), slot, |s| table_hash(mix(slots.get(s).key()), shard_bits));
        *self.slots.get_mut(slot) = Slot { key_lo: self.free, key_hi: 0, holders: FREE };
        self.free = slot;
        self.len -= 1;
    }

    fn alloc_set(&mut self, set: Set) -> u32 {
        let low = set.low();
        if let Some(idx) = self.free_sets.pop() {
            self.sets[idx as usize] = set;
            self.low[idx as usize] = low;
            return OVERFLOW + idx;
        }
        self.sets.push(set);
        self.low.push(low);
        OVERFLOW + (self.sets.len() - 1) as u32
    }

    fn drop_set(&mut self, idx: u32) {
        self.sets[idx as usize] = Set::List(Vec::new());
        self.low[idx as usize] = 0;
        self.free_sets.push(idx);
    }

    /// Where a probe for a key with mixed hash `h` starts, given a (maybe stale)
    /// [`raw_parts`](Self::raw_parts): for a prefetch without the lock.
    #[inline]
    pub(super) fn home_addr(parts: (usize, usize), h: u64, shard_bits: u32) -> usize {
        SlotIndex::home_addr(parts.0, parts.1, table_hash(h, shard_bits))
    }

    /// The index's bucket array (address, length), for prefetch hints.
    pub(super) fn raw_parts(&self) -> (usize, usize) {
        self.index.raw_parts()
    }

    /// Heap bytes of this shard's tables (for tests and the benchmark's breakdown).
    #[allow(dead_code)]
    pub(super) fn heap_bytes(&self) -> usize {
        let sets: usize = self.sets.iter().map(Set::heap_bytes).sum();
        self.index.capacity_bytes()
            + self.slots.capacity_bytes()
            + self.sets.capacity() * std::mem::size_of::<Set>()
            + self.low.capacity() * 8
            + sets
            + self.free_sets.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(x: u64) -> u64 {
        x.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn holders(s: &Shard, k: u64) -> Vec<u32> {
        let Some(slot) = s.find(BlockKey(k), mix(k), 6) else { return Vec::new() };
        s.holders(slot).slots()
    }

    fn add(s: &mut Shard, k: u64, e: u32) -> (u32, bool) {
        s.add(BlockKey(k), mix(k), e, 6, mix).unwrap()
    }

    #[test]
    fn inline_list_mask_and_back() {
        let mut s = Shard::new();
        let (slot, new) = add(&mut s, 1, 7);
        assert!(new);
        assert_eq!(add(&mut s, 1, 7), (slot, false));
        assert_eq!(holders(&s, 1), vec![7]);
        assert!(matches!(s.holders(slot), Holders::One(7)));
        assert!(add(&mut s, 1, 3).1);
        assert!(matches!(s.holders(slot), Holders::Mask(&[m]) if m == (1 << 3) | (1 << 7)), "one inline word");
        assert!(add(&mut s, 1, 130).1);
        assert_eq!(holders(&s, 1), vec![3, 7, 130]);
        assert_eq!(s.holders(slot).max(), 130);
        assert_eq!(s.holders(slot).count(), 3);
        // Sparse high slots stay a list.
        let (far, _) = add(&mut s, 2, 5000);
        add(&mut s, 2, 9000);
        assert!(matches!(s.holders(far), Holders::List(&[5000, 9000])));
        s.release(slot, 7, 6, mix);
        s.release(slot, 130, 6, mix);
        assert_eq!(holders(&s, 1), vec![3]);
        assert!(matches!(s.holders(slot), Holders::One(3)), "one holder goes inline again");
        assert_eq!(s.free_sets.len(), 1);
        add(&mut s, 3, 1);
        add(&mut s, 3, 2);
        assert!(s.free_sets.is_empty(), "set recycled");
        s.release(slot, 3, 6, mix);
        s.release(slot, 3, 6, mix);
        assert!(holders(&s, 1).is_empty());
        assert_eq!(s.len(), 2);
        // The freed slot is reused.
        assert_eq!(add(&mut s, 4, 9).0, slot);
        assert_eq!(s.key(slot), BlockKey(4));
    }

    #[test]
    fn huge_engine_slots_are_listed() {
        let mut s = Shard::new();
        let (slot, _) = add(&mut s, 1, u32::MAX);
        assert!(matches!(s.holders(slot), Holders::List(&[u32::MAX])));
        add(&mut s, 1, 2);
        s.release(slot, u32::MAX, 6, mix);
        assert!(matches!(s.holders(slot), Holders::One(2)));
        add(&mut s, 1, u32::MAX - 1);
        s.release(slot, 2, 6, mix);
        assert!(matches!(s.holders(slot), Holders::List(&[x]) if x == u32::MAX - 1));
        s.release(slot, u32::MAX - 1, 6, mix);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn many_holders_become_a_mask_and_shrink_back() {
        let mut s = Shard::new();
        let (slot, _) = add(&mut s, 1, 0);
        for e in (64..1000).step_by(7) {
            add(&mut s, 1, e);
        }
        assert!(matches!(s.holders(slot), Holders::Mask(m) if m.len() == 16));
        assert!(matches!(s.sets[0], Set::Mask(_)));
        for e in (64..1000).step_by(7).skip(3) {
            s.release(slot, e, 6, mix);
        }
        assert_eq!(holders(&s, 1), vec![0, 64, 71, 78]);
        assert!(matches!(s.holders(slot), Holders::List(_)));
    }
}
