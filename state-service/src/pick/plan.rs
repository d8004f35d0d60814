//! Stage 3: the decision. One snapshot of the candidate workers; per candidate, what it holds
//! of the prompt, its predicted TTFT and what placing the request there costs the fleet; then
//! the policy's pure choice ([`kvroute_score::choose`]) with this pick's own rng.

use super::prompt::Keyed;
use super::{Picker, PromptView};
use crate::config::Priors;
use crate::fleet::{ModelView, WorkerEntry, WorkerView};
use kvroute_core::wire::{DegradedReason, PickRequest, PickResponse};
use kvroute_kv::types::BlockKey;
use kvroute_score::peers::{self, PeerView, Request};
use kvroute_score::{choose, followers, placement_cost, predict, Cached, Choice, Context, Cost, LoadView, Policy, Prediction};
use std::sync::Arc;
use tokio::time::Instant;

/// One healthy worker of the request's model, as every policy sees it.
pub struct Candidate {
    pub worker: Arc<WorkerEntry>,
    pub load: LoadView,
    /// Leading keys it holds: KV index or speculative credit for exact keys, learned routing
    /// for text chunks.
    pub matched: u32,
    pub prediction: Prediction,
    /// What kvroute minimises ([`placement_cost`]).
    pub cost_ms: f64,
    /// What the peer policies read.
    pub peer: PeerView,
}

/// A decision before it is recorded: what admission charges and [`Picker::commit`] records.
pub(super) enum Plan {
    /// The proxy's default route (nothing is recorded).
    Fallback(PickResponse),
    Chosen(Chosen),
}

pub(super) struct Chosen {
    pub(super) policy: Policy,
    pub(super) prompt: PromptView,
    pub(super) candidates: Vec<Candidate>,
    /// In range of `candidates` (only [`Picker::plan`] builds one).
    pub(super) at: usize,
    pub(super) now: Instant,
    /// Tokens of the stored conversation the prompt continues (see [`Picker::plan`]).
    pub(super) continued: u32,
}

impl Chosen {
    pub(super) fn candidate(&self) -> &Candidate {
        &self.candidates[self.at]
    }

    /// Predicted uncached prompt tokens on the chosen worker: the prefill it will really do.
    pub(super) fn uncached_tokens(&self) -> u32 {
        self.candidate().prediction.uncached_tokens
    }
}

impl Picker {
    /// `keyed`: the prompt stage's keys (exact, the request's own, or text chunks and why).
    /// `continued`: tokens of a stored conversation the prompt continues (Responses API
    /// `previous_response_id`), held by every candidate (`view` is only its owner then).
    pub(super) fn plan(&self, policy: Policy, req: &PickRequest, view: ModelView, keyed: Keyed, continued: u32) -> Plan {
        if !view.known {
            return Plan::Fallback(self.fallback(policy, req, DegradedReason::DegradedUnknownModel));
        }
        if view.workers.is_empty() {
            return Plan::Fallback(self.fallback(policy, req, DegradedReason::DegradedNoHealthyWorker));
        }
        let as_sent = || PromptView::new(req, view.block_size, self.config.text_chunk_bytes);
        let mut prompt = match keyed {
            Keyed::Exact(prompt) => prompt,
            Keyed::AsSent => as_sent(),
            Keyed::Degraded(reason) => as_sent().because(reason),
        };
        prompt.prompt_tokens = prompt.prompt_tokens.saturating_add(continued);
        let now = Instant::now();
        let candidates = self.candidates(policy, view.workers, &prompt, continued, now);
        let choices: Vec<Choice> = candidates
            .iter()
            .map(|c| Choice { cost_ms: c.cost_ms, matched_blocks: c.matched, load: c.load.outstanding(), peer: c.peer })
            .collect();
        let ctx = Context {
            tolerance: self.config.affinity_tolerance,
            ticket: if policy == Policy::RoundRobin { self.selector.ticket() } else { 0 },
            request: Request { keys: peer_keys(policy, &prompt).len() as u32, tokens: prompt.prompt_tokens, block_size: prompt.tokens_per_key },
        };
        let mut rng = self.selector.rng();
        let at = choose(policy, &choices, &ctx, &mut rng);
        if at >= candidates.len() {
            return Plan::Fallback(self.fallback(policy, req, DegradedReason::DegradedNoHealthyWorker));
        }
        Plan::Chosen(Chosen { policy, prompt, candidates, at, now, continued })
    }

    fn candidates(&self, policy: Policy, workers: Vec<WorkerView>, prompt: &PromptView, continued: u32, now: Instant) -> Vec<Candidate> {
        let held = self.matches(&workers, prompt, now);
        let sets = self.fleet.peer_matches(policy, &workers, peer_keys(policy, prompt));
        let priors = &self.config.priors;
        let loads: Vec<LoadView> = workers
            .iter()
            .map(|worker| LoadView {
                running: worker.load.running,
                waiting: worker.load.waiting,
                own_waiting: worker.pending.waiting,
                own_waiting_tokens: worker.pending.waiting_tokens,
                own_in_flight: worker.pending.in_flight,
            })
            .collect();
        let matched: Vec<u32> = held.iter().map(|h| h.matched).collect();
        let followers = followers(&loads, &matched);
        let cached_tokens = |matched: u32| matched.saturating_mul(prompt.tokens_per_key).saturating_add(continued).min(prompt.prompt_tokens);
        // What the warmest placement computes (placement_cost charges only the excess over it).
        let least_uncached = prompt.prompt_tokens - cached_tokens(matched.iter().copied().max().unwrap_or(0));
        // By reference into a new Vec: collecting in place would reuse (and then shrink, with a
        // realloc) the larger views' buffer.
        workers
            .iter()
            .zip(loads)
            .enumerate()
            .map(|(i, (worker, load))| {
                let Held { matched, gpu } = held.get(i).copied().unwrap_or_default();
                let cost = cost_of(worker, priors);
                let tokens = cached_tokens(matched);
                let reloaded = tokens.saturating_sub(gpu.saturating_mul(prompt.tokens_per_key));
                let prediction = predict(prompt.prompt_tokens, Cached { tokens, reloaded }, &load, &cost);
                let cost_ms = placement_cost(&prediction, cost.per_token_ms, least_uncached, followers, self.config.queue_externality);
                let set = sets.as_ref().and_then(|s| s.get(i).copied()).unwrap_or_default();
                let exact = prompt.exact;
                let peer = PeerView {
                    router_load: worker.pending.in_flight,
                    queue: worker.load.waiting,
                    kv_usage: worker.load.kv_usage,
                    learned_leading: set.leading,
                    learned_in_run: set.in_run,
                    gpu_blocks: if exact { gpu } else { 0 },
                    host_blocks: if exact { matched.saturating_sub(gpu) } else { 0 },
                    prefill_tokens_in_flight: worker.pending.waiting_tokens,
                    active_blocks: (worker.pending.in_flight_tokens + worker.pending.max_cached_tokens) / u64::from(prompt.tokens_per_key.max(1)),
                    active_prefix_blocks: worker.pending.max_cached_tokens / u64::from(prompt.tokens_per_key.max(1)),
                };
                Candidate { worker: worker.entry.clone(), load, matched, prediction, cost_ms, peer }
            })
            .collect()
    }

    /// What each worker holds of the prompt, in `workers` order.
    fn matches(&self, workers: &[WorkerView], prompt: &PromptView, now: Instant) -> Vec<Held> {
        if prompt.keys.is_empty() {
            return vec![Held::default(); workers.len()];
        }
        if !prompt.exact {
            let learned = self.fleet.learned_matches(workers, &prompt.keys);
            return learned.into_iter().map(|n| Held { matched: n, gpu: n }).collect();
        }
        self.fleet.exact_matches(workers, &prompt.keys, now).into_iter().map(|(matched, gpu)| Held { matched, gpu }).collect()
    }
}

/// The keys an approximate peer hashes: llm-d cuts the prompt to its first 256 blocks.
pub(super) fn peer_keys(policy: Policy, prompt: &PromptView) -> &[BlockKey] {
    let n = match policy {
        Policy::LlmdDefault => peers::llmd::keys_matched(prompt.keys.len(), prompt.exact),
        _ => prompt.keys.len(),
    };
    prompt.keys.get(..n).unwrap_or(&prompt.keys)
}

/// What one worker holds of the prompt, in keys.
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    /// Leading keys held: exact keys, the larger of the KV index (any tier) and speculative
    /// credit; text chunks, learned routing.
    matched: u32,
    /// Of those, the leading keys on the GPU (the rest would be reloaded from the CPU tier).
    gpu: u32,
}

/// `worker`'s cost parameters: its calibration, its own settings, else the priors.
pub(super) fn cost_of(worker: &WorkerView, priors: &Priors) -> Cost {
    Cost {
        per_token_ms: worker.per_token_ms,
        overhead_ms: worker.overhead_ms,
        decode_ms_per_running: priors.decode_ms_per_running,
        default_request_tokens: priors.default_request_tokens,
        step_tokens: worker.entry.config.max_num_batched_tokens.unwrap_or(priors.max_num_batched_tokens),
        reload_ms_per_token: worker.entry.config.reload_ms_per_token.unwrap_or(priors.reload_ms_per_token),
    }
}
