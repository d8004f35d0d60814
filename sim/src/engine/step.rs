//! One scheduler step: schedule, price, then apply (advance computed tokens, sample,
//! finish). Kept apart from `engine.rs` so the scheduling policy reads in one place.

use super::hashing::extend_hashes;
use super::request::{next_token, Finished, Request, TokenOut};
use super::{Engine, KvEvent, StepOutput};
use crate::ids::BlockId;

impl Engine {
    /// Run one step starting at `now`; outputs are stamped `now + duration`.
    pub fn step(&mut self, now: f64) -> StepOutput {
        let mut events = std::mem::take(&mut self.pending_events);
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut scheduled: Vec<usize> = vec![0; self.running.len()];
        let preempted = self.schedule_running(&mut budget, &mut scheduled, &mut events);
        if !preempted {
            self.admit_waiting(&mut budget, &mut scheduled, &mut events, now);
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
        let duration_s = unscaled * self.slowdown * self.cfg.time_scale;
        let tokens = self.apply(&scheduled, now + duration_s);
        StepOutput { duration_s, tokens, events, prefill_tokens: prefill, batch_size: seqs }
    }

    /// Give running requests their tokens; preempt from the tail when blocks run out.
    fn schedule_running(&mut self, budget: &mut usize, sched: &mut Vec<usize>, ev: &mut Vec<KvEvent>) -> bool {
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
            self.cache_full_blocks(i, upto, ev);
            sched[i] = n;
            *budget -= n;
            i += 1;
        }
        preempted
    }

    fn admit_waiting(&mut self, budget: &mut usize, sched: &mut Vec<usize>, ev: &mut Vec<KvEvent>, now: f64) {
        let bs = self.cfg.block_size;
        while *budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(req) = self.waiting.front_mut() else { break };
            extend_hashes(&mut req.hashes, &req.tokens, bs, req.cache_salt.as_deref());
            let max_hit_blocks = (req.tokens.len() - 1) / bs;
            let hits: Vec<BlockId> =
                req.hashes[..max_hit_blocks].iter().map_while(|h| self.pool.get_cached(h)).collect();
            let computed = hits.len() * bs;
            let n = (req.tokens.len() - computed).min(*budget);
            let new_blocks = (computed + n).div_ceil(bs) - hits.len();
            let evictable_hits = hits.iter().filter(|b| self.pool.is_free(**b)).count();
            if new_blocks + evictable_hits > self.pool.num_free() {
                break;
            }
            let Some(mut req) = self.waiting.pop_front() else { break };
            self.pool.touch(&hits);
            let fresh = self.pool.allocate(new_blocks, ev).unwrap_or_default();
            req.num_cached_blocks = hits.len();
            req.blocks = hits;
            req.blocks.extend(fresh);
            req.num_computed = computed;
            self.stats.prefix_cache_queries += req.tokens.len() as u64;
            self.stats.prefix_cache_hits += computed as u64;
            req.cached_tokens.get_or_insert(computed);
            req.first_scheduled.get_or_insert(now);
            self.running.push(req);
            let i = self.running.len() - 1;
            self.cache_full_blocks(i, computed + n, ev);
            sched.push(n);
            *budget -= n;
        }
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
        self.stats.preemptions += 1;
        self.waiting.push_front(r);
    }

    /// Register the full blocks of `running[i]` covered by its first `upto` tokens in the
    /// prefix cache, emitting one `BlockStored` for the new ones.
    fn cache_full_blocks(&mut self, i: usize, upto: usize, ev: &mut Vec<KvEvent>) {
        let bs = self.cfg.block_size;
        let r = &mut self.running[i];
        extend_hashes(&mut r.hashes, &r.tokens, bs, r.cache_salt.as_deref());
        let full = upto / bs;
        let first = r.num_cached_blocks;
        if full <= first {
            return;
        }
        for j in first..full {
            self.pool.cache_block(r.blocks[j], r.hashes[j]);
        }
        let extra_keys = (first..full)
            .map(|j| if j == 0 { r.cache_salt.clone().map(|s| vec![s]) } else { None })
            .collect();
        ev.push(KvEvent::BlockStored {
            block_hashes: r.hashes[first..full].iter().map(|h| h.engine_hash()).collect(),
            parent_block_hash: first.checked_sub(1).map(|p| r.hashes[p].engine_hash()),
            token_ids: r.tokens[first * bs..full * bs].to_vec(),
            block_size: bs as u32,
            extra_keys,
        });
        r.num_cached_blocks = full;
    }

    /// Advance computed tokens, sample where a request caught up, retire finished ones.
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
            self.stats.generation_tokens += 1;
            if r.first_token.is_none() {
                r.first_token = Some(end);
                let started = r.first_scheduled.unwrap_or(r.arrival);
                self.stats.ttft.observe(end - r.arrival);
                self.stats.queue_time.observe(started - r.arrival);
                self.stats.prefill_time.observe(end - started);
                self.stats.prompt_tokens += r.prompt_len as u64;
            }
            let cached_tokens = r.cached_tokens.unwrap_or(0);
            let finished = r.finish_reason().map(|reason| Finished {
                reason,
                prompt_tokens: r.prompt_len,
                completion_tokens: r.output_len(),
                cached_tokens,
                ttft_s: r.first_token.unwrap_or(end) - r.arrival,
                e2e_s: end - r.arrival,
            });
            if let Some(f) = &finished {
                self.stats.e2e.observe(f.e2e_s);
                self.stats.requests_finished += 1;
                finished_idx.push(i);
            }
            out.push(TokenOut { request: r.id, token, cached_tokens, finished });
        }
        for i in finished_idx.into_iter().rev() {
            let r = self.running.remove(i);
            self.pool.free(r.blocks.iter().rev().copied());
        }
        out
    }
}
