//! Text-chunk keys learned from routing history: the approach of routers that do not read
//! KV events. After each pick every chunk key of the request maps to the chosen worker; a
//! later request is sent where its longest learned chunk prefix went. Bounded: the least
//! recently learned keys are forgotten first.

use crate::types::{BlockKey, WorkerId};
use std::collections::{BTreeMap, HashMap};

#[derive(Debug)]
pub struct ApproxMap {
    capacity: usize,
    tick: u64,
    map: HashMap<BlockKey, (WorkerId, u64)>,
    /// tick of last learning -> key, oldest first.
    order: BTreeMap<u64, BlockKey>,
}

impl ApproxMap {
    pub fn new(capacity: usize) -> Self {
        ApproxMap { capacity: capacity.max(1), tick: 0, map: HashMap::new(), order: BTreeMap::new() }
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
        let mut out = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let Some((worker, _)) = self.map.get(key) else { break };
            out.insert(worker.clone(), i as u32 + 1);
        }
        out
    }

    /// Remembers that `keys` went to `worker`.
    pub fn learn(&mut self, keys: &[BlockKey], worker: &WorkerId) {
        for key in keys {
            self.tick += 1;
            if let Some((_, old_tick)) = self.map.insert(*key, (worker.clone(), self.tick)) {
                self.order.remove(&old_tick);
            }
            self.order.insert(self.tick, *key);
        }
        while self.map.len() > self.capacity {
            let Some((_, key)) = self.order.pop_first() else { break };
            self.map.remove(&key);
        }
    }

    /// Forgets every key learned for `worker` (it was deregistered).
    pub fn forget_worker(&mut self, worker: &WorkerId) {
        let order = &mut self.order;
        self.map.retain(|_, (w, tick)| {
            let keep = w != worker;
            if !keep {
                order.remove(tick);
            }
            keep
        });
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
}
