//! Text-chunk keys learned from routing history: the approach of routers that do not read
//! KV events. After each pick every chunk key of the request maps to the chosen worker; a
//! later request is sent where its longest learned chunk prefix went. Bounded: keys that were
//! not relearned for longest are forgotten first.
//!
//! The bound and its eviction order are [`super::clock::Clock`]'s.

use super::clock::Clock;
use kvroute_kv::types::{BlockKey, WorkerId, WorkerSlots};
use std::collections::HashMap;

#[derive(Debug)]
pub struct ApproxMap {
    workers: WorkerSlots,
    /// key -> the worker slot it last went to.
    learned: Clock<u32>,
}

impl ApproxMap {
    pub fn new(capacity: usize) -> Self {
        ApproxMap { workers: WorkerSlots::default(), learned: Clock::new(capacity) }
    }

    pub fn len(&self) -> usize {
        self.learned.len()
    }

    pub fn is_empty(&self) -> bool {
        self.learned.is_empty()
    }

    pub fn clear(&mut self) {
        self.learned.clear();
    }

    /// Per worker, how many leading `keys` were last routed to it. Keys are chained, so the
    /// walk stops at the first key nobody learned.
    pub fn matches(&self, keys: &[BlockKey]) -> HashMap<WorkerId, u32> {
        let mut held = vec![0u32; self.workers.len()];
        for (i, key) in keys.iter().enumerate() {
            let Some(&w) = self.learned.get(key) else { break };
            held[w as usize] = i as u32 + 1;
        }
        self.workers.named(held).into_iter().collect()
    }

    /// Remembers that `keys` went to `worker`.
    pub fn learn(&mut self, keys: &[BlockKey], worker: &WorkerId) {
        let w = self.workers.intern(worker);
        for key in keys {
            self.learned.learn(*key, w);
        }
        self.learned.evict();
    }

    /// Forgets every key learned for `worker` (it was deregistered).
    pub fn forget_worker(&mut self, worker: &WorkerId) {
        let Some(w) = self.workers.find(worker) else { return };
        self.learned.retain(|x| *x != w);
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
        assert_eq!(m.learned.queued(), m.len(), "one place per learned key");
        m.learn(&keys(10..14), &b);
        // Full; the next key evicts the oldest key not relearned since it was queued: 10,
        // not the older but hot 0..4.
        m.learn(&keys(20..21), &b);
        assert_eq!(m.matches(&keys(0..4)).get(&a), Some(&4));
        assert_eq!(m.matches(&keys(10..14)).get(&b), None);
        assert_eq!(m.matches(&keys(11..14)).get(&b), Some(&3));
        assert_eq!((m.len(), m.learned.queued()), (8, 8));
    }
}
