//! Reuse bounds of a workload, independent of any routing policy: how much of its prompt
//! could be served from a prefix cache at all, and how much with the fleet's KV memory.
//!
//! Both work on the workload's requests in arrival order, each as the chained keys of its
//! full `block_size`-token blocks (a key names the block *and* everything before it, like
//! vLLM's block hashes), of which the first `lookup` = floor((prompt - 1) / block_size)
//! can be hits — the engines' own rule (at least the last prompt token is computed).
//!
//! - [`infinite_cache`]: a block hits when an earlier request had the same key. No
//!   eviction, no placement: the workload's ceiling.
//! - [`oracle`]: one cache of the fleet's total KV capacity, evicted by Belady's MIN with
//!   bypass (on each access keep the blocks whose next counted use is soonest; a block whose
//!   next access cannot score is dropped). Hits are counted per block, not only as a
//!   leading prefix. This is an **upper bound** on first-scheduling reuse for any router
//!   and any eviction on the real fleet: whatever the workers hold at any moment is at most
//!   the fleet's capacity in distinct blocks, so a single pooled cache could hold it too,
//!   and MIN is optimal for a pooled cache of uniform blocks (the greedy for the maximum
//!   C-colourable set of reuse intervals); a prefix hit is a block hit. Running requests'
//!   pinned blocks, per-worker fragmentation and preemption only lower what the fleet gets.
//!   Caveat: it takes the workload's arrival order; a worker schedules FIFO, so reordering
//!   only comes from timing across workers, which cannot create hits on one worker.
//! - [`pooled_lru`]: the same pooled cache with vLLM-style LRU (a request's leading blocks
//!   most recent) and leading-prefix hits: what one engine with the whole fleet's memory
//!   would reuse. An estimate, not a bound.

pub mod blocks;
pub mod capacity;

use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};

pub use blocks::{block_requests, Ordering};
pub use capacity::Capacity;

/// One request as the bounds see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRequest {
    pub prompt_tokens: usize,
    /// Chained keys of the full blocks this request leaves in the cache, in order: its
    /// prompt's, then (multi-turn) its answer's when a later prompt contains the answer.
    pub blocks: Vec<u64>,
    /// How many leading `blocks` can be hits: floor((prompt_tokens - 1) / block_size).
    pub lookup: usize,
}

/// Hit tokens out of prompt tokens.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    pub hit_tokens: u64,
    pub prompt_tokens: u64,
    pub share: Option<f64>,
}

impl Figure {
    fn new(hit_blocks: u64, block_size: usize, reqs: &[BlockRequest]) -> Figure {
        let prompt_tokens: u64 = reqs.iter().map(|r| r.prompt_tokens as u64).sum();
        let hit_tokens = hit_blocks * block_size as u64;
        Figure { hit_tokens, prompt_tokens, share: (prompt_tokens > 0).then(|| hit_tokens as f64 / prompt_tokens as f64) }
    }
}

/// Blocks of `r` that can be hits.
fn lookup(r: &BlockRequest) -> &[u64] {
    &r.blocks[..r.lookup.min(r.blocks.len())]
}

/// Every lookup block whose key appeared in an earlier request (prompt or answer).
pub fn infinite_cache(reqs: &[BlockRequest], block_size: usize) -> Figure {
    let mut seen: HashSet<u64> = HashSet::new();
    let mut hits = 0u64;
    for r in reqs {
        hits += lookup(r).iter().filter(|k| seen.contains(k)).count() as u64;
        seen.extend(r.blocks.iter().copied());
    }
    Figure::new(hits, block_size, reqs)
}

/// Belady's MIN with bypass on one cache of `capacity_blocks`, hits counted per block.
pub fn oracle(reqs: &[BlockRequest], capacity_blocks: u64, block_size: usize) -> Figure {
    // The access stream: (key, counted). Counted = a lookup block (a hit scores).
    let stream: Vec<(u64, bool)> =
        reqs.iter().flat_map(|r| r.blocks.iter().enumerate().map(move |(j, &k)| (k, j < r.lookup))).collect();
    // next[i]: the position of key i's next access if that access is counted, else NEVER
    // (an uncounted access loads the block for free, so holding it until then is worthless).
    const NEVER: usize = usize::MAX;
    let mut next = vec![NEVER; stream.len()];
    let mut later: HashMap<u64, usize> = HashMap::new();
    for (i, &(k, _)) in stream.iter().enumerate().rev() {
        if let Some(&j) = later.get(&k) {
            next[i] = if stream[j].1 { j } else { NEVER };
        }
        later.insert(k, i);
    }
    let cap = usize::try_from(capacity_blocks).unwrap_or(usize::MAX);
    let mut cached: HashMap<u64, usize> = HashMap::new(); // key -> next counted use
    let mut by_next: BTreeSet<(usize, u64)> = BTreeSet::new();
    let mut hits = 0u64;
    for (i, &(k, counted)) in stream.iter().enumerate() {
        if let Some(n) = cached.remove(&k) {
            by_next.remove(&(n, k));
            hits += u64::from(counted);
        }
        let n = next[i];
        if n == NEVER || cap == 0 {
            continue;
        }
        if cached.len() >= cap {
            match by_next.last().copied() {
                Some((far, victim)) if far > n => {
                    by_next.remove(&(far, victim));
                    cached.remove(&victim);
                }
                _ => continue, // bypass: every cached block is needed sooner
            }
        }
        cached.insert(k, n);
        by_next.insert((n, k));
    }
    Figure::new(hits, block_size, reqs)
}

/// One LRU cache of `capacity_blocks`; a request hits its longest cached leading prefix,
/// then all its blocks become most recent, leading blocks last evicted (as vLLM frees a
/// finished request's blocks tail first).
pub fn pooled_lru(reqs: &[BlockRequest], capacity_blocks: u64, block_size: usize) -> Figure {
    let cap = usize::try_from(capacity_blocks).unwrap_or(usize::MAX);
    let mut stamp_of: HashMap<u64, u64> = HashMap::new();
    let mut by_stamp: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut clock = 0u64;
    let mut hits = 0u64;
    for r in reqs {
        hits += lookup(r).iter().take_while(|k| stamp_of.contains_key(k)).count() as u64;
        if cap == 0 {
            continue;
        }
        for &k in r.blocks.iter().rev() {
            clock += 1;
            if let Some(old) = stamp_of.insert(k, clock) {
                by_stamp.remove(&(old, k));
            } else if stamp_of.len() > cap {
                if let Some((_, victim)) = by_stamp.pop_first() {
                    stamp_of.remove(&victim);
                }
            }
            by_stamp.insert((clock, k));
        }
    }
    Figure::new(hits, block_size, reqs)
}

/// The bounds of one workload, as report.json carries them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReuseBounds {
    pub block_size: usize,
    pub requests: usize,
    /// `arrival`: the order requests will be sent (single-turn sessions); `estimated`:
    /// multi-turn sessions, whose interleaving depends on latencies, taken turn after turn.
    pub ordering: Ordering,
    /// Chat mode: words stand in for tokens, so the figures are approximate.
    pub approximate: bool,
    pub capacity: Capacity,
    /// Share of prompt tokens whose block-size prefix was seen earlier in the workload.
    pub infinite_cache: Figure,
    /// Upper bound with the fleet's KV capacity (pooled cache, Belady MIN, per-block hits).
    pub oracle: Figure,
    /// Estimate: one LRU cache of the fleet's capacity, leading-prefix hits.
    pub pooled_lru: Figure,
    pub method: String,
}

pub const METHOD: &str = "arrival-order requests as chained block keys; lookup = floor((prompt-1)/block) blocks; \
infinite_cache: key seen earlier; oracle: one cache of the fleet's KV capacity, Belady MIN with bypass, per-block hits \
(upper bound); pooled_lru: same cache, LRU, leading-prefix hits (estimate)";

/// All three figures for `reqs` with `capacity`.
pub fn compute(reqs: &[BlockRequest], ordering: Ordering, approximate: bool, capacity: Capacity) -> ReuseBounds {
    let bs = capacity.block_size;
    let blocks = capacity.total_blocks();
    ReuseBounds {
        block_size: bs,
        requests: reqs.len(),
        ordering,
        approximate,
        infinite_cache: infinite_cache(reqs, bs),
        oracle: oracle(reqs, blocks, bs),
        pooled_lru: pooled_lru(reqs, blocks, bs),
        capacity,
        method: METHOD.to_string(),
    }
}

/// The bounds of `workload` (seeded answer stand-ins, see [`blocks`]) with `capacity`.
pub fn of_workload(workload: &crate::workload::Workload, seed: u64, capacity: Capacity) -> ReuseBounds {
    let (reqs, ordering, approximate) = block_requests(workload, capacity.block_size, seed);
    compute(&reqs, ordering, approximate, capacity)
}

impl ReuseBounds {
    /// One line for the table's footer and the run log.
    pub fn summary(&self) -> String {
        let pct = |f: &Figure| f.share.map_or("n/a".into(), |s| format!("{:.1}%", s * 100.0));
        format!(
            "workload reuse bounds ({} requests, {}-token blocks, {} order{}): infinite cache {}; oracle {} with {} tokens of KV ({}); pooled LRU estimate {}",
            self.requests,
            self.block_size,
            match self.ordering {
                Ordering::Arrival => "arrival",
                Ordering::Estimated => "estimated",
            },
            if self.approximate { ", words as tokens" } else { "" },
            pct(&self.infinite_cache),
            pct(&self.oracle),
            self.capacity.total_tokens(),
            self.capacity.source,
            pct(&self.pooled_lru),
        )
    }
}

#[cfg(test)]
mod tests;
