//! vLLM 0.33's KV offloading to CPU (`--kv-offloading-size` with the native backend, i.e.
//! the `OffloadingConnector` over `CPUOffloadingManager` with the LRU policy), modelled at
//! the scheduler level: which chunks the CPU pool holds, when they are stored, loaded and
//! evicted, what the copies cost and which KV events they publish. The files it follows:
//!
//! - `distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`
//!   (`OffloadingConnectorScheduler`): stores are write-through, not on GPU eviction: after
//!   each scheduling step `_build_store_jobs` offers every newly computed full block of a
//!   scheduled request (from `next_stored_chunk_idx`, prompt tokens only, since
//!   `offload_prompt_only` defaults to True) to `prepare_store`; a request that loaded from
//!   the CPU skips its hit chunks, one that did not re-offers them (resident ones count as
//!   reuse, missing ones are stored again). A lookup (`get_num_new_matched_tokens` /
//!   `_lookup_complete_chunks`) continues after the GPU hit with the longest run of chunks
//!   the pool holds, up to all of the request's tokens; it is deferred (the request skipped
//!   this step) while one of them is still being written, while another request loads one
//!   of them, or while the request has stores in flight.
//! - `v1/kv_offload/cpu/manager.py` (`CPUOffloadingManager`): `prepare_store` allocates
//!   chunks (written, not yet readable), evicting as many evictable chunks as it lacks
//!   (never ones offered in the same call; nothing at all when it cannot evict enough) and
//!   reporting them as one removal; `complete_store` makes them readable and reports them
//!   stored; `prepare_load` pins chunks until `complete_load`.
//! - `v1/kv_offload/cpu/policies/lru.py` (`LRUCachePolicy`): recency is a rank
//!   `(request rank, -position)` while a request is active (its tail evicted before its
//!   head), then at request finish fresh ranks tail-to-head over every chunk it stored or
//!   reused, so its head is the most recent. The smallest rank among evictable chunks goes.
//! - `v1/kv_offload/cpu/gpu_worker.py` (`SingleDirectionOffloadingHandler`): transfers run
//!   in submission order, one direction at a time, beside the model's forward pass. A load
//!   is submitted as its step starts; a store at the start of the step after the one that
//!   computed it (`OffloadingConnectorWorker.prepare_store_kv` defers it). Completions are
//!   noticed at the end of a step (`get_finished`), and a loaded request is scheduled from
//!   the next one (`WAITING_FOR_REMOTE_KVS` in `v1/core/sched/scheduler.py`).
//! - `offloading/events.py` (`OffloadingEventsTracker`): the CPU tier's `BlockStored` is by
//!   default a placeholder per chunk (its hash, no parent, no tokens, `block_size` 0); with
//!   `self_describing_kv_events` it carries the chunk's tokens, parent and block size and
//!   `kv_cache_spec_kind`. Removals list every chunk of one eviction. Both say `medium: CPU`.
//!
//! One chunk is one GPU block (`blocks_per_chunk` 1, vLLM's default), keyed by the block's
//! hash, so CPU events carry the same hashes as the GPU's.

mod pool;

pub(crate) use pool::ReqOffload;

use super::event::{KvEvent, Medium};
use super::request::Request;
use crate::ids::{BlockDigest, BlockId, EngineHash, RequestId};
use pool::{CpuPool, Lookup, Payload};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};

/// A worker's CPU offload tier. `cpu_blocks == 0` (the default) turns it off.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OffloadConfig {
    /// CPU pool size in blocks (vLLM: `cpu_bytes_to_use` / bytes per block, rounded down).
    pub cpu_blocks: usize,
    /// Host-to-device copy bandwidth, GB/s (1e9 bytes): what a reload costs.
    pub h2d_gb_per_s: f64,
    /// Device-to-host copy bandwidth, GB/s: how long a store takes to become loadable.
    pub d2h_gb_per_s: f64,
    /// vLLM's `kv_connector_extra_config["self_describing_kv_events"]` (default off).
    pub self_describing_events: bool,
}

impl Default for OffloadConfig {
    /// Off; when on, an L40S's PCIe 4.0 x16 link (32 GB/s per direction) at the ~25 GB/s
    /// pinned-memory copies achieve.
    fn default() -> Self {
        OffloadConfig { cpu_blocks: 0, h2d_gb_per_s: 25.0, d2h_gb_per_s: 25.0, self_describing_events: false }
    }
}

impl OffloadConfig {
    pub fn enabled(&self) -> bool {
        self.cpu_blocks > 0
    }

    /// Unscaled seconds to reload one token's KV from the CPU tier.
    pub fn reload_s_per_token(&self, kv_bytes_per_token: u64) -> f64 {
        kv_bytes_per_token as f64 / (self.h2d_gb_per_s.max(1e-9) * 1e9)
    }

    /// Unscaled seconds to store one token's KV into the CPU tier.
    pub fn store_s_per_token(&self, kv_bytes_per_token: u64) -> f64 {
        kv_bytes_per_token as f64 / (self.d2h_gb_per_s.max(1e-9) * 1e9)
    }
}

/// Where a request's CPU load stands while it waits holding its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoadState {
    InFlight,
    /// Copied; the next scheduling step caches the blocks and schedules the rest.
    Done,
    /// Blocks cached on the GPU; waiting for scheduling room.
    Promoted,
}

#[derive(Debug)]
struct StoreJob {
    req: RequestId,
    keys: Vec<BlockDigest>,
    /// GPU blocks it copies from (watched for reuse once the request is gone).
    src: Vec<BlockId>,
    done_at: f64,
    /// The request finished: a reallocation of `src` forces a flush.
    fenced: bool,
    /// The worker waits for this job before the step's forward pass.
    flush: bool,
}

#[derive(Debug)]
struct LoadJob {
    req: RequestId,
    keys: Vec<BlockDigest>,
    done_at: f64,
    generation: u64,
    /// Blocks of a request aborted while loading, freed when the copy lands.
    orphan: Option<Vec<BlockId>>,
}

/// A store built this step, not yet on the copy queue.
#[derive(Debug)]
pub(crate) struct NewStore {
    req: RequestId,
    keys: Vec<BlockDigest>,
    src: Vec<BlockId>,
    /// The request is gone: its blocks are free, watch them for reuse.
    pub fenced: bool,
    /// Flush at once (a gone request whose blocks were just reallocated).
    pub flush: bool,
}

impl NewStore {
    pub fn src(&self) -> &[BlockId] {
        &self.src
    }
}

/// A load that landed this step.
#[derive(Debug)]
pub(crate) struct LandedLoad {
    pub req: RequestId,
    /// Set when the request was aborted while loading: free these blocks.
    pub orphan: Option<Vec<BlockId>>,
}

/// Counters the tier keeps about itself (reported in `/sim/state`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct OffloadStats {
    pub stored_blocks: u64,
    pub evicted_blocks: u64,
    pub loaded_blocks: u64,
    /// `prepare_store` could not make room (vLLM's allocation failures).
    pub store_failures: u64,
}

/// The CPU tier of one engine: pool, copy queues and the CPU events of the current step.
#[derive(Debug)]
pub(crate) struct CpuTier {
    block_size: usize,
    self_describing: bool,
    /// Wall seconds per token (time scale applied).
    reload_s_per_token: f64,
    store_s_per_token: f64,
    pool: CpuPool,
    stores: VecDeque<StoreJob>,
    loads: VecDeque<LoadJob>,
    h2d_free_at: f64,
    d2h_free_at: f64,
    inflight_stores: HashMap<RequestId, u32>,
    being_loaded: HashSet<BlockDigest>,
    pub stats: OffloadStats,
}

impl CpuTier {
    pub fn new(cfg: &OffloadConfig, block_size: usize, kv_bytes_per_token: u64, time_scale: f64) -> Self {
        CpuTier {
            block_size,
            self_describing: cfg.self_describing_events,
            reload_s_per_token: cfg.reload_s_per_token(kv_bytes_per_token) * time_scale,
            store_s_per_token: cfg.store_s_per_token(kv_bytes_per_token) * time_scale,
            pool: CpuPool::new(cfg.cpu_blocks),
            stores: VecDeque::new(),
            loads: VecDeque::new(),
            h2d_free_at: 0.0,
            d2h_free_at: 0.0,
            inflight_stores: HashMap::new(),
            being_loaded: HashSet::new(),
            stats: OffloadStats::default(),
        }
    }

    /// Tokens the CPU tier can supply after `local` GPU-hit tokens; None defers the request
    /// (`get_num_new_matched_tokens` returning None).
    pub fn lookup(&self, r: &Request, local: usize) -> Option<usize> {
        if self.inflight_stores.contains_key(&r.id) {
            return None;
        }
        let bs = self.block_size;
        let keys = &r.hashes;
        let max_hit = r.tokens.len().min(keys.len() * bs);
        if max_hit < local + bs {
            return Some(0);
        }
        let start = local / bs;
        let end = max_hit.div_ceil(bs).min(keys.len());
        let mut hits = 0;
        let mut pending = false;
        for k in &keys[start..end] {
            match self.pool.lookup(k) {
                Lookup::Hit => hits += 1,
                Lookup::Pending => {
                    hits += 1;
                    pending = true;
                }
                Lookup::Miss => break,
            }
        }
        if pending {
            return None;
        }
        let hit_tokens = max_hit.min(bs * (start + hits)).saturating_sub(local);
        if hit_tokens < bs {
            return Some(0);
        }
        let last = (local + hit_tokens).div_ceil(bs);
        if keys[start..last].iter().any(|k| self.being_loaded.contains(k)) {
            return None;
        }
        Some(hit_tokens)
    }

    /// Pin chunks `first..end` of `r` and queue their copy to the GPU at `now`.
    pub fn start_load(&mut self, r: &mut Request, first: usize, end: usize, now: f64) {
        let bs = self.block_size;
        let keys: Vec<(BlockDigest, usize)> = (first..end).map(|j| (r.hashes[j], (j + 1) * bs)).collect();
        self.pool.prepare_load(&mut r.offload, &keys);
        let start = now.max(self.h2d_free_at);
        let done_at = start + ((end - first) * bs) as f64 * self.reload_s_per_token;
        self.h2d_free_at = done_at;
        self.being_loaded.extend(keys.iter().map(|(k, _)| *k));
        self.stats.loaded_blocks += (end - first) as u64;
        self.loads.push_back(LoadJob {
            req: r.id,
            keys: keys.into_iter().map(|(k, _)| k).collect(),
            done_at,
            generation: self.pool.generation,
            orphan: None,
        });
    }

    /// `_build_store_jobs` for one request whose first `offloadable` tokens are computed:
    /// offer the chunks not offered yet; the store to queue, if any.
    pub fn offer(&mut self, r: &mut Request, offloadable: usize, events: &mut Vec<KvEvent>) -> Option<NewStore> {
        let bs = self.block_size;
        let num_chunks = (offloadable / bs).min(r.blocks.len()).min(r.hashes.len());
        let start = r.offload.next_stored_chunk;
        if num_chunks <= start {
            return None;
        }
        let offered: Vec<(BlockDigest, usize)> = (start..num_chunks).map(|j| (r.hashes[j], (j + 1) * bs)).collect();
        let before = events.len();
        let Some(to_store) = self.pool.prepare_store(&mut r.offload, &offered, events) else {
            self.stats.store_failures += 1;
            return None;
        };
        self.stats.evicted_blocks += events[before..]
            .iter()
            .map(|e| match e {
                KvEvent::BlockRemoved { block_hashes, .. } => block_hashes.len() as u64,
                _ => 0,
            })
            .sum::<u64>();
        r.offload.next_stored_chunk = num_chunks;
        if to_store.is_empty() {
            return None;
        }
        let mut src = Vec::with_capacity(to_store.len());
        for &(k, pos) in &to_store {
            let j = pos / bs - 1;
            src.push(r.blocks[j]);
            if self.self_describing {
                let payload = Payload {
                    parent: j.checked_sub(1).map(|p| r.hashes[p].engine_hash()),
                    tokens: r.tokens[j * bs..(j + 1) * bs].to_vec(),
                };
                if let Some(c) = self.pool.chunks.get_mut(&k) {
                    c.payload = Some(payload);
                }
            }
        }
        Some(NewStore { req: r.id, keys: to_store.into_iter().map(|(k, _)| k).collect(), src, fenced: false, flush: false })
    }

    /// Put a store on the device-to-host queue, starting no earlier than `at`.
    pub fn submit_store(&mut self, job: NewStore, at: f64) {
        let start = at.max(self.d2h_free_at);
        let done_at = start + (job.keys.len() * self.block_size) as f64 * self.store_s_per_token;
        self.d2h_free_at = done_at;
        *self.inflight_stores.entry(job.req).or_default() += 1;
        self.stores.push_back(StoreJob {
            req: job.req,
            keys: job.keys,
            src: job.src,
            done_at,
            fenced: job.fenced,
            flush: job.flush,
        });
    }

    /// A preempted request's stores in flight are flushed (`handle_preemptions`).
    pub fn on_preempt(&mut self, id: RequestId) {
        self.stores.iter_mut().filter(|j| j.req == id).for_each(|j| j.flush = true);
    }

    /// A finished request's stores in flight copy from freed blocks: fence them.
    pub fn on_request_done(&mut self, id: RequestId) {
        self.stores.iter_mut().filter(|j| j.req == id).for_each(|j| j.fenced = true);
    }

    /// Fenced stores whose source blocks were just reallocated are flushed.
    pub fn flush_reallocated(&mut self, allocated: &HashSet<BlockId>) {
        if allocated.is_empty() {
            return;
        }
        for j in self.stores.iter_mut().filter(|j| j.fenced && !j.flush) {
            j.flush = j.src.iter().any(|b| allocated.contains(b));
        }
    }

    /// When the last flushed store lands (the step's forward pass waits for it).
    pub fn flush_until(&mut self) -> Option<f64> {
        let mut until: Option<f64> = None;
        for j in self.stores.iter_mut().filter(|j| j.flush) {
            j.flush = false;
            until = Some(until.map_or(j.done_at, |u| u.max(j.done_at)));
        }
        until
    }

    /// vLLM's `on_request_finished` for a request that is gone (finished or aborted).
    pub fn request_finished(&mut self, r: &mut Request) {
        self.pool.request_finished(&mut r.offload);
    }

    /// Apply every copy that has landed by `end`: stored chunks become loadable (and are
    /// reported), loads release their chunks. Returns the landed loads.
    pub fn complete(&mut self, end: f64, events: &mut Vec<KvEvent>) -> Vec<LandedLoad> {
        let end = end + 1e-12;
        while self.stores.front().is_some_and(|j| j.done_at <= end) {
            let Some(job) = self.stores.pop_front() else { break };
            if let Some(n) = self.inflight_stores.get_mut(&job.req) {
                *n -= 1;
                if *n == 0 {
                    self.inflight_stores.remove(&job.req);
                }
            }
            let stored = self.pool.complete_store(&job.keys);
            self.stats.stored_blocks += stored.len() as u64;
            for k in stored {
                events.push(self.stored_event(&k));
            }
        }
        let mut landed = Vec::new();
        while self.loads.front().is_some_and(|j| j.done_at <= end) {
            let Some(job) = self.loads.pop_front() else { break };
            if job.generation == self.pool.generation {
                self.pool.complete_load(&job.keys);
                for k in &job.keys {
                    self.being_loaded.remove(k);
                }
            }
            landed.push(LandedLoad { req: job.req, orphan: job.orphan });
        }
        landed
    }

    fn stored_event(&self, k: &BlockDigest) -> KvEvent {
        let payload = self.pool.chunks.get(k).and_then(|c| c.payload.as_ref()).filter(|_| self.self_describing);
        match payload {
            Some(p) => KvEvent::BlockStored {
                block_hashes: vec![k.engine_hash()],
                parent_block_hash: p.parent,
                token_ids: p.tokens.clone(),
                block_size: self.block_size as u32,
                extra_keys: None,
                medium: Medium::Cpu,
                kv_cache_spec_kind: Some("full_attention"),
            },
            None => KvEvent::BlockStored {
                block_hashes: vec![k.engine_hash()],
                parent_block_hash: None,
                token_ids: Vec::new(),
                block_size: 0,
                extra_keys: None,
                medium: Medium::Cpu,
                kv_cache_spec_kind: self.self_describing.then_some("full_attention"),
            },
        }
    }

    /// A request aborted while its load is in flight: its blocks are freed when it lands.
    pub fn orphan_load(&mut self, id: RequestId, blocks: Vec<BlockId>) -> Option<Vec<BlockId>> {
        match self.loads.iter_mut().find(|j| j.req == id) {
            Some(job) => {
                job.orphan = Some(blocks);
                None
            }
            None => Some(blocks),
        }
    }

    pub fn has_inflight(&self) -> bool {
        !self.stores.is_empty() || !self.loads.is_empty()
    }

    /// When the next copy lands.
    pub fn next_done(&self) -> Option<f64> {
        let s = self.stores.front().map(|j| j.done_at);
        let l = self.loads.front().map(|j| j.done_at);
        match (s, l) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// `reset_prefix_cache(reset_connector=True)`: the pool is emptied without events;
    /// stores in flight are dropped, loads still land for their requests.
    pub fn reset(&mut self) {
        self.pool.reset();
        self.stores.clear();
        self.inflight_stores.clear();
        self.being_loaded.clear();
    }

    /// Engine hashes of the chunks a subscriber has seen stored (readable ones), sorted.
    pub fn cached_hashes(&self) -> Vec<EngineHash> {
        let mut v: Vec<EngineHash> =
            self.pool.chunks.iter().filter(|(_, c)| c.ref_cnt >= 0).map(|(k, _)| k.engine_hash()).collect();
        v.sort_unstable();
        v
    }

    /// Chunks the pool holds (written or being written).
    pub fn num_used(&self) -> usize {
        self.pool.chunks.len()
    }

    /// Cached hashes in eviction order (first evicted first); test/debug aid.
    pub fn eviction_order(&self) -> Vec<EngineHash> {
        self.pool.evictable.iter().map(|(_, k)| BlockDigest(*k).engine_hash()).collect()
    }
}
