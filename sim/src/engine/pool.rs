//! The paged KV block pool with prefix caching, mirroring vLLM's `BlockPool`.
//!
//! Invariants (as in vLLM): block 0 is the null block and never handed out; a block with
//! `ref_cnt > 0` is pinned by a running request and never evicted; every block with
//! `ref_cnt == 0` sits in the free queue. Freed blocks that carry a hash keep it (they stay
//! cached) and go to the tail of the queue; blocks without a hash go to the head. Allocation
//! pops from the head, evicting the popped block's hash, so cached blocks leave in
//! least-recently-freed order (LRU). Evictions and insertions are reported as events.

use super::event::{KvEvent, Medium};
use crate::ids::{BlockDigest, BlockId, EngineHash};
use std::collections::HashMap;

const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Block {
    ref_cnt: u32,
    hash: Option<BlockDigest>,
    prev: u32,
    next: u32,
}

/// A fixed pool of `num_blocks` blocks (including the null block).
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: usize,
    /// vLLM keeps a multimap: the same hash may live in several blocks.
    cached: HashMap<BlockDigest, Vec<BlockId>>,
}

impl BlockPool {
    pub fn new(num_blocks: usize) -> Self {
        let n = num_blocks.max(2);
        let blocks = (0..n).map(|_| Block { ref_cnt: 0, hash: None, prev: NIL, next: NIL }).collect();
        let mut pool = BlockPool { blocks, head: NIL, tail: NIL, num_free: 0, cached: HashMap::new() };
        pool.blocks[0].ref_cnt = 1; // null block: permanently "used"
        for i in 1..n as u32 {
            pool.push_back(i);
        }
        pool
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// vLLM's `get_usage`: fraction of non-null blocks not in the free queue.
    pub fn usage(&self) -> f64 {
        let total = self.blocks.len() - 1;
        1.0 - self.num_free as f64 / total as f64
    }

    pub fn get_cached(&self, digest: &BlockDigest) -> Option<BlockId> {
        self.cached.get(digest).and_then(|v| v.first().copied())
    }

    pub fn is_free(&self, id: BlockId) -> bool {
        self.blocks[id.0 as usize].ref_cnt == 0
    }

    /// Pin blocks hit by a new request, taking them out of the free queue.
    pub fn touch(&mut self, ids: &[BlockId]) {
        for id in ids {
            if self.blocks[id.0 as usize].ref_cnt == 0 {
                self.unlink(id.0);
            }
            self.blocks[id.0 as usize].ref_cnt += 1;
        }
    }

    /// Pop `n` blocks from the head of the free queue, evicting their cached hashes.
    /// Returns None (allocating nothing) if fewer than `n` are free.
    pub fn allocate(&mut self, n: usize, events: &mut Vec<KvEvent>) -> Option<Vec<BlockId>> {
        if n > self.num_free {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.head;
            self.unlink(id);
            if let Some(digest) = self.blocks[id as usize].hash.take() {
                self.remove_cached(&digest, BlockId(id));
                events.push(KvEvent::BlockRemoved { block_hashes: vec![digest.engine_hash()], medium: Medium::Gpu });
            }
            self.blocks[id as usize].ref_cnt = 1;
            out.push(BlockId(id));
        }
        Some(out)
    }

    /// Release blocks ordered by eviction priority (first = evicted first).
    pub fn free(&mut self, ordered: impl IntoIterator<Item = BlockId>) {
        let mut uncached = Vec::new();
        for id in ordered {
            let b = &mut self.blocks[id.0 as usize];
            debug_assert!(b.ref_cnt > 0, "double free of {id:?}");
            b.ref_cnt = b.ref_cnt.saturating_sub(1);
            if b.ref_cnt == 0 {
                if b.hash.is_some() {
                    self.push_back(id.0);
                } else {
                    uncached.push(id.0);
                }
            }
        }
        // prepend_n keeps the given order at the head of the queue.
        for id in uncached.into_iter().rev() {
            self.push_front(id);
        }
    }

    /// Give a full, computed block its hash so later requests can hit it.
    pub fn cache_block(&mut self, id: BlockId, digest: BlockDigest) {
        let b = &mut self.blocks[id.0 as usize];
        if b.hash == Some(digest) {
            return;
        }
        debug_assert!(b.hash.is_none());
        b.hash = Some(digest);
        self.cached.entry(digest).or_default().push(id);
    }

    /// vLLM's `reset_prefix_cache`: only succeeds when no block is in use.
    pub fn reset_prefix_cache(&mut self, events: &mut Vec<KvEvent>) -> bool {
        if self.num_free != self.blocks.len() - 1 {
            return false;
        }
        self.cached.clear();
        for b in &mut self.blocks {
            b.hash = None;
        }
        events.push(KvEvent::AllBlocksCleared);
        true
    }

    /// The set of engine hashes currently cached (what a subscriber should hold).
    pub fn cached_hashes(&self) -> Vec<EngineHash> {
        let mut v: Vec<EngineHash> = self.cached.keys().map(|d| d.engine_hash()).collect();
        v.sort_unstable();
        v
    }

    pub fn num_cached_blocks(&self) -> usize {
        self.cached.values().map(Vec::len).sum()
    }

    /// Cached hashes in eviction order (head of the free queue first); test/debug aid.
    pub fn eviction_order(&self) -> Vec<EngineHash> {
        let mut out = Vec::new();
        let mut cur = self.head;
        while cur != NIL {
            if let Some(d) = self.blocks[cur as usize].hash {
                out.push(d.engine_hash());
            }
            cur = self.blocks[cur as usize].next;
        }
        out
    }

    fn remove_cached(&mut self, digest: &BlockDigest, id: BlockId) {
        if let Some(v) = self.cached.get_mut(digest) {
            v.retain(|b| *b != id);
            if v.is_empty() {
                self.cached.remove(digest);
            }
        }
    }

    fn unlink(&mut self, id: u32) {
        let (prev, next) = (self.blocks[id as usize].prev, self.blocks[id as usize].next);
        if prev == NIL { self.head = next } else { self.blocks[prev as usize].next = next }
        if next == NIL { self.tail = prev } else { self.blocks[next as usize].prev = prev }
        self.blocks[id as usize].prev = NIL;
        self.blocks[id as usize].next = NIL;
        self.num_free -= 1;
    }

    fn push_back(&mut self, id: u32) {
        self.blocks[id as usize].prev = self.tail;
        self.blocks[id as usize].next = NIL;
        if self.tail == NIL { self.head = id } else { self.blocks[self.tail as usize].next = id }
        self.tail = id;
        self.num_free += 1;
    }

    fn push_front(&mut self, id: u32) {
        self.blocks[id as usize].next = self.head;
        self.blocks[id as usize].prev = NIL;
        if self.head == NIL { self.tail = id } else { self.blocks[self.head as usize].prev = id }
        self.head = id;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::hashing::hash_block;

    fn digest(i: u32) -> BlockDigest {
        hash_block(None, &[i], None)
    }

    #[test]
    fn freed_cached_blocks_are_evicted_lru_and_pinned_never() {
        let mut pool = BlockPool::new(5); // 4 usable
        let mut ev = Vec::new();
        let ids = pool.allocate(4, &mut ev).unwrap();
        for (i, id) in ids.iter().enumerate() {
            pool.cache_block(*id, digest(i as u32));
        }
        // free 2 then 0; keep 1 and 3 pinned.
        pool.free([ids[2]]);
        pool.free([ids[0]]);
        assert_eq!(pool.eviction_order(), vec![digest(2).engine_hash(), digest(0).engine_hash()]);
        let got = pool.allocate(1, &mut ev).unwrap();
        assert_eq!(got, vec![ids[2]]);
        assert_eq!(ev, vec![KvEvent::BlockRemoved { block_hashes: vec![digest(2).engine_hash()], medium: Medium::Gpu }]);
        assert!(pool.allocate(2, &mut ev).is_none(), "pinned blocks are not evictable");
        assert_eq!(pool.get_cached(&digest(1)), Some(ids[1]));
    }

    #[test]
    fn touch_removes_from_free_queue_and_usage_tracks() {
        let mut pool = BlockPool::new(3);
        let mut ev = Vec::new();
        let ids = pool.allocate(2, &mut ev).unwrap();
        assert_eq!(pool.usage(), 1.0);
        pool.cache_block(ids[0], digest(7));
        pool.free(ids.iter().rev().copied());
        assert_eq!(pool.usage(), 0.0);
        pool.touch(&[ids[0]]);
        assert_eq!(pool.num_free(), 1);
        assert!(!pool.reset_prefix_cache(&mut ev));
        pool.free([ids[0]]);
        assert!(pool.reset_prefix_cache(&mut ev));
        assert_eq!(ev.last(), Some(&KvEvent::AllBlocksCleared));
        assert!(pool.cached_hashes().is_empty());
    }
}
