//! One scheduler step: schedule, price, then apply (advance computed tokens, sample,
//! finish). Kept apart from `engine.rs` so the scheduling policy reads in one place.
//!
//! With a CPU tier (`offload.rs`) a step also does what vLLM's `OffloadingConnector` does
//! around it: admission looks up the CPU pool after the GPU hit and starts loads, after
//! scheduling the newly computed prompt blocks are offered for storing, the forward pass
//! waits for flushed stores, and at the end the copies that landed are applied. A step's
//! events are the GPU's then the CPU tier's, as vLLM's `update_from_output` publishes them.

use super::hashing::extend_hashes;
use super::offload::LoadState;
use super::pool::BlockPool;
use super::request::{next_token, Finished, FirstToken, Request, TokenOut};
use super::{Engine, KvEvent, Medium, StepOutput};
use crate::ids::BlockId;
use std::collections::HashSet;

/// While only copies are pending vLLM's engine loop spins through empty steps, noticing a
/// landed copy within about this long (seconds, before the time scale); an idle step lasts
/// at most this, so a request arriving meanwhile is scheduled as promptly.
const IDLE_POLL_S: f64 = 0.001;

impl Engine {
    /// Run one step starting at `now`; outputs are stamped `now + duration`.
    pub fn step(&mut self, now: f64) -> StepOutput {
        let mut events = std::mem::take(&mut self.pending_events);
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut scheduled: Vec<usize> = vec![0; self.running.len()];
        // Blocks allocated this step (kept only with a CPU tier, for store fences).
        let mut alloc = HashSet::new();
        let preempted = self.schedule_running(&mut budget, &mut scheduled, &mut events, &mut alloc);
        if !preempted {
            self.admit_waiting(&mut budget, &mut scheduled, &mut events, now, &mut alloc);
        }
        let mut prefill = 0;
        let mut seqs = 0;
        for (r, &n) in self.running.iter().zip(&scheduled) {
            if n == 0 {
                continue;
            }
            seqs += 1;
            let is_decode = n == 1 && r.output_len() > 0 && r.num_computed + 1 == r.tokens.len();
            if !is_decode {
                prefill += n;
            }
        }
        let unscaled = self.cfg.profile.step_seconds(prefill, seqs);
        let compute_s = unscaled * self.slowdown * self.cfg.time_scale;
        let mut cpu_events = Vec::new();
        let duration_s = match self.cpu.is_some() {
            true => self.offload_stores(now, compute_s, &scheduled, &alloc, &mut cpu_events),
            false => compute_s,
        };
        let end = now + duration_s;
        let tokens = self.apply(&scheduled, end);
        if let Some(cpu) = &mut self.cpu {
            for landed in cpu.complete(end, &mut cpu_events) {
                match landed.orphan {
                    Some(blocks) => self.pool.free(blocks),
                    None => {
                        if let Some(r) = self.holding.iter_mut().find(|r| r.id == landed.req) {
                            r.load = Some(LoadState::Done);
                        }
                    }
                }
            }
        }
        events.extend(cpu_events);
        StepOutput { duration_s, tokens, events, prefill_tokens: prefill, batch_size: seqs }
    }

    /// Give running requests their tokens; preempt from the tail when blocks run out.
    fn schedule_running(
        &mut self,
        budget: &mut usize,
        sched: &mut Vec<usize>,
        ev: &mut Vec<KvEvent>,
        alloc: &mut HashSet<BlockId>,
    ) -> bool {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let need = self.running[i].tokens.len() - self.running[i].num_computed;
            let n = need.min(*budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let mut victim_was_self = false;
            loop {
                let want = self.blocks_short(&self.running[i], n);
                if let Some(new) = self.pool.allocate(want, ev) {
                    self.note_alloc(alloc, &new);
                    self.running[i].blocks.extend(new);
                    break;
                }
                let victim = self.running.len() - 1;
                self.preempt(victim);
                sched.truncate(self.running.len());
                preempted = true;
                if victim == i {
                    victim_was_self = true;
                    break;
                }
            }
            if victim_was_self {
                break;
            }
            let upto = self.running[i].num_computed + n;
            cache_full_blocks(&mut self.pool, self.cfg.block_size, &mut self.running[i], upto, ev);
            sched[i] = n;
            *budget -= n;
            i += 1;
        }
        preempted
    }

    fn note_alloc(&self, alloc: &mut HashSet<BlockId>, blocks: &[BlockId]) {
        if self.cpu.is_some() {
            alloc.extend(blocks.iter().copied());
        }
    }

    /// Admit waiting requests: first those holding blocks for a CPU load (skipped while it
    /// is in flight), then the waiting queue FCFS, while `max_num_seqs`, the token budget
    /// and free blocks allow. A request the CPU tier defers is skipped, not a stop.
    fn admit_waiting(
        &mut self,
        budget: &mut usize,
        sched: &mut Vec<usize>,
        ev: &mut Vec<KvEvent>,
        now: f64,
        alloc: &mut HashSet<BlockId>,
    ) {
        let bs = self.cfg.block_size;
        let mut i = 0;
        while *budget > 0 && i < self.holding.len() {
            if self.running.len() >= self.cfg.max_num_seqs {
                return;
            }
            let r = &mut self.holding[i];
            if r.load == Some(LoadState::InFlight) {
                i += 1;
                continue;
            }
            if r.load == Some(LoadState::Done) {
                // `_update_waiting_for_remote_kv`: the loaded blocks join the GPU prefix
                // cache; a hit on the whole prompt recomputes its last token.
                let upto = r.num_computed;
                cache_full_blocks(&mut self.pool, bs, r, upto, ev);
                if r.num_computed == r.tokens.len() {
                    r.num_computed -= 1;
                }
                r.load = Some(LoadState::Promoted);
            }
            let n = (r.tokens.len() - r.num_computed).min(*budget);
            let want = (r.num_computed + n).div_ceil(bs).saturating_sub(r.blocks.len());
            if want > self.pool.num_free() {
                return;
            }
            let Some(mut req) = self.holding.remove(i) else { return };
            let fresh = self.pool.allocate(want, ev).unwrap_or_default();
            self.note_alloc(alloc, &fresh);
            req.blocks.extend(fresh);
            req.load = None;
            req.first_scheduled.get_or_insert(now);
            let upto = req.num_computed + n;
            self.running.push(req);
            let last = self.running.len() - 1;
            cache_full_blocks(&mut self.pool, bs, &mut self.running[last], upto, ev);
            sched.push(n);
            *budget -= n;
        }
        let mut i = 0;
        while *budget > 0 && i < self.waiting.len() && self.running.len() < self.cfg.max_num_seqs {
            let req = &mut self.waiting[i];
            extend_hashes(&mut req.hashes, &req.tokens, bs, req.cache_salt.as_deref());
            let max_hit_blocks = (req.tokens.len() - 1) / bs;
            let hits: Vec<BlockId> =
                req.hashes[..max_hit_blocks].iter().map_while(|h| self.pool.get_cached(h)).collect();
            let local = hits.len() * bs;
            // The connector continues the lookup past the GPU hit.
            let mut external = 0;
            if let Some(cpu) = &self.cpu {
                req.offload.next_stored_chunk = 0;
                match cpu.lookup(req, local) {
                    Some(n) => external = n,
                    None => {
                        i += 1;
                        continue;
                    }
                }
            }
            let computed = local + external;
            let evictable_hits = hits.iter().filter(|b| self.pool.is_free(**b)).count();
            if external > 0 {
                // An async load: blocks for the hit now, no tokens this step. Admitted only
                // if it leaves room for what in-flight prefills still need.
                let new_blocks = computed.div_ceil(bs) - hits.len();
                let reserved = self.inflight_prefill_blocks(sched);
                if new_blocks + evictable_hits + reserved > self.pool.num_free() {
                    break;
                }
                let Some(mut req) = self.take_waiting(i, hits, new_blocks, computed, ev, alloc) else { break };
                self.record_admission(&mut req, local, external);
                if let Some(cpu) = &mut self.cpu {
                    cpu.start_load(&mut req, local / bs, computed / bs, now);
                }
                req.offload.next_stored_chunk = computed / bs;
                req.load = Some(LoadState::InFlight);
                self.holding.push_back(req);
                continue;
            }
            let n = (req.tokens.len() - computed).min(*budget);
            let new_blocks = (computed + n).div_ceil(bs) - hits.len();
            if new_blocks + evictable_hits > self.pool.num_free() {
                break;
            }
            let Some(mut req) = self.take_waiting(i, hits, new_blocks, computed, ev, alloc) else { break };
            self.record_admission(&mut req, local, 0);
            req.first_scheduled.get_or_insert(now);
            self.running.push(req);
            let last = self.running.len() - 1;
            cache_full_blocks(&mut self.pool, bs, &mut self.running[last], computed + n, ev);
            sched.push(n);
            *budget -= n;
        }
    }

    /// Takes waiting request `i` into the pool: its GPU cache hits (touched) plus `new_blocks`
    /// fresh blocks, with `computed` tokens already done (hits, and any loading from CPU).
    fn take_waiting(
        &mut self,
        i: usize,
        hits: Vec<BlockId>,
        new_blocks: usize,
        computed: usize,
        ev: &mut Vec<KvEvent>,
        alloc: &mut HashSet<BlockId>,
    ) -> Option<Request> {
        let mut req = self.waiting.remove(i)?;
        self.pool.touch(&hits);
        let fresh = self.pool.allocate(new_blocks, ev).unwrap_or_default();
        self.note_alloc(alloc, &fresh);
        req.num_cached_blocks = hits.len();
        req.blocks = hits;
        req.blocks.extend(fresh);
        req.num_computed = computed;
        Some(req)
    }

    /// Cache statistics of one admission: vLLM's prefix-cache queries (every admission),
    /// the connector's (never-preempted requests only) and the first-scheduling counters.
    fn record_admission(&mut self, req: &mut Request, local: usize, external: usize) {
        let st = &mut self.stats;
        st.prefix_cache_queries += req.tokens.len() as u64;
        st.prefix_cache_hits += local as u64;
        if self.cpu.is_some() && req.num_preemptions == 0 {
            st.external_prefix_cache_queries += (req.tokens.len() - local) as u64;
            st.external_prefix_cache_hits += external as u64;
        }
        if req.cached_tokens.is_none() {
            req.cached_tokens = Some(local + external);
            st.prompt_tokens_first_scheduled += req.prompt_len as u64;
            st.cached_tokens_first_scheduled_gpu += local as u64;
            st.cached_tokens_first_scheduled_cpu += external as u64;
        }
    }

    /// Blocks that loading and still-prefilling requests need to finish their sequence
    /// (vLLM's `_inflight_prefill_reserved_blocks`).
    fn inflight_prefill_blocks(&self, sched: &[usize]) -> usize {
        let bs = self.cfg.block_size;
        let short = |r: &Request| r.tokens.len().div_ceil(bs).saturating_sub(r.blocks.len());
        let loading: usize = self.holding.iter().map(short).sum();
        let prefilling: usize = self
            .running
            .iter()
            .zip(sched.iter().chain(std::iter::repeat(&0)))
            .filter(|(r, n)| r.num_computed + **n < r.tokens.len())
            .map(|(r, _)| short(r))
            .sum();
        loading + prefilling
    }

    /// The CPU tier's part of a step after scheduling (vLLM's `build_connector_meta`, then
    /// the worker's flushes): offer computed prompt blocks of scheduled requests, then the
    /// last ones of requests gone since the last step (and finish them), queue the stores.
    /// Returns the step's duration: flush wait + compute, or an idle poll.
    fn offload_stores(
        &mut self,
        now: f64,
        compute_s: f64,
        sched: &[usize],
        alloc: &HashSet<BlockId>,
        ev: &mut Vec<KvEvent>,
    ) -> f64 {
        let Some(cpu) = &mut self.cpu else { return compute_s };
        cpu.flush_reallocated(alloc);
        let mut new = Vec::new();
        for (r, &n) in self.running.iter_mut().zip(sched) {
            if n > 0 {
                let offloadable = (r.num_computed + n).min(r.prompt_len);
                new.extend(cpu.offer(r, offloadable, ev));
            }
        }
        for mut r in std::mem::take(&mut self.gone) {
            let offloadable = r.num_computed.min(r.prompt_len);
            if let Some(mut job) = cpu.offer(&mut r, offloadable, ev) {
                job.fenced = true;
                job.flush = job.src().iter().any(|b| alloc.contains(b));
                new.push(job);
            }
            cpu.request_finished(&mut r);
        }
        // Flushed stores go at once; the forward pass waits for every flushed one.
        let (flushed, deferred): (Vec<_>, Vec<_>) = new.into_iter().partition(|j| j.flush);
        for job in flushed {
            cpu.submit_store(job, now);
        }
        let wait = cpu.flush_until().map_or(0.0, |t| (t - now).max(0.0));
        let mut duration = wait + compute_s;
        if duration == 0.0 {
            // Nothing to run: an empty step, submitting stores now and polling the copies.
            for job in deferred {
                cpu.submit_store(job, now);
            }
            if let Some(t) = cpu.next_done() {
                duration = (t - now).clamp(0.0, IDLE_POLL_S * self.cfg.time_scale);
            }
        } else {
            // Stores start with the next step (`prepare_store_kv` defers them).
            for job in deferred {
                cpu.submit_store(job, now + duration);
            }
        }
        duration
    }

    /// New blocks request `r` needs so its blocks cover `num_computed + n` tokens.
    fn blocks_short(&self, r: &Request, n: usize) -> usize {
        (r.num_computed + n).div_ceil(self.cfg.block_size).saturating_sub(r.blocks.len())
    }

    fn preempt(&mut self, i: usize) {
        let mut r = self.running.remove(i);
        self.pool.free(r.blocks.iter().rev().copied());
        r.blocks.clear();
        r.num_computed = 0;
        r.num_cached_blocks = 0;
        r.num_preemptions += 1;
        self.stats.preemptions += 1;
        if let Some(cpu) = &mut self.cpu {
            cpu.on_preempt(r.id);
        }
        self.waiting.push_front(r);
    }

    /// Advance computed tokens, sample where a request caught up, retire finished ones. The
    /// output statistics are not counted here but when the tokens reach the frontend
    /// ([`Engine::record_output`]), as vLLM's output processor counts them.
    fn apply(&mut self, sched: &[usize], end: f64) -> Vec<TokenOut> {
        let mut out = Vec::new();
        let mut finished_idx = Vec::new();
        for (i, &n) in sched.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let r = &mut self.running[i];
            r.num_computed += n;
            if r.num_computed < r.tokens.len() {
                continue; // chunked prefill not done yet
            }
            let token = next_token(r);
            r.tokens.push(token);
            let first = r.first_token.is_none().then(|| {
                r.first_token = Some(end);
                let started = r.first_scheduled.unwrap_or(r.arrival);
                FirstToken { prompt_tokens: r.prompt_len, ttft_s: end - r.arrival, queue_s: started - r.arrival, prefill_s: end - started }
            });
            let cached_tokens = r.cached_tokens.unwrap_or(0);
            let finished = r.finish_reason().map(|reason| Finished {
                reason,
                prompt_tokens: r.prompt_len,
                completion_tokens: r.output_len(),
                cached_tokens,
                ttft_s: r.first_token.unwrap_or(end) - r.arrival,
                e2e_s: end - r.arrival,
            });
            if finished.is_some() {
                finished_idx.push(i);
            }
            out.push(TokenOut { request: r.id, token, cached_tokens, first, finished });
        }
        for i in finished_idx.into_iter().rev() {
            let r = self.running.remove(i);
            self.pool.free(r.blocks.iter().rev().copied());
            if let Some(cpu) = &mut self.cpu {
                cpu.on_request_done(r.id);
                self.gone.push(r);
            }
        }
        out
    }
}

/// Register the full blocks of `r` covered by its first `upto` tokens in the prefix cache,
/// emitting one `BlockStored` for the new ones.
fn cache_full_blocks(pool: &mut BlockPool, bs: usize, r: &mut Request, upto: usize, ev: &mut Vec<KvEvent>) {
    extend_hashes(&mut r.hashes, &r.tokens, bs, r.cache_salt.as_deref());
    let full = upto / bs;
    let first = r.num_cached_blocks;
    if full <= first {
        return;
    }
    for j in first..full {
        pool.cache_block(r.blocks[j], r.hashes[j]);
    }
    let extra_keys = (first..full)
        .map(|j| if j == 0 { r.cache_salt.clone().map(|s| vec![s]) } else { None })
        .collect();
    ev.push(KvEvent::BlockStored {
        block_hashes: r.hashes[first..full].iter().map(|h| h.engine_hash()).collect(),
        parent_block_hash: first.checked_sub(1).map(|p| r.hashes[p].engine_hash()),
        token_ids: r.tokens[first * bs..full * bs].to_vec(),
        block_size: bs as u32,
        extra_keys: Some(extra_keys),
        medium: Medium::Gpu,
        kv_cache_spec_kind: None,
    });
    r.num_cached_blocks = full;
}
