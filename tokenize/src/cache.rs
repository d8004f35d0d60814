//! A bounded, sharded cache keyed by a 128-bit hash, generic over its value: the encoder keeps
//! encoded prompt pieces in it (ids keyed by the hash of their text), the incremental renderer
//! rendered conversation prefixes.
//!
//! A leaf module: it knows no caller (so the docs name none with a link), and the modules that
//! cache something depend on it, never the other way round.
//!
//! Eviction is generational (an LRU approximation with O(1) work and no per-entry links): each
//! shard has a `young` and an `old` map. Inserts go to `young`; a hit in `old` moves the entry
//! to `young`. When `young` exceeds half the shard's byte budget, `old` is dropped and `young`
//! becomes `old`. Anything used within the last generation survives; memory never exceeds the
//! budget by more than one entry per shard. An entry costs its text length (the hash stands in
//! for the text, but the budget is stated in prompt bytes) plus 4 bytes per token id plus a
//! fixed overhead.
//!
//! A 128-bit XXH3 key makes a collision (which would silently give wrong tokens) about as likely
//! as a hardware fault; the text itself is not stored.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const SHARDS: usize = 16;
const ENTRY_OVERHEAD: usize = 64;

/// Hash of a piece's text.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PieceHash(pub u128);

impl PieceHash {
    pub fn of(text: &str) -> PieceHash {
        PieceHash(xxhash_rust::xxh3::xxh3_128(text.as_bytes()))
    }
}

/// Cache counters, for metrics and status views.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Bytes of text (not counting added tokens) served from the cache / encoded afresh.
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    /// Current accounted size and entry count.
    pub bytes: u64,
    pub entries: u64,
    pub capacity_bytes: u64,
}

struct Shard<V> {
    young: HashMap<PieceHash, (V, usize)>,
    old: HashMap<PieceHash, (V, usize)>,
    young_bytes: usize,
    old_bytes: usize,
}

impl<V> Default for Shard<V> {
    fn default() -> Self {
        Shard { young: HashMap::new(), old: HashMap::new(), young_bytes: 0, old_bytes: 0 }
    }
}

impl<V> Shard<V> {
    fn rotate_if_full(&mut self, half_budget: usize) {
        if self.young_bytes > half_budget {
            self.old = std::mem::take(&mut self.young);
            self.old_bytes = std::mem::replace(&mut self.young_bytes, 0);
        }
    }
}

/// `V` is cheap to clone (an `Arc`); the default is a piece's token ids.
pub struct PieceCache<V = Arc<[u32]>> {
    shards: Vec<Mutex<Shard<V>>>,
    half_shard_budget: usize,
    capacity: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    hit_bytes: AtomicU64,
    miss_bytes: AtomicU64,
}

impl<V> std::fmt::Debug for PieceCache<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PieceCache").field("capacity", &self.capacity).finish()
    }
}

impl PieceCache<Arc<[u32]>> {
    /// Caches the ids of a piece of `len` bytes (cost: text bytes + 4 per id).
    pub fn insert(&self, key: PieceHash, len: usize, ids: Arc<[u32]>) {
        let bytes = len + 4 * ids.len();
        self.insert_sized(key, bytes, ids);
    }
}

impl<V: Clone> PieceCache<V> {
    /// A cache holding at most about `capacity_bytes` (0 disables caching).
    pub fn new(capacity_bytes: usize) -> PieceCache<V> {
        PieceCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            half_shard_budget: capacity_bytes / SHARDS / 2,
            capacity: capacity_bytes,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            hit_bytes: AtomicU64::new(0),
            miss_bytes: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: PieceHash) -> &Mutex<Shard<V>> {
        &self.shards[(key.0 as usize) % SHARDS]
    }

    /// The cached value of a piece of `len` bytes, counting a hit or a miss.
    pub fn get(&self, key: PieceHash, len: usize) -> Option<V> {
        let found = self.peek(key);
        self.count(found.is_some(), len);
        found
    }

    /// [`Self::get`] without counting (for probing several keys per request).
    pub fn peek(&self, key: PieceHash) -> Option<V> {
        let mut shard = self.shard(key).lock();
        if let Some((value, _)) = shard.young.get(&key) {
            return Some(value.clone());
        }
        let (value, cost) = shard.old.remove(&key)?;
        shard.old_bytes -= cost;
        shard.young_bytes += cost;
        shard.young.insert(key, (value.clone(), cost));
        shard.rotate_if_full(self.half_shard_budget);
        Some(value)
    }

    /// Counts a hit or a miss of `len` bytes found by [`Self::peek`].
    pub fn count(&self, hit: bool, len: usize) {
        let (count, bytes) = if hit { (&self.hits, &self.hit_bytes) } else { (&self.misses, &self.miss_bytes) };
        count.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(len as u64, Ordering::Relaxed);
    }

    /// Inserts `value` accounted as `bytes` (plus a fixed per-entry overhead).
    pub fn insert_sized(&self, key: PieceHash, bytes: usize, value: V) {
        let cost = bytes + ENTRY_OVERHEAD;
        if cost > self.half_shard_budget {
            return;
        }
        let mut shard = self.shard(key).lock();
        if let Some((_, old_cost)) = shard.young.insert(key, (value, cost)) {
            shard.young_bytes -= old_cost;
        }
        shard.young_bytes += cost;
        shard.rotate_if_full(self.half_shard_budget);
    }

    pub fn stats(&self) -> CacheStats {
        let (mut bytes, mut entries) = (0u64, 0u64);
        for shard in &self.shards {
            let s = shard.lock();
            bytes += (s.young_bytes + s.old_bytes) as u64;
            entries += (s.young.len() + s.old.len()) as u64;
        }
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            hit_bytes: self.hit_bytes.load(Ordering::Relaxed),
            miss_bytes: self.miss_bytes.load(Ordering::Relaxed),
            bytes,
            entries,
            capacity_bytes: self.capacity as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_budget_and_keeps_recent_entries() {
        let cache = PieceCache::new(16 * 2 * 1000);
        for i in 0..10_000u32 {
            let text = format!("piece {i}");
            cache.insert(PieceHash::of(&text), text.len(), Arc::from(vec![i; 8]));
            assert!(cache.get(PieceHash::of("piece 0"), 7).is_some() || i > 0, "first entry readable at once");
        }
        let s = cache.stats();
        assert!(s.bytes <= s.capacity_bytes + (SHARDS * 200) as u64, "{s:?}");
        let last = "piece 9999";
        assert_eq!(cache.get(PieceHash::of(last), last.len()).as_deref(), Some(&[9999u32; 8][..]));
    }

    #[test]
    fn zero_capacity_caches_nothing() {
        let cache = PieceCache::new(0);
        cache.insert(PieceHash::of("a"), 1, Arc::from(vec![1]));
        assert!(cache.get(PieceHash::of("a"), 1).is_none());
        assert_eq!(cache.stats().misses, 1);
    }
}
