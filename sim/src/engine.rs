//! A pure, deterministic model of one vLLM engine core: paged KV cache with prefix caching,
//! continuous batching with chunked prefill, preemption under memory pressure, and a
//! step-time model.
//!
//! Nothing here sleeps or reads a clock: the caller passes `now` (seconds) into `add_request`
//! and `step`, and `step` returns how long that step takes. The worker task (`worker.rs`)
//! sleeps for that long in real time; tests simply call `step` in a loop. Scheduling follows
//! vLLM v1: running requests first (decodes and unfinished chunked prefills, FCFS), then
//! waiting requests while the token budget, `max_num_seqs` and free blocks allow; when a
//! running request needs a block and none is free, the last running request is preempted
//! (its blocks freed, recomputed later). A prefix-cache hit never covers the last prompt
//! token, exactly like vLLM (`max_cache_hit_length = num_tokens - 1`).
//!
//! With `offload.cpu_blocks > 0` the engine also runs vLLM's CPU offloading tier
//! (`offload.rs`): computed prompt blocks are copied to a CPU pool, and a request whose
//! prefix continues past its GPU hit in that pool loads those blocks instead of prefilling
//! them, waiting (holding its blocks, counted as waiting) until the copy lands.

pub mod event;
pub mod hashing;
pub mod offload;
pub mod pool;
pub mod profile;
pub mod request;
pub mod stats;
mod step;

use crate::ids::{EngineHash, RequestId};
pub use event::{KvEvent, Medium};
use offload::CpuTier;
pub use offload::{OffloadConfig, OffloadStats};
use pool::BlockPool;
pub use profile::StepProfile;
pub(crate) use request::Request;
pub use request::{FinishReason, Finished, FirstToken, NewRequest, TokenOut};
use serde::Serialize;
pub use stats::EngineStats;
use std::collections::VecDeque;

#[derive(Clone, Debug, Serialize)]
pub struct EngineConfig {
    pub block_size: usize,
    /// Total blocks including vLLM's null block (what vLLM reports as `num_gpu_blocks`).
    pub num_gpu_blocks: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    /// Without `ignore_eos`, the simulated model emits EOS after this many tokens.
    pub eos_after: usize,
    pub profile: StepProfile,
    /// Wall-clock multiplier applied to every step (0.1 = ten times faster).
    pub time_scale: f64,
    /// vLLM's KV offloading to CPU; off by default.
    pub offload: OffloadConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            num_gpu_blocks: 5600,
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len: 32768,
            eos_after: 128,
            profile: StepProfile::default(),
            time_scale: 1.0,
            offload: OffloadConfig::default(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EngineError {
    #[error("prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("this model's maximum context length is {max} tokens; the request needs {needed} ({prompt} prompt + {max_tokens} max_tokens)")]
    TooLong { max: usize, needed: usize, prompt: usize, max_tokens: usize },
    #[error("request needs {needed} KV blocks but the cache only has {available}")]
    CacheTooSmall { needed: usize, available: usize },
}

/// Everything one `step` produced.
#[derive(Debug, Default)]
pub struct StepOutput {
    /// Wall seconds this step takes (already scaled); 0 when there was nothing to do.
    pub duration_s: f64,
    pub tokens: Vec<TokenOut>,
    pub events: Vec<KvEvent>,
    pub prefill_tokens: usize,
    pub batch_size: usize,
}

pub struct Engine {
    cfg: EngineConfig,
    pool: BlockPool,
    waiting: VecDeque<Request>,
    /// Requests holding blocks while a CPU load is in flight or just landed (vLLM's
    /// `kv_holding_waiting`): scheduled before `waiting`.
    holding: VecDeque<Request>,
    running: Vec<Request>,
    stats: EngineStats,
    /// Fault knob: multiplies step time.
    slowdown: f64,
    pending_events: Vec<KvEvent>,
    /// The CPU offload tier, when configured.
    cpu: Option<CpuTier>,
    /// Requests gone (finished, aborted) since the last step: their last stores and
    /// `on_request_finished` happen in the next step, as vLLM's `finished_req_ids`.
    gone: Vec<Request>,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        let pool = BlockPool::new(cfg.num_gpu_blocks);
        let cpu = cfg
            .offload
            .enabled()
            .then(|| CpuTier::new(&cfg.offload, cfg.block_size, cfg.profile.kv_bytes_per_token, cfg.time_scale));
        Engine {
            cfg,
            pool,
            waiting: VecDeque::new(),
            holding: VecDeque::new(),
            running: Vec::new(),
            stats: EngineStats::default(),
            slowdown: 1.0,
            pending_events: Vec::new(),
            cpu,
            gone: Vec::new(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn set_slowdown(&mut self, factor: f64) {
        self.slowdown = if factor.is_finite() && factor > 0.0 { factor } else { 1.0 };
    }

    pub fn slowdown(&self) -> f64 {
        self.slowdown
    }

    /// Validate and queue a request arriving at `now`.
    pub fn add_request(&mut self, req: NewRequest, now: f64) -> Result<(), EngineError> {
        let prompt = req.prompt.len();
        if prompt == 0 {
            return Err(EngineError::EmptyPrompt);
        }
        if req.max_tokens == 0 {
            return Err(EngineError::ZeroMaxTokens);
        }
        let needed = prompt + req.max_tokens;
        if needed > self.cfg.max_model_len {
            let (max, max_tokens) = (self.cfg.max_model_len, req.max_tokens);
            return Err(EngineError::TooLong { max, needed, prompt, max_tokens });
        }
        // vLLM sizes max_model_len to fit the cache at startup; the sim allows smaller caches,
        // so the prompt must fit and generation is capped at what the whole cache can hold
        // (a lone request can then never preempt itself forever).
        let available = self.pool.num_blocks() - 1;
        let capacity = available * self.cfg.block_size;
        if prompt >= capacity {
            return Err(EngineError::CacheTooSmall { needed: (prompt + 1).div_ceil(self.cfg.block_size), available });
        }
        let max_tokens = req.max_tokens.min(capacity - prompt);
        self.waiting.push_back(Request {
            id: req.id,
            tokens: req.prompt,
            prompt_len: prompt,
            max_tokens,
            eos_at: (!req.ignore_eos).then_some(self.cfg.eos_after.max(1)),
            cache_salt: req.cache_salt.filter(|s| !s.is_empty()),
            output: req.output,
            hashes: Vec::new(),
            blocks: Vec::new(),
            num_computed: 0,
            num_cached_blocks: 0,
            cached_tokens: None,
            num_preemptions: 0,
            offload: Default::default(),
            load: None,
            arrival: now,
            first_scheduled: None,
            first_token: None,
        });
        Ok(())
    }

    /// Drop a request (client went away), releasing its blocks. Returns whether it existed.
    /// A request aborted while its CPU load is in flight keeps its blocks until it lands.
    pub fn abort(&mut self, id: RequestId) -> bool {
        let r = if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            self.waiting.remove(i)
        } else if let Some(i) = self.running.iter().position(|r| r.id == id) {
            Some(self.running.remove(i))
        } else if let Some(i) = self.holding.iter().position(|r| r.id == id) {
            self.holding.remove(i)
        } else {
            None
        };
        let Some(mut r) = r else { return false };
        let blocks: Vec<_> = r.blocks.iter().rev().copied().collect();
        let to_free = match (&mut self.cpu, r.load) {
            (Some(cpu), Some(offload::LoadState::InFlight)) => cpu.orphan_load(id, blocks),
            _ => Some(blocks),
        };
        if let Some(blocks) = to_free {
            self.pool.free(blocks);
        }
        if let Some(cpu) = &mut self.cpu {
            cpu.on_request_done(id);
            r.load = None;
            self.gone.push(r);
        }
        true
    }

    /// A request its frontend gave up on (vLLM's `AsyncLLM.abort`): dropped as [`Engine::abort`]
    /// drops it, and counted. `step` computes a whole step when it starts, so an abort while
    /// the worker waits out that step takes effect after it (the request is not scheduled
    /// again), as vLLM's engine core applies aborts after the forward pass in progress.
    pub fn abort_by_frontend(&mut self, id: RequestId) {
        self.abort(id);
        self.stats.requests_aborted += 1;
    }

    /// Counts one output the frontend received (see [`EngineStats::record_output`]). Not done
    /// by `step`, so that outputs of requests aborted while their step ran are never counted.
    pub fn record_output(&mut self, t: &TokenOut) {
        self.stats.record_output(t);
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty()
            || !self.running.is_empty()
            || !self.holding.is_empty()
            || self.cpu.as_ref().is_some_and(CpuTier::has_inflight)
    }

    /// vLLM's `/reset_prefix_cache`: succeeds (emitting `AllBlocksCleared`) only when no
    /// request holds blocks. `reset_external` (`?reset_external=true`) also empties the CPU
    /// tier, silently as vLLM's connector reset does; active requests re-offer from chunk 0.
    pub fn reset_prefix_cache(&mut self, reset_external: bool) -> bool {
        let ok = self.pool.reset_prefix_cache(&mut self.pending_events);
        if reset_external {
            if let Some(cpu) = &mut self.cpu {
                cpu.reset();
                let active = self.running.iter_mut().chain(self.waiting.iter_mut()).chain(self.holding.iter_mut());
                active.for_each(|r| r.offload.next_stored_chunk = 0);
            }
        }
        ok
    }

    /// Events produced outside a step (prefix-cache reset), to publish as their own batch.
    pub fn take_pending_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.pending_events)
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Waiting requests, including those holding blocks for a CPU load (as vLLM counts).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + self.holding.len()
    }

    pub fn kv_usage(&self) -> f64 {
        self.pool.usage()
    }

    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    /// Engine hashes of every cached block, sorted.
    pub fn cached_hashes(&self) -> Vec<EngineHash> {
        self.pool.cached_hashes()
    }

    /// Cached hashes in the order they would be evicted.
    pub fn eviction_order(&self) -> Vec<EngineHash> {
        self.pool.eviction_order()
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Whether this engine has a CPU offload tier.
    pub fn has_cpu_tier(&self) -> bool {
        self.cpu.is_some()
    }

    /// Engine hashes of the blocks the CPU tier holds readable (what a subscriber's CPU
    /// view should hold), sorted; empty without a tier.
    pub fn cpu_cached_hashes(&self) -> Vec<EngineHash> {
        self.cpu.as_ref().map(CpuTier::cached_hashes).unwrap_or_default()
    }

    /// CPU blocks in use (stored or being written).
    pub fn num_cpu_blocks_used(&self) -> usize {
        self.cpu.as_ref().map_or(0, CpuTier::num_used)
    }

    /// CPU-tier hashes in eviction order (first evicted first); test/debug aid.
    pub fn cpu_eviction_order(&self) -> Vec<EngineHash> {
        self.cpu.as_ref().map(CpuTier::eviction_order).unwrap_or_default()
    }

    pub fn offload_stats(&self) -> Option<&OffloadStats> {
        self.cpu.as_ref().map(|c| &c.stats)
    }
}

#[cfg(test)]
mod tests;
