//! The embedded in-memory [`KvIndex`]: microsecond prefix lookups for picks.
//!
//! Layout. Two structures, each a dense array plus a hash index of 4-byte buckets over it
//! (`table.rs`: at most 80% full, grown by 1.5x, so 53-80%), which is what keeps a (block,
//! engine) pair at ~36-38 bytes (a `HashMap` of keys and one of hashes cost 55-70):
//! - global, in 32 shards by key hash, each behind its own `RwLock` (`holders.rs`): block
//!   keys interned to slot numbers (12-byte slots: the key and a holders word), and per slot
//!   the engines holding the key: the only holder inline in the holders word (most keys:
//!   conversation tails); several as a sorted list of engine slots, or as a bitmask over
//!   engine slots once that is smaller (keys every engine holds: system prompts). A shard
//!   also keeps, per holder set, the set's engines below 64 as one word, so a walk over a
//!   fleet of up to 64 engines reads one `u64` per key. A slot's number is stable while any
//!   engine holds the key.
//! - per engine, behind its own mutex (`blocks.rs`): `EngineHash -> (global slot, tiers)`,
//!   12 bytes an entry, the key itself read from the slot. vLLM's `BlockRemoved` names
//!   blocks by engine hash only, and a `BlockStored` names its parent by engine hash, so
//!   this map turns vLLM's hashes into kvroute keys. A block may sit in several tiers (GPU,
//!   CPU, storage) at once; it stays indexed while any tier holds it.
//!
//! Lookups. `match_prefix` hashes each key once, probes its shard's index (a bucket, then
//! the slot: one comparison in the common case) and ANDs the key's holders into a bitset of
//! the engines still matching, on the stack for up to 1,024 engines and a single `u64` for
//! up to 64; it stops at the first key that leaves nobody, and allocates only its answer.
//!
//! Cost: a store or remove is O(1) per block (one engine-map and one shard operation); a
//! lookup is O(keys walked x mask words); `clear_engine` is O(blocks of that engine).
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
//! shard lock at a time: the write lock of the key's shard per block stored or removed, a
//! read lock to read a parent's key. Writers of different engines share nothing but the
//! shard a block falls in (32 shards: two writers meet in one about 1 time in 32), so
//! ingestion spreads over the cores; they never hold two shard locks, nor wait for anything
//! while holding one. A shard's index grows under an upgradable read (other writers wait,
//! lookups do not), then is swapped in under the write lock. A writer requests a whole
//! event's buckets (engine map and shards) from memory before probing the first, so their
//! cache misses overlap.
//!
//! A pick takes shard read locks only, each shard at most once however many of its keys it
//! walks (a 512-key walk takes 32 locks, not 512), keeping them until the walk ends; its
//! second and later locks are taken recursively (they do not queue behind a waiting writer,
//! which could otherwise deadlock two picks and two writers: a writer waits for the picks
//! holding its shard to finish, never the other way round), and it takes engine locks only
//! after releasing them. A pick never waits for a whole batch; it may see a batch half
//! applied, which is harmless for routing.
//!
//! Capacity: 16.7M distinct keys a shard (537M in all) and 67M blocks an engine; a block
//! past either is not indexed and counts as `rejected_bad_block`.

mod blocks;
mod capacity;
mod holders;
pub mod snapshot;
mod table;
mod walk;

use super::{ApplyStats, KvIndex, PrefixMatch};
use crate::hasher::SeededState;
use crate::types::{BlockKey, EngineHash, EngineSlot, KvEvent, Tier};
use blocks::Blocks;
use holders::{Shard, SLOT_BITS};
use kvroute_core::keys::KeyRoot;
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockUpgradableReadGuard};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use table::prefetch;
use std::sync::Arc;

const SHARD_BITS: u32 = 5;
const SHARDS: usize = 1 << SHARD_BITS;

/// A key's global slot: shard (5 bits) and slot within it (24 bits).
type GlobalSlot = u32;

/// An engine map's value: `GlobalSlot << 3 | tier bits`.
const TIER_BITS: u32 = 3;
const TIER_MASK: u32 = (1 << TIER_BITS) - 1;
const GPU: u32 = 1;

fn tier_bit(t: Tier) -> u32 {
    match t {
        Tier::Gpu => GPU,
        Tier::Cpu => 2,
        Tier::Storage => 4,
    }
}

fn gslot(block: u32) -> GlobalSlot {
    block >> TIER_BITS
}

fn split(g: GlobalSlot) -> (usize, u32) {
    ((g >> SLOT_BITS) as usize, g & ((1 << SLOT_BITS) - 1))
}

struct EngineMap {
    blocks: Blocks,
    /// Keys this engine reaches through more than one of its hashes (vLLM hashes extra keys,
    /// such as multimodal inputs or the LoRA path, that kvroute keys do not), by global slot:
    /// references beyond the first. The engine holds a key while any reference remains.
    /// Usually empty.
    extra_refs: HashMap<GlobalSlot, u32, SeededState>,
    /// Keys off the GPU: per key, how many of this engine's hashes for it lack the GPU tier
    /// (offloaded to CPU / storage only). A key is GPU-resident unless every hash reaching it
    /// is counted here. Empty without an offloading tier, so lookups skip it.
    cold: HashMap<BlockKey, u32, SeededState>,
    /// Scratch for computed keys and the bytes they hash, reused across events.
    keys: Vec<BlockKey>,
    key_buf: Vec<u8>,
    /// The most blocks this engine may hold ([`KvIndex::set_capacity`]), and its hashes in the
    /// order they were stored (kept only while bounded; a removed hash stays until popped or
    /// compacted away, so this is at most about twice the blocks held).
    capacity: Option<usize>,
    order: std::collections::VecDeque<EngineHash>,
}

impl EngineMap {
    fn new(hasher: &SeededState) -> Self {
        EngineMap {
            blocks: Blocks::new(hasher.clone()),
            extra_refs: HashMap::default(),
            cold: HashMap::default(),
            keys: Vec::new(),
            key_buf: Vec::new(),
            capacity: None,
            order: std::collections::VecDeque::new(),
        }
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

/// One shard and where its index's buckets are, for writers to prefetch without the lock.
#[repr(align(64))]
struct ShardCell {
    lock: RwLock<Shard>,
    /// [`Shard::raw_parts`] as of the last growth (written under the write lock).
    buckets: AtomicUsize,
    homes: AtomicUsize,
}

impl ShardCell {
    fn read(&self) -> RwLockReadGuard<'_, Shard> {
        self.lock.read()
    }

    /// Starts fetching the bucket a probe for a key with mixed hash `h` reads first.
    #[inline]
    fn prefetch(&self, h: u64) {
        let parts = (self.buckets.load(Ordering::Relaxed), self.homes.load(Ordering::Relaxed));
        if parts.1 > 0 {
            prefetch(Shard::home_addr(parts, h, SHARD_BITS));
        }
    }
}

/// `kvroute_core::keys::extend_token_keys`, with the hashed bytes laid out a block at a time
/// in one reused buffer (a copy the compiler vectorises, not a push per token): the same keys
/// (XXH3-64 of the parent key and the block's token ids, little-endian; a test holds the two
/// equal), for a fifth of a block's ingestion cost.
fn token_keys(parent: BlockKey, tokens: &[u32], block_size: usize, buf: &mut Vec<u8>, out: &mut Vec<BlockKey>) {
    debug_assert!(block_size > 0);
    buf.resize(8 + 4 * block_size, 0);
    let mut prev = parent;
    out.reserve(tokens.len() / block_size);
    for block in tokens.chunks_exact(block_size) {
        buf[..8].copy_from_slice(&prev.0.to_le_bytes());
        for (dst, t) in buf[8..].chunks_exact_mut(4).zip(block) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        prev = BlockKey(xxhash_rust::xxh3::xxh3_64(buf));
        out.push(prev);
    }
}

/// See the module docs.
pub struct MemoryIndex {
    shards: Box<[ShardCell]>,
    engines: RwLock<HashMap<EngineSlot, Arc<Mutex<EngineMap>>>>,
    /// Engines with keys off the GPU. Zero (no offloading tier anywhere): lookups never take
    /// an engine lock to split tiers.
    cold_engines: AtomicUsize,
    /// Seeds every table's hash (keys and engine hashes may be chosen by clients).
    hasher: SeededState,
}

impl Default for MemoryIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryIndex {
    pub fn new() -> Self {
        MemoryIndex {
            shards: (0..SHARDS)
                .map(|_| ShardCell { lock: RwLock::new(Shard::new()), buckets: AtomicUsize::new(0), homes: AtomicUsize::new(0) })
                .collect(),
            engines: RwLock::new(HashMap::new()),
            cold_engines: AtomicUsize::new(0),
            hasher: SeededState::default(),
        }
    }

    /// Distinct block keys held by at least one engine.
    pub fn distinct_keys(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    #[inline]
    fn mix(&self, key: u64) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a key whose mixed hash is `h`: its top bits (the shard's table uses the
    /// rest).
    #[inline]
    fn shard_of(h: u64) -> usize {
        (h >> (64 - SHARD_BITS)) as usize
    }

    fn engine(&self, engine: EngineSlot) -> Arc<Mutex<EngineMap>> {
        if let Some(e) = self.engines.read().get(&engine) {
            return Arc::clone(e);
        }
        Arc::clone(self.engines.write().entry(engine).or_insert_with(|| Arc::new(Mutex::new(EngineMap::new(&self.hasher)))))
    }

    /// The key of a held block.
    fn key_of(&self, block: u32) -> BlockKey {
        let (s, slot) = split(gslot(block));
        self.shards[s].read().key(slot)
    }

    /// One more of `engine`'s hashes maps to `key`: its global slot, None if the shard is full.
    fn hold(&self, engine: EngineSlot, extra_refs: &mut HashMap<GlobalSlot, u32, SeededState>, key: BlockKey) -> Option<GlobalSlot> {
        let h = self.mix(key.0);
        let s = Self::shard_of(h);
        let cell = &self.shards[s];
        let mut shard = cell.lock.write();
        if shard.full() {
            // Rehash under an upgradable read: other writers wait, lookups do not (a grown
            // shard of the 1,000-engine fleet rehashes 600k keys, milliseconds).
            drop(shard);
            let read = cell.lock.upgradable_read();
            let grown = read.full().then(|| read.grown(SHARD_BITS, |k| self.mix(k)));
            shard = RwLockUpgradableReadGuard::upgrade(read);
            if let Some(g) = grown {
                shard.install(g);
            }
        }
        let (slot, newly) = shard.add(key, h, engine.0, SHARD_BITS, |k| self.mix(k))?;
        let (buckets, homes) = shard.raw_parts();
        if cell.buckets.load(Ordering::Relaxed) != buckets || cell.homes.load(Ordering::Relaxed) != homes {
            cell.buckets.store(buckets, Ordering::Relaxed);
            cell.homes.store(homes, Ordering::Relaxed);
        }
        drop(shard);
        let g = (s as u32) << SLOT_BITS | slot;
        if !newly {
            *extra_refs.entry(g).or_insert(0) += 1;
        }
        Some(g)
    }

    /// One fewer of `engine`'s hashes maps to the key in `g`; the last one releases it.
    fn unhold(&self, engine: EngineSlot, extra_refs: &mut HashMap<GlobalSlot, u32, SeededState>, g: GlobalSlot) {
        match extra_refs.get_mut(&g) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => drop(extra_refs.remove(&g)),
            None => {
                let (s, slot) = split(g);
                self.shards[s].lock.write().release(slot, engine.0, SHARD_BITS, |k| self.mix(k));
            }
        }
    }

    fn store(&self, engine: EngineSlot, e: &mut EngineMap, ev: StoreArgs<'_>, stats: &mut ApplyStats) {
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
            Some(p) => match e.blocks.get(p) {
                Some(pos) => self.key_of(e.blocks.block(pos)),
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
        token_keys(parent_key, &ev.token_ids[..full * bs], bs, &mut e.key_buf, &mut keys);
        let bit = tier_bit(ev.tier);
        // Every block's first reads requested at once: their cache misses overlap instead of
        // one per block in turn (the shard locks below would each wait for the last).
        for (&hash, &key) in ev.hashes.iter().zip(&keys) {
            e.blocks.prefetch(hash);
            let h = self.mix(key.0);
            self.shards[Self::shard_of(h)].prefetch(h);
        }
        for (&hash, &key) in ev.hashes.iter().zip(&keys) {
            match e.blocks.get_or_vacant(hash) {
                Ok(pos) => {
                    stats.blocks_stored += 1;
                    let block = e.blocks.block(pos);
                    if block & GPU == 0 && bit == GPU {
                        let key = self.key_of(block);
                        e.warm(key);
                    }
                    e.blocks.set_block(pos, block | bit);
                }
                Err(None) => stats.rejected_bad_block += 1,
                Err(Some(vacant)) => {
                    let Some(g) = self.hold(engine, &mut e.extra_refs, key) else {
                        stats.rejected_bad_block += 1;
                        continue;
                    };
                    stats.blocks_stored += 1;
                    // `hold` left the engine's blocks untouched: the vacancy stands.
                    e.blocks.fill(vacant, hash, g << TIER_BITS | bit);
                    if e.capacity.is_some() {
                        e.order.push_back(hash);
                    }
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
            let Some(pos) = e.blocks.get(*hash) else {
                stats.rejected_unknown_hash += 1;
                continue;
            };
            stats.blocks_stored += 1;
            let block = e.blocks.block(pos);
            if block & GPU == 0 && bit == GPU {
                let key = self.key_of(block);
                e.warm(key);
            }
            e.blocks.set_block(pos, block | bit);
        }
    }

    fn remove(&self, engine: EngineSlot, e: &mut EngineMap, hashes: &[EngineHash], tier: Tier, stats: &mut ApplyStats) {
        let bit = tier_bit(tier);
        for hash in hashes {
            e.blocks.prefetch(*hash);
        }
        for hash in hashes {
            let Some(pos) = e.blocks.get(*hash).filter(|&p| e.blocks.block(p) & bit != 0) else {
                stats.rejected_unknown_hash += 1;
                continue;
            };
            stats.blocks_removed += 1;
            let block = e.blocks.block(pos);
            let left = block & TIER_MASK & !bit;
            if left == 0 {
                self.drop_block(engine, e, pos);
            } else {
                e.blocks.set_block(pos, block & !bit);
                if bit == GPU {
                    let key = self.key_of(block);
                    e.cool(key);
                }
            }
        }
    }

    fn clear_locked(&self, engine: EngineSlot, e: &mut EngineMap) {
        e.order.clear();
        e.extra_refs = HashMap::default();
        e.cold = HashMap::default();
        let old = std::mem::replace(&mut e.blocks, Blocks::new(self.hasher.clone()));
        // Each key once (several hashes may share one), grouped by shard: one lock per run of
        // up to 64 releases, so a lookup waits for no more than that.
        let mut held: Vec<GlobalSlot> = old.iter().map(|(_, b)| gslot(b)).collect();
        drop(old);
        held.sort_unstable();
        held.dedup();
        for run in held.chunk_by(|a, b| split(*a).0 == split(*b).0) {
            for part in run.chunks(64) {
                let mut shard = self.shards[split(part[0]).0].lock.write();
                for &g in part {
                    shard.release(split(g).1, engine.0, SHARD_BITS, |k| self.mix(k));
                }
            }
        }
    }

    /// Whether `e` holds `key` on its GPU (its lock held; no shard lock held).
    fn on_gpu(&self, e: &EngineMap, key: &BlockKey) -> bool {
        let cold = e.cold.get(key).copied().unwrap_or(0);
        if cold == 0 {
            return true;
        }
        if e.extra_refs.is_empty() {
            return false;
        }
        // Several hashes reach some key: is this one of them?
        let h = self.mix(key.0);
        let s = Self::shard_of(h);
        let slot = self.shards[s].read().find(*key, h, SHARD_BITS);
        let extra = slot.and_then(|slot| e.extra_refs.get(&((s as u32) << SLOT_BITS | slot)).copied()).unwrap_or(0);
        cold < 1 + extra
    }

    /// Leading keys of `keys[..matched]` that `e` holds on the GPU.
    fn gpu_prefix(&self, e: &EngineMap, keys: &[BlockKey], matched: usize) -> usize {
        let held = keys.get(..matched).unwrap_or(keys);
        if e.cold.is_empty() {
            return held.len();
        }
        // Stops at the first key off the GPU: at most the GPU prefix plus one lookup.
        held.iter().take_while(|k| self.on_gpu(e, k)).count()
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
        stats.evicted = self.enforce_capacity(engine, &mut e);
        self.track_cold(had_cold, &e);
        stats
    }

    fn set_capacity(&self, engine: EngineSlot, blocks: Option<usize>) -> u64 {
        let handle = self.engine(engine);
        let mut e = handle.lock();
        if e.capacity.is_none() && blocks.is_some() {
            // Bounded from now on: what it holds already counts as oldest, in no order.
            let held: Vec<EngineHash> = e.blocks.iter().map(|(h, _)| h).collect();
            e.order = held.into();
        } else if blocks.is_none() {
            e.order = std::collections::VecDeque::new();
        }
        e.capacity = blocks;
        let had_cold = !e.cold.is_empty();
        let evicted = self.enforce_capacity(engine, &mut e);
        self.track_cold(had_cold, &e);
        evicted
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
        self.split_tiers(keys, walk::match_prefix(self, keys))
    }

    fn engine_blocks(&self, engine: EngineSlot) -> usize {
        let handle = self.engines.read().get(&engine).cloned();
        handle.map_or(0, |h| h.lock().blocks.len())
    }
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
                m.gpu_blocks = self.gpu_prefix(&e.lock(), keys, m.matched_blocks as usize) as u32;
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

    /// Heap bytes of the tables, by part: (shards, engine maps). For the benchmark and tests;
    /// takes every lock in turn.
    pub fn heap_bytes(&self) -> (usize, usize) {
        let shards = self.shards.iter().map(|s| s.read().heap_bytes()).sum();
        let engines = self.engines.read().values().map(|e| e.lock().blocks.heap_bytes()).sum();
        (shards, engines)
    }
}

#[cfg(test)]
mod tests;
