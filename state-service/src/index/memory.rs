//! The embedded in-memory [`KvIndex`]: microsecond prefix lookups for picks.
//!
//! Two structures:
//! - per engine, `EngineHash -> (BlockKey, tiers)`: vLLM's `BlockRemoved` names blocks by
//!   engine hash only, and a `BlockStored` names its parent by engine hash, so this map turns
//!   vLLM's hashes into kvroute keys. A block may sit in several tiers (GPU, CPU, storage) at
//!   once; it stays indexed while any tier holds it.
//! - global, sharded: `BlockKey -> engines holding it` (see `holders.rs` for the layout).
//!
//! Cost: a store or remove is O(1) per block (one engine-map and one shard operation); a
//! lookup is O(keys walked x slot words), stopping at the first key no candidate holds;
//! `clear_engine` is O(blocks of that engine).
//!
//! Key roots. An engine's chains start at `KeyRoot::new(lora_name.unwrap_or(model),
//! cache_salt.unwrap_or(""))`, where `model` is the engine's configured model and `lora_name`
//! / `cache_salt` come from the event. The matching convention on the request side: a client
//! addresses a LoRA adapter by sending its name as `model`, and the filter computes keys with
//! `KeyRoot::new(request.model, cache_salt)`. So a request for adapter "sql-lora" matches
//! blocks vLLM stored with `lora_name = "sql-lora"`, and a base-model request matches blocks
//! stored without a LoRA.
//!
//! Keys are computed once, when a block is stored, from its parent's key (the engine map) and
//! its tokens; a store of a hash the engine already holds only adds a tier. Only full blocks
//! of the configured size get keys (vLLM may also report one partial block).
//!
//! Concurrency: a writer (one ingest thread per engine) takes its engine's mutex, then one
//! shard write lock per block; a pick takes only shard read locks, one per key it walks.
//! Lock order is always engine -> shard, so there is no deadlock, and a pick never waits for
//! a whole batch. A pick may see a batch half applied, which is harmless for routing.

mod holders;
pub mod snapshot;

use super::{ApplyStats, KvIndex, PrefixMatch};
use crate::types::{BlockKey, EngineHash, EngineSlot, KvEvent, Tier};
use crate::hasher::SeededState;
use holders::Shard;
use kvroute_core::keys::{extend_token_keys, KeyRoot};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const SHARDS: usize = 64;

#[derive(Clone, Copy)]
struct Entry {
    key: BlockKey,
    /// Bit per [`Tier`] holding this block.
    tiers: u8,
}

const GPU: u8 = 1;

fn tier_bit(t: Tier) -> u8 {
    match t {
        Tier::Gpu => GPU,
        Tier::Cpu => 2,
        Tier::Storage => 4,
    }
}

#[derive(Default)]
struct EngineMap {
    blocks: HashMap<EngineHash, Entry, SeededState>,
    /// Keys this engine reaches through more than one of its hashes (vLLM hashes extra keys,
    /// such as multimodal inputs or the LoRA path, that kvroute keys do not): references
    /// beyond the first. The engine holds a key while any reference remains. Usually empty.
    extra_refs: HashMap<BlockKey, u32, SeededState>,
    /// Keys off the GPU: per key, how many of this engine's hashes for it lack the GPU tier
    /// (offloaded to CPU / storage only). A key is GPU-resident unless every hash reaching it
    /// is counted here. Empty without an offloading tier, so lookups skip it.
    cold: HashMap<BlockKey, u32, SeededState>,
    /// Scratch for computed keys, reused across events.
    keys: Vec<BlockKey>,
}

impl EngineMap {
    fn on_gpu(&self, key: &BlockKey) -> bool {
        let cold = self.cold.get(key).copied().unwrap_or(0);
        cold == 0 || cold < 1 + self.extra_refs.get(key).copied().unwrap_or(0)
    }

    /// Leading keys of `keys[..matched]` on the GPU.
    fn gpu_prefix(&self, keys: &[BlockKey], matched: usize) -> usize {
        let held = keys.get(..matched).unwrap_or(keys);
        if self.cold.is_empty() {
            return held.len();
        }
        // Stops at the first key off the GPU: at most the GPU prefix plus one lookup.
        held.iter().take_while(|k| self.on_gpu(k)).count()
    }

    fn cool(&mut self, key: BlockKey) {
        *self.cold.entry(key).or_insert(0) += 1;
    }

    fn warm(&mut self, key: BlockKey) {
        if let std::collections::hash_map::Entry::Occupied(mut o) = self.cold.entry(key) {
            *o.get_mut() -= 1;
            if *o.get() == 0 {
                o.remove();
            }
        }
    }
}

/// See the module docs.
pub struct MemoryIndex {
    shards: Box<[RwLock<Shard>]>,
    engines: RwLock<HashMap<EngineSlot, Arc<Mutex<EngineMap>>>>,
    /// Engines with keys off the GPU. Zero (no offloading tier anywhere): lookups never take
    /// an engine lock to split tiers.
    cold_engines: AtomicUsize,
}

impl Default for MemoryIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryIndex {
    pub fn new() -> Self {
        MemoryIndex {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
            engines: RwLock::new(HashMap::new()),
            cold_engines: AtomicUsize::new(0),
        }
    }

    /// Distinct block keys held by at least one engine.
    pub fn distinct_keys(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    fn shard(&self, key: BlockKey) -> &RwLock<Shard> {
        // Keys are uniform hashes: the top bits pick the shard, the map uses its own hasher.
        &self.shards[(key.0 >> 58) as usize % SHARDS]
    }

    fn engine(&self, engine: EngineSlot) -> Arc<Mutex<EngineMap>> {
        if let Some(e) = self.engines.read().get(&engine) {
            return Arc::clone(e);
        }
        Arc::clone(self.engines.write().entry(engine).or_default())
    }

    fn store(&self, slot: EngineSlot, e: &mut EngineMap, ev: StoreArgs<'_>, stats: &mut ApplyStats) {
        if ev.token_ids.is_empty() {
            return self.add_tier(e, ev.hashes, ev.tier, stats);
        }
        let bs = ev.block_size as usize;
        if ev.block_size != ev.configured || bs == 0 {
            stats.rejected_bad_block += ev.hashes.len() as u64;
            return;
        }
        let parent_key = match ev.parent {
            None => KeyRoot::new(ev.lora_name.unwrap_or(ev.model), ev.cache_salt.unwrap_or("")).token_root(),
            Some(p) => match e.blocks.get(&p) {
                Some(entry) => entry.key,
                None => {
                    stats.rejected_unknown_parent += 1;
                    return;
                }
            },
        };
        let full = ev.hashes.len().min(ev.token_ids.len() / bs);
        stats.rejected_bad_block += (ev.hashes.len() - full) as u64;
        let mut keys = std::mem::take(&mut e.keys);
        keys.clear();
        extend_token_keys(parent_key, &ev.token_ids[..full * bs], bs, &mut keys);
        let bit = tier_bit(ev.tier);
        for (&hash, &key) in ev.hashes.iter().zip(&keys) {
            stats.blocks_stored += 1;
            match e.blocks.get_mut(&hash) {
                Some(entry) => {
                    let was_cold = entry.tiers & GPU == 0;
                    entry.tiers |= bit;
                    if was_cold && bit == GPU {
                        let key = entry.key;
                        e.warm(key);
                    }
                }
                None => {
                    e.blocks.insert(hash, Entry { key, tiers: bit });
                    self.hold(slot, &mut e.extra_refs, key);
                    if bit != GPU {
                        e.cool(key);
                    }
                }
            }
        }
        e.keys = keys;
    }

    /// vLLM's offloading connector stores placeholders by default (one hash, no tokens, no
    /// parent, block size 0) for blocks the engine computed on its GPU: the block keeps its key
    /// and gains the tier. A hash the engine does not hold cannot be keyed.
    fn add_tier(&self, e: &mut EngineMap, hashes: &[EngineHash], tier: Tier, stats: &mut ApplyStats) {
        let bit = tier_bit(tier);
        for hash in hashes {
            let Some(entry) = e.blocks.get_mut(hash) else {
                stats.rejected_unknown_hash += 1;
                continue;
            };
            stats.blocks_stored += 1;
            let was_cold = entry.tiers & GPU == 0;
            entry.tiers |= bit;
            if was_cold && bit == GPU {
                let key = entry.key;
                e.warm(key);
            }
        }
    }

    fn remove(&self, slot: EngineSlot, e: &mut EngineMap, hashes: &[EngineHash], tier: Tier, stats: &mut ApplyStats) {
        let bit = tier_bit(tier);
        for hash in hashes {
            let Some(entry) = e.blocks.get_mut(hash).filter(|x| x.tiers & bit != 0) else {
                stats.rejected_unknown_hash += 1;
                continue;
            };
            stats.blocks_removed += 1;
            let was_cold = entry.tiers & GPU == 0;
            entry.tiers &= !bit;
            let (key, left) = (entry.key, entry.tiers);
            if left == 0 {
                e.blocks.remove(hash);
                if was_cold {
                    e.warm(key);
                }
                self.unhold(slot, &mut e.extra_refs, key);
            } else if bit == GPU {
                e.cool(key);
            }
        }
    }

    /// One more of `slot`'s hashes maps to `key`.
    fn hold(&self, slot: EngineSlot, extra_refs: &mut HashMap<BlockKey, u32, SeededState>, key: BlockKey) {
        if !self.shard(key).write().add(key, slot.0) {
            *extra_refs.entry(key).or_insert(0) += 1;
        }
    }

    /// One fewer of `slot`'s hashes maps to `key`; the last one releases it.
    fn unhold(&self, slot: EngineSlot, extra_refs: &mut HashMap<BlockKey, u32, SeededState>, key: BlockKey) {
        match extra_refs.get_mut(&key) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => drop(extra_refs.remove(&key)),
            None => self.shard(key).write().release(key, slot.0),
        }
    }

    fn clear_locked(&self, slot: EngineSlot, e: &mut EngineMap) {
        e.extra_refs = HashMap::default();
        e.cold = HashMap::default();
        // Releasing a key twice is a no-op, so duplicate references need no bookkeeping here.
        for entry in std::mem::take(&mut e.blocks).into_values() {
            self.shard(entry.key).write().release(entry.key, slot.0);
        }
    }
}

/// The parts of a `KvEvent::Stored` plus the engine's configuration.
struct StoreArgs<'a> {
    model: &'a str,
    configured: u32,
    hashes: &'a [EngineHash],
    parent: Option<EngineHash>,
    token_ids: &'a [u32],
    block_size: u32,
    lora_name: Option<&'a str>,
    cache_salt: Option<&'a str>,
    tier: Tier,
}

impl KvIndex for MemoryIndex {
    fn apply(&self, engine: EngineSlot, model: &str, block_size: u32, events: &[KvEvent]) -> ApplyStats {
        let mut stats = ApplyStats::default();
        let handle = self.engine(engine);
        let mut e = handle.lock();
        let had_cold = !e.cold.is_empty();
        for ev in events {
            match ev {
                KvEvent::Stored { hashes, parent, token_ids, block_size: bs, lora_name, cache_salt, tier } => {
                    let args = StoreArgs {
                        model,
                        configured: block_size,
                        hashes,
                        parent: *parent,
                        token_ids,
                        block_size: *bs,
                        lora_name: lora_name.as_deref(),
                        cache_salt: cache_salt.as_deref(),
                        tier: *tier,
                    };
                    self.store(engine, &mut e, args, &mut stats);
                }
                KvEvent::Removed { hashes, tier } => self.remove(engine, &mut e, hashes, *tier, &mut stats),
                KvEvent::AllCleared => {
                    stats.clears += 1;
                    self.clear_locked(engine, &mut e);
                }
            }
        }
        self.track_cold(had_cold, &e);
        stats
    }

    fn clear_engine(&self, engine: EngineSlot) {
        let handle = self.engines.read().get(&engine).cloned();
        if let Some(handle) = handle {
            let mut e = handle.lock();
            let had_cold = !e.cold.is_empty();
            self.clear_locked(engine, &mut e);
            self.track_cold(had_cold, &e);
        }
    }

    fn match_prefix(&self, keys: &[BlockKey]) -> Vec<PrefixMatch> {
        let Some(&first) = keys.first() else { return Vec::new() };
        let mut slots: Vec<u32> = Vec::new();
        self.shard(first).read().for_each_holder(first, |s| slots.push(s));
        let Some(&max) = slots.iter().max() else { return Vec::new() };
        // Engines still matching, as a bitset over slots (the registry numbers them densely).
        let words = max as usize / 64 + 1;
        let mut active = vec![0u64; words];
        for &s in &slots {
            active[s as usize / 64] |= 1 << (s % 64);
        }
        let mut alive = slots.len();
        let mut out = Vec::with_capacity(alive);
        let mut next = vec![0u64; words];
        for (i, &key) in keys.iter().enumerate().skip(1) {
            next.iter_mut().for_each(|w| *w = 0);
            self.shard(key).read().holders_into(key, &mut next);
            alive -= drain_bits(&mut active, &next, |slot| out.push(matched(slot, i)));
            if alive == 0 {
                return self.split_tiers(keys, out);
            }
        }
        drain_bits(&mut active, &vec![0; words], |slot| out.push(matched(slot, keys.len())));
        self.split_tiers(keys, out)
    }

    fn engine_blocks(&self, engine: EngineSlot) -> usize {
        let handle = self.engines.read().get(&engine).cloned();
        handle.map_or(0, |h| h.lock().blocks.len())
    }
}

fn matched(slot: u32, n: usize) -> PrefixMatch {
    PrefixMatch { engine: EngineSlot(slot), matched_blocks: n as u32, gpu_blocks: n as u32 }
}

impl MemoryIndex {
    /// Sets each match's GPU prefix: the engine maps are consulted only for engines with
    /// keys off the GPU (an offloading tier); without one every match is all GPU.
    fn split_tiers(&self, keys: &[BlockKey], mut out: Vec<PrefixMatch>) -> Vec<PrefixMatch> {
        if self.cold_engines.load(Ordering::Relaxed) == 0 {
            return out;
        }
        let engines = self.engines.read();
        for m in &mut out {
            if let Some(e) = engines.get(&m.engine) {
                m.gpu_blocks = e.lock().gpu_prefix(keys, m.matched_blocks as usize) as u32;
            }
        }
        out
    }

    /// Keeps `cold_engines` current after `e` changed (its lock held).
    fn track_cold(&self, had_cold: bool, e: &EngineMap) {
        match (had_cold, !e.cold.is_empty()) {
            (false, true) => drop(self.cold_engines.fetch_add(1, Ordering::Relaxed)),
            (true, false) => drop(self.cold_engines.fetch_sub(1, Ordering::Relaxed)),
            _ => {}
        }
    }
}

/// `active &= keep`, calling `dropped` for every slot that was active and is not kept.
fn drain_bits(active: &mut [u64], keep: &[u64], mut dropped: impl FnMut(u32)) -> usize {
    let mut n = 0;
    for (w, (a, k)) in active.iter_mut().zip(keep).enumerate() {
        let mut gone = *a & !k;
        *a &= k;
        while gone != 0 {
            dropped(w as u32 * 64 + gone.trailing_zeros());
            gone &= gone - 1;
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests;
