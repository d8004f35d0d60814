//! What approximate peer routers remember: per worker, the prompt blocks routed to it, LRU
//! bounded per worker. SGLang's cache-aware router keeps a radix tree of request characters
//! per worker (`tenant`); llm-d's approximate prefix plugin keeps, per pod, an LRU of chained
//! 64-character block hashes. Both are "which leading blocks of this prompt did I send where",
//! which over kvroute's chained keys (token blocks, or text chunks for text prompts) is a set of
//! keys per worker: a key names its whole prefix, so a worker's match is its leading run.
//!
//! Unlike [`super::ApproxMap`] (one owner per key: the last worker it went to) a key may be
//! held by several workers, as in both peers' structures.

use super::clock::Clock;
use kvroute_kv::types::{BlockKey, WorkerId, WorkerSlots};

/// Which end of a prompt goes first when a worker's memory is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evict {
    /// SGLang's trees pop leaves: a prompt's tail before its prefix.
    TailFirst,
    /// llm-d's per-pod LRU of block hashes, added in prompt order: its head first.
    InOrder,
}

/// Learns `keys` into one worker's memory, oldest-to-evict first.
fn learn(set: &mut Clock<()>, keys: &[BlockKey], evict: Evict) {
    match evict {
        // The tail learned first is the oldest of this prompt, so it goes first.
        Evict::TailFirst => keys.iter().rev().for_each(|k| set.learn(*k, ())),
        Evict::InOrder => keys.iter().for_each(|k| set.learn(*k, ())),
    }
    set.evict();
}

/// What the sets say about one prompt for one worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetMatch {
    /// Leading keys of the prompt this worker holds (SGLang's matched prefix).
    pub leading: u32,
    /// Keys it holds within the run of leading keys that some worker holds (llm-d's count:
    /// its prefix plugin walks while any pod holds the block, counting per pod).
    pub in_run: u32,
    /// Keys its set holds (SGLang's tree size).
    pub size: u32,
}

#[derive(Debug)]
pub struct PrefixSets {
    capacity: usize,
    evict: Evict,
    workers: WorkerSlots,
    sets: Vec<Clock<()>>,
}

impl PrefixSets {
    /// `capacity`: keys kept per worker.
    pub fn new(capacity: usize, evict: Evict) -> Self {
        PrefixSets { capacity: capacity.max(1), evict, workers: WorkerSlots::default(), sets: Vec::new() }
    }

    pub fn learn(&mut self, keys: &[BlockKey], worker: &WorkerId) {
        let w = self.workers.intern(worker) as usize;
        let capacity = self.capacity;
        if self.sets.len() <= w {
            self.sets.resize_with(w + 1, || Clock::new(capacity));
        }
        if let Some(set) = self.sets.get_mut(w) {
            learn(set, keys, self.evict);
        }
    }

    /// Per worker of `workers`, in order.
    pub fn matches(&self, workers: &[&WorkerId], keys: &[BlockKey]) -> Vec<SetMatch> {
        let sets: Vec<Option<&Clock<()>>> = workers.iter().map(|w| self.workers.find(w).and_then(|i| self.sets.get(i as usize))).collect();
        let holds = |s: &Option<&Clock<()>>, k: &BlockKey| s.is_some_and(|s| s.contains(k));
        let run = keys.iter().take_while(|k| sets.iter().any(|s| holds(s, k))).count();
        let run_keys = keys.get(..run).unwrap_or(keys);
        sets.iter()
            .map(|s| SetMatch {
                leading: keys.iter().take_while(|k| holds(s, k)).count() as u32,
                in_run: run_keys.iter().filter(|k| holds(s, k)).count() as u32,
                size: s.map_or(0, |s| s.len() as u32),
            })
            .collect()
    }

    pub fn clear(&mut self) {
        self.sets.clear();
        self.workers = WorkerSlots::default();
    }

    pub fn forget_worker(&mut self, worker: &WorkerId) {
        let Some(w) = self.workers.find(worker) else { return };
        if let Some(set) = self.sets.get_mut(w as usize) {
            set.clear();
        }
        self.workers.release(w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(r: std::ops::Range<u64>) -> Vec<BlockKey> {
        r.map(BlockKey).collect()
    }

    #[test]
    fn a_key_is_held_by_every_worker_it_went_to() {
        let (a, b) = (WorkerId::new("a"), WorkerId::new("b"));
        let mut s = PrefixSets::new(100, Evict::InOrder);
        s.learn(&keys(0..4), &a);
        s.learn(&keys(0..2), &b);
        s.learn(&[BlockKey(0), BlockKey(9), BlockKey(3)], &b);
        let m = s.matches(&[&a, &b], &keys(0..6));
        assert_eq!(m[0], SetMatch { leading: 4, in_run: 4, size: 4 });
        // b holds 0, 1 and 3 of the run 0..4 that someone holds, but only 0..2 leading.
        assert_eq!(m[1], SetMatch { leading: 2, in_run: 3, size: 4 });
    }

    #[test]
    fn a_tail_first_memory_keeps_the_prefix() {
        let a = WorkerId::new("a");
        let mut s = PrefixSets::new(3, Evict::TailFirst);
        s.learn(&keys(0..5), &a);
        assert_eq!(s.matches(&[&a], &keys(0..5))[0].leading, 3, "0, 1, 2 kept; 3, 4 popped");
    }

    #[test]
    fn each_worker_is_bounded_least_recently_learned_first() {
        let a = WorkerId::new("a");
        let mut s = PrefixSets::new(3, Evict::InOrder);
        s.learn(&keys(0..3), &a);
        s.learn(&keys(0..1), &a); // 0 relearned: 1 is now the oldest
        s.learn(&keys(10..11), &a);
        let m = s.matches(&[&a], &keys(0..1));
        assert_eq!((m[0].leading, m[0].size), (1, 3));
        assert_eq!(s.matches(&[&a], &keys(1..2))[0].leading, 0, "1 was evicted");
        s.forget_worker(&a);
        assert_eq!(s.matches(&[&a], &keys(0..1))[0], SetMatch::default());
    }
}
