//! Text-chunk keys learned from routing history: the approach of routers that do not read
//! KV events. After each pick every chunk key of the request maps to the chosen worker; a
//! later request is sent where its longest learned chunk prefix went. Bounded: the least
//! recently learned keys are forgotten first.
//!
//! A pick learns every key of its prompt (547 for a 32k-token text), so the recency order is
//! a queue with lazy deletion rather than an ordered map: relearning a key leaves its old
//! place in the queue stale, eviction skips stale places, and the queue is compacted when
//! stale places outnumber live ones.

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
    /// (tick, key) in learning order, oldest first; stale when the key was learned again.
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
            self.map.insert(*key, (w, self.tick));
            self.order.push_back((self.tick, *key));
        }
        while self.map.len() > self.capacity {
            let Some((tick, key)) = self.order.pop_front() else { break };
            if self.is_live(tick, &key) {
                self.map.remove(&key);
            }
        }
        if self.order.len() > 2 * self.map.len() + 1024 {
            self.compact();
        }
    }

    /// Forgets every key learned for `worker` (it was deregistered).
    pub fn forget_worker(&mut self, worker: &WorkerId) {
        let Some(w) = self.workers.find(worker) else { return };
        self.map.retain(|_, (x, _)| *x != w);
        self.compact();
        self.workers.release(w);
    }

    fn is_live(&self, tick: u64, key: &BlockKey) -> bool {
        self.map.get(key).is_some_and(|&(_, t)| t == tick)
    }

    /// Drops the queue's stale places.
    fn compact(&mut self) {
        let mut order = std::mem::take(&mut self.order);
        order.retain(|(tick, key)| self.is_live(*tick, key));
        self.order = order;
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
    fn relearning_keeps_the_queue_bounded_and_recency_right() {
        let (a, b) = (WorkerId::new("a"), WorkerId::new("b"));
        let mut m = ApproxMap::new(8);
        for _ in 0..1000 {
            m.learn(&keys(0..4), &a);
        }
        assert!(m.order.len() <= 2 * m.len() + 1024, "stale places are compacted");
        m.learn(&keys(10..14), &b);
        m.learn(&keys(0..1), &a);
        // Capacity 8 is full; the next key evicts the least recently learned: 1, not 0.
        m.learn(&keys(20..21), &b);
        assert_eq!(m.matches(&keys(0..4)).get(&a), Some(&1));
        assert_eq!(m.matches(&keys(10..14)).get(&b), Some(&4));
        assert_eq!(m.len(), 8);
    }
}
