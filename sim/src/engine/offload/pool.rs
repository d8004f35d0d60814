//! The CPU pool itself, as vLLM's `CPUOffloadingManager` keeps it: which chunks it holds and
//! in what state (being written, readable, pinned by loads), their LRU ranks
//! (`LRUCachePolicy`), and each request's view of it. The tier around it
//! ([`super::CpuTier`]) decides when to store and load and what the copies cost.

use super::super::event::{KvEvent, Medium};
use crate::ids::{BlockDigest, EngineHash};
use std::collections::{BTreeSet, HashMap, HashSet};

/// LRU recency: `(rank, -position)` during a request, `(rank, 0)` after; smallest evicted.
pub(super) type Rank = (u64, i64);

/// Tokens and parent of a stored chunk, kept for self-describing events.
#[derive(Debug)]
pub(super) struct Payload {
    pub(super) parent: Option<EngineHash>,
    pub(super) tokens: Vec<u32>,
}

#[derive(Debug)]
pub(super) struct Chunk {
    /// -1: being written (not readable); 0: readable, evictable; > 0: pinned by loads.
    pub(super) ref_cnt: i32,
    pub(super) rank: Rank,
    pub(super) payload: Option<Payload>,
}

/// One request's view of the pool: vLLM's `_RequestCacheAccess` and `_RequestRank`, plus
/// the connector's `next_stored_chunk_idx`.
#[derive(Debug, Default)]
pub(crate) struct ReqOffload {
    /// Pool generation the access state belongs to; a reset starts it afresh.
    generation: u64,
    rank: Option<u64>,
    /// Chunks this request stored, reused or loaded, with their position (end token).
    seen: HashMap<BlockDigest, usize>,
    finished: bool,
    /// First chunk not yet offered to the pool.
    pub next_stored_chunk: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lookup {
    Miss,
    Hit,
    Pending,
}

#[derive(Debug)]
pub(super) struct CpuPool {
    pub(super) capacity: usize,
    pub(super) chunks: HashMap<BlockDigest, Chunk>,
    pub(super) evictable: BTreeSet<(Rank, [u8; 32])>,
    pub(super) next_rank: u64,
    pub(super) generation: u64,
}

impl CpuPool {
    pub(super) fn new(capacity: usize) -> Self {
        CpuPool { capacity, chunks: HashMap::new(), evictable: BTreeSet::new(), next_rank: 0, generation: 0 }
    }

    pub(super) fn lookup(&self, key: &BlockDigest) -> Lookup {
        match self.chunks.get(key) {
            None => Lookup::Miss,
            Some(c) if c.ref_cnt < 0 => Lookup::Pending,
            Some(_) => Lookup::Hit,
        }
    }

    pub(super) fn state<'a>(&self, st: &'a mut ReqOffload) -> &'a mut ReqOffload {
        if st.generation != self.generation {
            st.generation = self.generation;
            st.rank = None;
            st.seen.clear();
            st.finished = false;
        }
        st
    }

    pub(super) fn request_rank(&mut self, st: &mut ReqOffload) -> u64 {
        let st = self.state(st);
        if let Some(r) = st.rank {
            return r;
        }
        self.next_rank += 1;
        st.rank = Some(self.next_rank);
        self.next_rank
    }

    pub(super) fn set_rank(&mut self, key: &BlockDigest, rank: Rank) {
        let Some(c) = self.chunks.get_mut(key) else { return };
        if c.ref_cnt == 0 {
            self.evictable.remove(&(c.rank, key.0));
            self.evictable.insert((rank, key.0));
        }
        c.rank = rank;
    }

    /// `_record_request_cache_access` + `LRUCachePolicy.on_request_access`: keys new to the
    /// request move up to `(request rank, -position)` if that is more recent.
    pub(super) fn record_access(&mut self, st: &mut ReqOffload, keys: &[(BlockDigest, usize)]) {
        let fresh: Vec<(BlockDigest, usize)> = {
            let st = self.state(st);
            keys.iter().filter(|(k, pos)| st.seen.insert(*k, *pos).is_none()).copied().collect()
        };
        if fresh.is_empty() {
            return;
        }
        let rank = self.request_rank(st);
        for (k, pos) in fresh {
            let new = (rank, -(pos as i64));
            if self.chunks.get(&k).is_some_and(|c| c.rank < new) {
                self.set_rank(&k, new);
            }
        }
    }

    /// `prepare_store`: the keys it allocated (now being written), or None when it cannot
    /// make room; evictions are reported as one CPU `BlockRemoved`.
    pub(super) fn prepare_store(
        &mut self,
        st: &mut ReqOffload,
        offered: &[(BlockDigest, usize)],
        events: &mut Vec<KvEvent>,
    ) -> Option<Vec<(BlockDigest, usize)>> {
        let mut to_store = Vec::new();
        let mut recorded = Vec::new();
        for &(k, pos) in offered {
            match self.lookup(&k) {
                Lookup::Miss => {
                    to_store.push((k, pos));
                    recorded.push((k, pos));
                }
                Lookup::Hit => recorded.push((k, pos)),
                Lookup::Pending => {}
            }
        }
        self.record_access(st, &recorded);
        if to_store.is_empty() {
            return Some(to_store);
        }
        let free = self.capacity.saturating_sub(self.chunks.len());
        let need = to_store.len().saturating_sub(free);
        if need > 0 {
            if need > self.evictable.len() {
                return None;
            }
            let protected: HashSet<[u8; 32]> = offered.iter().map(|(k, _)| k.0).collect();
            let victims: Vec<(Rank, [u8; 32])> =
                self.evictable.iter().filter(|(_, k)| !protected.contains(k)).take(need).copied().collect();
            if victims.len() < need {
                return None;
            }
            for v in &victims {
                self.evictable.remove(v);
                self.chunks.remove(&BlockDigest(v.1));
            }
            events.push(KvEvent::BlockRemoved {
                block_hashes: victims.iter().map(|(_, k)| BlockDigest(*k).engine_hash()).collect(),
                medium: Medium::Cpu,
            });
        }
        let rank = self.request_rank(st);
        for &(k, pos) in &to_store {
            self.chunks.insert(k, Chunk { ref_cnt: -1, rank: (rank, -(pos as i64)), payload: None });
        }
        Some(to_store)
    }

    /// `complete_store`: written chunks become readable and evictable; returns those.
    pub(super) fn complete_store(&mut self, keys: &[BlockDigest]) -> Vec<BlockDigest> {
        let mut stored = Vec::new();
        for k in keys {
            if let Some(c) = self.chunks.get_mut(k) {
                if c.ref_cnt < 0 {
                    c.ref_cnt = 0;
                    self.evictable.insert((c.rank, k.0));
                    stored.push(*k);
                }
            }
        }
        stored
    }

    pub(super) fn prepare_load(&mut self, st: &mut ReqOffload, keys: &[(BlockDigest, usize)]) {
        for (k, _) in keys {
            if let Some(c) = self.chunks.get_mut(k) {
                if c.ref_cnt == 0 {
                    self.evictable.remove(&(c.rank, k.0));
                }
                c.ref_cnt += 1;
            }
        }
        self.record_access(st, keys);
    }

    pub(super) fn complete_load(&mut self, keys: &[BlockDigest]) {
        for k in keys {
            if let Some(c) = self.chunks.get_mut(k) {
                if c.ref_cnt > 0 {
                    c.ref_cnt -= 1;
                    if c.ref_cnt == 0 {
                        self.evictable.insert((c.rank, k.0));
                    }
                }
            }
        }
    }

    /// `on_request_finished` + `LRUCachePolicy.on_request_finished`: fresh ranks from the
    /// request's tail to its head over the chunks it touched that are still resident.
    pub(super) fn request_finished(&mut self, st: &mut ReqOffload) {
        let st = self.state(st);
        if st.finished {
            return;
        }
        st.finished = true;
        let mut keys: Vec<(usize, BlockDigest)> = st.seen.iter().map(|(k, p)| (*p, *k)).collect();
        keys.sort_unstable_by_key(|(p, _)| *p);
        for (_, k) in keys.into_iter().rev() {
            if self.chunks.contains_key(&k) {
                self.next_rank += 1;
                self.set_rank(&k, (self.next_rank, 0));
            }
        }
    }

    pub(super) fn reset(&mut self) {
        self.chunks.clear();
        self.evictable.clear();
        self.next_rank = 0;
        self.generation += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::hashing::hash_block;

    fn key(i: u32) -> BlockDigest {
        hash_block(None, &[i], None)
    }

    fn offer(pool: &mut CpuPool, st: &mut ReqOffload, ids: &[u32], ev: &mut Vec<KvEvent>) -> Option<Vec<BlockDigest>> {
        let keys: Vec<_> = ids.iter().enumerate().map(|(j, i)| (key(*i), (j + 1) * 16)).collect();
        pool.prepare_store(st, &keys, ev).map(|v| v.into_iter().map(|(k, _)| k).collect())
    }

    #[test]
    fn lru_evicts_finished_requests_tail_first_and_never_what_it_is_storing() {
        let mut pool = CpuPool::new(4);
        let mut ev = Vec::new();
        let (mut a, mut b) = (ReqOffload::default(), ReqOffload::default());
        let stored = offer(&mut pool, &mut a, &[1, 2], &mut ev).unwrap();
        assert!(pool.complete_store(&stored).len() == 2);
        pool.request_finished(&mut a);
        let stored = offer(&mut pool, &mut b, &[3, 4], &mut ev).unwrap();
        pool.complete_store(&stored);
        pool.request_finished(&mut b);
        assert!(ev.is_empty());
        // Most recent last: b's head, then a's head; tails before heads.
        let order: Vec<_> = pool.evictable.iter().map(|(_, k)| BlockDigest(*k)).collect();
        assert_eq!(order, vec![key(2), key(1), key(4), key(3)]);
        // A new request needs two chunks: a's tail then a's head go.
        let mut c = ReqOffload::default();
        let got = offer(&mut pool, &mut c, &[5, 6], &mut ev).unwrap();
        assert_eq!(got, vec![key(5), key(6)]);
        assert_eq!(
            ev,
            vec![KvEvent::BlockRemoved { block_hashes: vec![key(2).engine_hash(), key(1).engine_hash()], medium: Medium::Cpu }]
        );
        assert_eq!(pool.lookup(&key(5)), Lookup::Pending, "written chunks are not readable yet");
        // Pinned (loading) and being-written chunks are not evictable: nothing is evicted.
        pool.prepare_load(&mut c, &[(key(3), 16), (key(4), 32)]);
        ev.clear();
        let mut d = ReqOffload::default();
        assert!(offer(&mut pool, &mut d, &[7], &mut ev).is_none());
        assert!(ev.is_empty());
        // Offered keys are protected even when they are the LRU ones.
        pool.complete_load(&[key(3), key(4)]);
        assert!(offer(&mut pool, &mut d, &[3, 7], &mut ev).is_some());
        assert_eq!(ev, vec![KvEvent::BlockRemoved { block_hashes: vec![key(4).engine_hash()], medium: Medium::Cpu }]);
    }

    #[test]
    fn reuse_refreshes_recency_and_reset_forgets_everything() {
        let mut pool = CpuPool::new(3);
        let mut ev = Vec::new();
        let (mut a, mut b) = (ReqOffload::default(), ReqOffload::default());
        for (st, ids) in [(&mut a, [1u32, 2]), (&mut b, [3, 4])] {
            if let Some(s) = offer(&mut pool, st, &ids[..1], &mut ev) {
                pool.complete_store(&s);
            }
            pool.request_finished(st);
        }
        // key(1) then key(3) are cached; a reuse of key(1) by c makes key(3) the LRU one.
        let mut c = ReqOffload::default();
        assert_eq!(offer(&mut pool, &mut c, &[1], &mut ev), Some(vec![]));
        pool.request_finished(&mut c);
        let order: Vec<_> = pool.evictable.iter().map(|(_, k)| BlockDigest(*k)).collect();
        assert_eq!(order, vec![key(3), key(1)]);
        pool.reset();
        assert!(pool.chunks.is_empty() && pool.evictable.is_empty());
        assert_eq!(pool.lookup(&key(1)), Lookup::Miss);
    }
}
