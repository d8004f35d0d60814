//! The prefix walk behind [`MemoryIndex`]'s `match_prefix` (the parent module's "Lookups"):
//! the first key's holders start the set of matching engines, each next key ANDs its
//! holders in, and an engine leaving the set has matched up to there.

use super::holders::{Holders, Shard};
use super::{MemoryIndex, SHARDS, SHARD_BITS};
use crate::index::PrefixMatch;
use crate::types::{BlockKey, EngineSlot};
use parking_lot::RwLockReadGuard;

/// Engines still matching during a walk, as a bitset over engine slots (the registry numbers
/// them densely): on the stack up to 1,024 engines.
const STACK_WORDS: usize = 16;

/// Every engine holding a leading run of `keys`, with the run's length (all GPU: the caller
/// splits tiers).
pub(super) fn match_prefix(index: &MemoryIndex, keys: &[BlockKey]) -> Vec<PrefixMatch> {
    let Some(&first) = keys.first() else { return Vec::new() };
    let h = index.mix(first.0);
    let s = MemoryIndex::shard_of(h);
    let shard = index.shards[s].read();
    let Some(word) = shard.find_holders(first, h, SHARD_BITS) else { return Vec::new() };
    let holders = shard.view(word);
    let words = holders.max() as usize / 64 + 1;
    let mut walk = Walk { index, keys, guards: [const { None }; SHARDS], out: Vec::with_capacity(holders.count()) };
    if words == 1 {
        let active = shard.word0(word);
        walk.guards[s] = Some(shard);
        walk.one_word(active);
    } else {
        let (mut stack, mut heap) = ([0u64; STACK_WORDS], Vec::new());
        let active: &mut [u64] = if words <= STACK_WORDS {
            &mut stack[..words]
        } else {
            heap.resize(words, 0);
            &mut heap
        };
        let alive = retain(active, Some(holders), true, |_| {});
        walk.guards[s] = Some(shard);
        walk.words(active, alive);
    }
    let Walk { guards, out, .. } = walk;
    drop(guards);
    out
}

/// One prefix walk: the shard read locks it holds, and the matches so far. Each key costs
/// a hash, a probe of its shard's index (one bucket, one slot) and an AND: the walk is bound
/// by instructions, not memory, so it is one plain pass (no batching or prefetching, which
/// measured no faster).
struct Walk<'a> {
    index: &'a MemoryIndex,
    keys: &'a [BlockKey],
    guards: [Option<RwLockReadGuard<'a, Shard>>; SHARDS],
    out: Vec<PrefixMatch>,
}

impl<'a> Walk<'a> {
    /// The shard of a key with mixed hash `h`, read-locked.
    #[inline]
    fn shard<'g>(guards: &'g mut [Option<RwLockReadGuard<'a, Shard>>; SHARDS], index: &'a MemoryIndex, h: u64) -> &'g Shard {
        let s = MemoryIndex::shard_of(h);
        // Recursive: this pick already holds a shard (see the module docs).
        guards[s].get_or_insert_with(|| index.shards[s].lock.read_recursive())
    }

    /// The walk when every candidate's slot is below 64: `active` is one word.
    fn one_word(&mut self, mut active: u64) {
        let (index, keys) = (self.index, self.keys);
        for (i, key) in keys.iter().enumerate().skip(1) {
            let h = index.mix(key.0);
            let keep = Self::shard(&mut self.guards, index, h).find_word0(*key, h, SHARD_BITS);
            let mut gone = active & !keep;
            if gone == 0 {
                continue;
            }
            active &= keep;
            while gone != 0 {
                self.out.push(matched(gone.trailing_zeros(), i));
                gone &= gone - 1;
            }
            if active == 0 {
                return;
            }
        }
        while active != 0 {
            self.out.push(matched(active.trailing_zeros(), keys.len()));
            active &= active - 1;
        }
    }

    /// The walk over any number of mask words.
    fn words(&mut self, active: &mut [u64], mut alive: usize) {
        let (index, keys) = (self.index, self.keys);
        let out = &mut self.out;
        for (i, key) in keys.iter().enumerate().skip(1) {
            let h = index.mix(key.0);
            let shard = Self::shard(&mut self.guards, index, h);
            let holders = shard.find_holders(*key, h, SHARD_BITS).map(|w| shard.view(w));
            alive -= retain(active, holders, false, |slot| out.push(matched(slot, i)));
            if alive == 0 {
                return;
            }
        }
        retain(active, None, false, |slot| out.push(matched(slot, keys.len())));
    }
}

/// `active &= holders` (`init`: `active = holders`), calling `dropped` for every engine that
/// was active and is not kept; returns how many were dropped (`init`: how many are active).
#[inline]
fn retain(active: &mut [u64], holders: Option<Holders<'_>>, init: bool, dropped: impl FnMut(u32)) -> usize {
    match holders {
        None => retain_words(active, init, dropped, |_| 0),
        Some(Holders::One(s)) => {
            let (at, bit) = (s as usize / 64, 1u64 << (s % 64));
            retain_words(active, init, dropped, |w| if w == at { bit } else { 0 })
        }
        Some(Holders::Mask(m)) => {
            // Most keys of a shared prefix drop nobody: check that first, branch-free.
            let n = active.len().min(m.len());
            let gone = active[..n].iter().zip(&m[..n]).fold(0, |g, (a, k)| g | (a & !k));
            if !init && gone | active[n..].iter().fold(0, |g, a| g | a) == 0 {
                return 0;
            }
            retain_words(active, init, dropped, |w| m.get(w).copied().unwrap_or(0))
        }
        Some(Holders::List(l)) => {
            let (mut stack, mut heap) = ([0u64; STACK_WORDS], Vec::new());
            let bits: &mut [u64] = if active.len() <= STACK_WORDS {
                &mut stack[..active.len()]
            } else {
                heap.resize(active.len(), 0);
                &mut heap
            };
            for &s in l {
                if let Some(b) = bits.get_mut(s as usize / 64) {
                    *b |= 1 << (s % 64);
                }
            }
            retain_words(active, init, dropped, |w| bits[w])
        }
    }
}

#[inline(always)]
fn retain_words(active: &mut [u64], init: bool, mut dropped: impl FnMut(u32), word: impl Fn(usize) -> u64) -> usize {
    let mut n = 0;
    for (w, a) in active.iter_mut().enumerate() {
        let keep = word(w);
        if init {
            *a = keep;
            n += keep.count_ones() as usize;
            continue;
        }
        let mut gone = *a & !keep;
        *a &= keep;
        while gone != 0 {
            dropped(w as u32 * 64 + gone.trailing_zeros());
            gone &= gone - 1;
            n += 1;
        }
    }
    n
}

fn matched(slot: u32, n: usize) -> PrefixMatch {
    PrefixMatch { engine: EngineSlot(slot), matched_blocks: n as u32, gpu_blocks: n as u32 }
}
