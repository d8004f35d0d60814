//! Text-chunk keys learned from routing history: the approach of routers that do not read
//! KV events. After each pick every chunk key of the request maps to the chosen worker; a
//! later request is sent where its longest learned chunk prefix went. Bounded: keys that were
//! not relearned for longest are forgotten first.
//!
//! A pick learns every key of its prompt (547 for a 32k-token text), so the recency order is
//! a queue with one place per learned key rather than an ordered map: relearning a key only
//! updates its tick, and eviction gives a key whose tick moved on since it was queued a
//! second chance at the back (CLOCK-like: approximately least recently learned first, with no
//! per-learn reordering and no compaction pauses).

use crate::hasher::SeededState;
use crate::types::{BlockKey, WorkerId, WorkerSlots};
use std::collections::{HashMap, VecDeque};

#[derive(Debug)]
pub struct ApproxMap {
    capacity: usize,
    tick: u64,
    workers: WorkerSlots,
    /// key -> (worker, tick of last learning).
    map: HashMap<BlockKey, (u32, u64), SeededState>,
    /// (tick when queued, key), one place per learned key, oldest first.
    order: VecDeque<(u64, BlockKey)>,
}

impl ApproxMap {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        ApproxMap { capacity, tick: 0, workers: WorkerSlots::default(), map: HashMap::default(), order: VecDeque::new() }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }

    /// Per worker, how many leading `keys` were last routed to it. Keys are chained, so the
    /// walk stops at the first key nobody learned.
    pub fn matches(&self, keys: &[BlockKey]) -> HashMap<WorkerId, u32> {
        let mut held = vec![0u32; self.workers.len()];
        for (i, key) in keys.iter().enumerate() {
            let Some(&(w, _)) = self.map.get(key) else { break };
            held[w as usize] = i as u32 + 1;
        }
        self.workers.named(held).into_iter().collect()
    }

    /// Remembers that `keys` went to `worker`.
    pub fn learn(&mut self, keys: &[BlockKey], worker: &WorkerId) {
        let w = self.workers.intern(worker);
        for key in keys {
            self.tick += 1;
            if self.map.insert(*key, (w, self.tick)).is_none() {
                self.order.push_back((self.tick, *key));
            }
        }
        while self.map.len() > self.capacity {
            let Some((queued, key)) = self.order.pop_front() else { break };
            match self.map.get(&key) {
                Some(&(_, tick)) if tick == queued => {
                    self.map.remove(&key);
                }
                Some(&(_, tick)) => self.order.push_back((tick, key)),
                None => {}
            }
        }
    }

    /// Forgets every key learned for `worker` (it was deregistered).
    pub fn forget_worker(&mut self, worker: &WorkerId) {
        let Some(w) = self.workers.find(worker) else { return };
        self.map.retain(|_, (x, _)| *x != w);
        let map = &self.map;
        self.order.retain(|(_, key)| map.contains_key(key));
        self.workers.release(w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(range: std::ops::Range<u64>) -> Vec<BlockKey> {
        range.map(BlockKey).collect()
    }

    #[test]
    fn longest_learned_prefix_per_worker() {
        let (a, b) = (WorkerId::new("a"), WorkerId::new("b"));
        let mut m = ApproxMap::new(100);
        m.learn(&keys(0..3), &a);
        m.learn(&keys(0..6), &b);
        let got = m.matches(&keys(0..8));
        // The latest routing wins: b took over keys 0..3 from a.
        assert_eq!(got.get(&b), Some(&6));
        assert_eq!(got.get(&a), None);
        m.learn(&keys(0..2), &a);
        let got = m.matches(&keys(0..8));
        assert_eq!((got.get(&a), got.get(&b)), (Some(&2), Some(&6)));
        assert!(m.matches(&keys(100..101)).is_empty());
    }

    #[test]
    fn bounded_by_capacity_oldest_first() {
        let a = WorkerId::new("a");
        let mut m = ApproxMap::new(4);
        m.learn(&keys(0..3), &a);
        m.learn(&keys(10..13), &a);
        assert_eq!(m.len(), 4);
        assert!(m.matches(&keys(0..3)).is_empty(), "the oldest keys went first");
        assert_eq!(m.matches(&keys(10..13)).get(&a), Some(&3));
        m.forget_worker(&a);
        assert!(m.is_empty());
    }

    #[test]
    fn relearned_keys_get_a_second_chance_and_the_queue_stays_bounded() {
        let (a, b) = (WorkerId::new("a"), WorkerId::new("b"));
        let mut m = ApproxMap::new(8);
        for _ in 0..1000 {
            m.learn(&keys(0..4), &a);
        }
        assert_eq!(m.order.len(), m.len(), "one place per learned key");
        m.learn(&keys(10..14), &b);
        // Full; the next key evicts the oldest key not relearned since it was queued: 10,
        // not the older but hot 0..4.
        m.learn(&keys(20..21), &b);
        assert_eq!(m.matches(&keys(0..4)).get(&a), Some(&4));
        assert_eq!(m.matches(&keys(10..14)).get(&b), None);
        assert_eq!(m.matches(&keys(11..14)).get(&b), Some(&3));
        assert_eq!((m.len(), m.order.len()), (8, 8));
    }
}
