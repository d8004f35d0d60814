//! A bounded map of block keys, evicted approximately least recently learned first.
//!
//! Learning a prompt touches every key of it (547 for a 32k-token text), so the recency order
//! is a queue with one place per key rather than an ordered map: relearning a key only moves
//! its tick, and eviction gives a key whose tick moved on since it was queued a second chance
//! at the back (CLOCK-like: no per-learn reordering and no compaction pauses). Shared by the
//! learned routes ([`super::ApproxMap`]) and the peers' per-worker prefix memories
//! ([`super::prefix_sets`]).

use kvroute_kv::hasher::SeededState;
use kvroute_kv::types::BlockKey;
use std::collections::{HashMap, VecDeque};

#[derive(Debug)]
pub struct Clock<V> {
    capacity: usize,
    tick: u64,
    /// key -> (value, tick of last learning).
    map: HashMap<BlockKey, (V, u64), SeededState>,
    /// (tick when queued, key), one place per key, oldest first.
    order: VecDeque<(u64, BlockKey)>,
}

impl<V> Clock<V> {
    pub fn new(capacity: usize) -> Self {
        Clock { capacity: capacity.max(1), tick: 0, map: HashMap::default(), order: VecDeque::new() }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Places in the recency queue (one per key: it never grows past the map).
    pub fn queued(&self) -> usize {
        self.order.len()
    }

    pub fn get(&self, key: &BlockKey) -> Option<&V> {
        self.map.get(key).map(|(v, _)| v)
    }

    pub fn contains(&self, key: &BlockKey) -> bool {
        self.map.contains_key(key)
    }

    /// Learns `key` with `value` as the most recent; call [`Clock::evict`] after a batch.
    pub fn learn(&mut self, key: BlockKey, value: V) {
        self.tick += 1;
        if self.map.insert(key, (value, self.tick)).is_none() {
            self.order.push_back((self.tick, key));
        }
    }

    /// Drops keys, least recently learned first, until the capacity holds.
    pub fn evict(&mut self) {
        while self.map.len() > self.capacity {
            let Some((queued, key)) = self.order.pop_front() else { break };
            match self.map.get(&key) {
                Some(&(_, tick)) if tick == queued => drop(self.map.remove(&key)),
                Some(&(_, tick)) => self.order.push_back((tick, key)),
                None => {}
            }
        }
    }

    /// Keeps the keys whose value passes `keep`.
    pub fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) {
        self.map.retain(|_, (v, _)| keep(v));
        let map = &self.map;
        self.order.retain(|(_, key)| map.contains_key(key));
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }
}
