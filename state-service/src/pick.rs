//! A pick: from a [`PickRequest`] to a worker, an assignment and a [`PickResponse`].
//!
//! One pass, one snapshot: the policy is read once, the model's healthy workers are read once
//! ([`crate::fleet::Fleet::model_view`]), every candidate's match and prediction are computed
//! once, and the choice is the pure [`crate::score::choose`] over them with this pick's own rng
//! ([`crate::score::Selector`]). The prediction is computed for every policy, so the predicted-vs-actual
//! metric and calibration work whichever policy a benchmark pass runs. Unknown models and
//! fleets without a healthy worker answer 200 with an empty worker and a degraded reason: the
//! proxy then uses its default route, which is the filter's fail-open path anyway.

pub mod affinity;
pub mod prompt;
pub mod tokenized;

pub use prompt::PromptView;

use crate::assign::{Assignment, AssignmentId};
use crate::fleet::{Applied, FleetEvent, ModelView, WorkerEntry, WorkerView};
use crate::metrics::{PickLabels, PickOutcome};
use crate::score::peers::{self, PeerView, Request};
use crate::types::BlockKey;
use crate::score::{choose, followers, placement_cost, predict, Cached, Choice, Context, Cost, LoadView, Policy, Prediction};
use crate::state::AppState;
use kvroute_core::wire::{DegradedReason, PickRequest, PickResponse, TokenizationPath};
use rand::RngCore;
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

/// Decides where `req` goes and records the assignment, without tokenizing text or chat
/// prompts (they use text chunks; [`tokenized::pick`] is the API's path).
pub fn pick(state: &AppState, req: &PickRequest) -> PickResponse {
    let started = std::time::Instant::now();
    let policy = state.policy();
    let view = state.fleet.model_view(&req.model);
    finish(state, policy, started, decide(state, policy, req, view, None))
}

/// Counts a decided pick.
fn finish(state: &AppState, policy: Policy, started: std::time::Instant, response: PickResponse) -> PickResponse {
    let outcome = match (response.worker_id.is_empty(), response.degraded_reason() == DegradedReason::DegradedNone) {
        _ if response.rejection.is_some() => PickOutcome::Rejected,
        (true, _) => PickOutcome::Fallback,
        (false, true) => PickOutcome::Routed,
        (false, false) => PickOutcome::Degraded,
    };
    state.metrics.picks.get_or_create(&PickLabels { policy, outcome }).inc();
    state.metrics.count_tokenization(response.tokenization());
    state.metrics.pick_latency.observe(started.elapsed().as_secs_f64());
    response
}

/// `prompt`: already resolved to exact keys (tokenized), else taken from the request.
fn decide(state: &AppState, policy: Policy, req: &PickRequest, view: ModelView, prompt: Option<PromptView>) -> PickResponse {
    match plan(state, policy, req, view, prompt, 0) {
        Plan::Fallback(response) => response,
        Plan::Chosen(chosen) => commit(state, req, chosen, req.assignment_id, None),
    }
}

/// A decision before it is recorded: what admission charges and [`commit`] records.
pub(crate) enum Plan {
    /// The proxy's default route (nothing is recorded).
    Fallback(PickResponse),
    Chosen(Chosen),
}

pub(crate) struct Chosen {
    policy: Policy,
    prompt: PromptView,
    candidates: Vec<Candidate>,
    at: usize,
    now: Instant,
    /// Tokens of the stored conversation the prompt continues (see [`plan`]).
    continued: u32,
}

impl Chosen {
    fn candidate(&self) -> &Candidate {
        // `plan` only builds a Chosen with `at` in range.
        &self.candidates[self.at]
    }

    /// Predicted uncached prompt tokens on the chosen worker: the prefill it will really do.
    pub fn uncached_tokens(&self) -> u32 {
        self.candidate().prediction.uncached_tokens
    }
}

/// `continued`: tokens of a stored conversation the prompt continues (Responses API
/// `previous_response_id`), held by every candidate (the caller left only its owner).
pub(crate) fn plan(state: &AppState, policy: Policy, req: &PickRequest, view: ModelView, prompt: Option<PromptView>, continued: u32) -> Plan {
    if !view.known {
        return Plan::Fallback(fallback(state, policy, req, DegradedReason::DegradedUnknownModel));
    }
    if view.workers.is_empty() {
        return Plan::Fallback(fallback(state, policy, req, DegradedReason::DegradedNoHealthyWorker));
    }
    let mut prompt = prompt.unwrap_or_else(|| PromptView::new(req, view.block_size, state.config.text_chunk_bytes));
    prompt.prompt_tokens = prompt.prompt_tokens.saturating_add(continued);
    let now = Instant::now();
    let candidates = candidates(state, policy, view.workers, &prompt, continued, now);
    let choices: Vec<Choice> = candidates
        .iter()
        .map(|c| Choice { cost_ms: c.cost_ms, matched_blocks: c.matched, load: c.load.outstanding(), peer: c.peer })
        .collect();
    let ctx = Context {
        tolerance: state.config.affinity_tolerance,
        ticket: if policy == Policy::RoundRobin { state.selector.ticket() } else { 0 },
        request: Request { keys: peer_keys(policy, &prompt).len() as u32, tokens: prompt.prompt_tokens, block_size: prompt.tokens_per_key },
    };
    let mut rng = state.selector.rng();
    let at = choose(policy, &choices, &ctx, &mut rng);
    if at >= candidates.len() {
        return Plan::Fallback(fallback(state, policy, req, DegradedReason::DegradedNoHealthyWorker));
    }
    Plan::Chosen(Chosen { policy, prompt, candidates, at, now, continued })
}

/// Records a planned decision under assignment id `requested` (0: any) and answers it;
/// `budget`: the scope admission reserved it under.
pub(crate) fn commit(state: &AppState, req: &PickRequest, plan: Chosen, requested: u64, budget: Option<crate::tenancy::Scope>) -> PickResponse {
    let Chosen { policy, prompt, candidates, at: chosen_at, now, continued } = plan;
    // A continued conversation's blocks are held by its worker, ahead of the prompt's own.
    let continued_blocks = continued / prompt.tokens_per_key.max(1);
    let chosen = &candidates[chosen_at];
    let id = record(state, policy, &prompt, chosen, requested, budget, now);
    let degraded = degraded_reason(policy, prompt.limitation)
        .or_else(|| state.store.degraded().then_some(DegradedReason::DegradedStateUnavailable));
    if let Some(reason) = degraded {
        state.metrics.count_degraded(reason);
    }
    if !prompt.keys.is_empty() {
        state.metrics.matched_prefix_ratio.observe(f64::from(chosen.matched) / prompt.keys.len() as f64);
    }
    let entry = &chosen.worker;
    tracing::debug!(request_id = %req.request_id, worker = %entry.id, %policy, matched = chosen.matched,
        predicted_ms = chosen.prediction.ttft_ms, "pick");
    let mut response = PickResponse {
        assignment_id: id.0,
        worker_id: entry.id.to_string(),
        endpoint: entry.config.endpoint.clone(),
        cluster: entry.config.cluster.clone(),
        matched_blocks: chosen.matched + continued_blocks,
        total_blocks: prompt.keys.len() as u32 + continued_blocks,
        predicted_ttft_ms: chosen.prediction.ttft_ms,
        policy: policy.to_string(),
        ..Default::default()
    };
    response.fallback_endpoints = runners_up(&candidates, chosen_at, state.config.resilience.fallback_workers);
    response.set_tokenization(tokenization(policy, &prompt));
    response.set_degraded_reason(degraded.unwrap_or(DegradedReason::DegradedNone));
    response
}

/// The answer to a pick its tenant's budget did not admit: no worker, nothing recorded.
pub(crate) fn rejected(policy: Policy, rejection: kvroute_core::wire::Rejection) -> PickResponse {
    let mut response = PickResponse { policy: policy.to_string(), rejection: Some(rejection), ..Default::default() };
    response.set_tokenization(TokenizationPath::TokenizationNone);
    response
}

/// Where the proxy fails over when the chosen worker cannot be reached: the other candidates'
/// endpoints, fastest predicted first (whatever the policy: availability, not placement), `n`
/// at most.
fn runners_up(candidates: &[Candidate], chosen: usize, n: usize) -> Vec<String> {
    let mut others: Vec<&Candidate> =
        candidates.iter().enumerate().filter(|(i, c)| *i != chosen && !c.worker.config.endpoint.is_empty()).map(|(_, c)| c).collect();
    others.sort_by(|a, b| a.prediction.ttft_ms.total_cmp(&b.prediction.ttft_ms));
    others.iter().take(n).map(|c| c.worker.config.endpoint.clone()).collect()
}

/// Which prompt limitations degrade which policy: kvroute and Dynamo want exact keys; the
/// approximate routers live on text chunks anyway but lose token keys cut with the wrong
/// block size.
fn degraded_reason(policy: Policy, limitation: Option<DegradedReason>) -> Option<DegradedReason> {
    match (policy, limitation) {
        (Policy::Kvroute | Policy::DynamoKv, reason) => reason,
        (Policy::SglangCacheAware | Policy::LlmdDefault, Some(DegradedReason::DegradedBlockSizeMismatch)) => {
            Some(DegradedReason::DegradedBlockSizeMismatch)
        }
        _ => None,
    }
}

fn tokenization(policy: Policy, prompt: &PromptView) -> TokenizationPath {
    match policy {
        Policy::Random | Policy::RoundRobin | Policy::LeastLoaded => TokenizationPath::TokenizationNone,
        _ if prompt.keys.is_empty() => TokenizationPath::TokenizationNone,
        _ => prompt.tokenization,
    }
}

pub(crate) fn fallback(state: &AppState, policy: Policy, req: &PickRequest, reason: DegradedReason) -> PickResponse {
    state.metrics.count_degraded(reason);
    tracing::info!(request_id = %req.request_id, model = %req.model, reason = reason.label(), "pick fell back to the default route");
    let mut response = PickResponse { policy: policy.to_string(), ..Default::default() };
    response.set_tokenization(TokenizationPath::TokenizationNone);
    response.set_degraded_reason(reason);
    response
}

fn candidates(state: &AppState, policy: Policy, workers: Vec<WorkerView>, prompt: &PromptView, continued: u32, now: Instant) -> Vec<Candidate> {
    let held = matches(state, &workers, prompt, now);
    let sets = state.fleet.peer_matches(policy, &workers, peer_keys(policy, prompt));
    let priors = &state.config.priors;
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
            let cost = Cost {
                per_token_ms: worker.per_token_ms,
                overhead_ms: worker.overhead_ms,
                decode_ms_per_running: priors.decode_ms_per_running,
                default_request_tokens: priors.default_request_tokens,
                step_tokens: worker.entry.config.max_num_batched_tokens.unwrap_or(priors.max_num_batched_tokens),
                reload_ms_per_token: worker.entry.config.reload_ms_per_token.unwrap_or(priors.reload_ms_per_token),
            };
            let tokens = cached_tokens(matched);
            let reloaded = tokens.saturating_sub(gpu.saturating_mul(prompt.tokens_per_key));
            let prediction = predict(prompt.prompt_tokens, Cached { tokens, reloaded }, &load, &cost);
            let cost_ms = placement_cost(&prediction, cost.per_token_ms, least_uncached, followers, state.config.queue_externality);
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

/// The keys an approximate peer hashes: llm-d cuts the prompt to its first 256 blocks.
fn peer_keys(policy: Policy, prompt: &PromptView) -> &[BlockKey] {
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

/// Per worker, in `workers` order.
fn matches(state: &AppState, workers: &[WorkerView], prompt: &PromptView, now: Instant) -> Vec<Held> {
    if prompt.keys.is_empty() {
        return vec![Held::default(); workers.len()];
    }
    if !prompt.exact {
        let learned = state.fleet.learned_matches(workers, &prompt.keys);
        return learned.into_iter().map(|n| Held { matched: n, gpu: n }).collect();
    }
    state.fleet.exact_matches(workers, &prompt.keys, now).into_iter().map(|(matched, gpu)| Held { matched, gpu }).collect()
}

/// Records the decision as a fleet event: kvroute credits the worker with exact keys until
/// its events arrive; text chunks are remembered by the policies that route on them.
fn record(
    state: &AppState,
    policy: Policy,
    prompt: &PromptView,
    chosen: &Candidate,
    requested: u64,
    budget: Option<crate::tenancy::Scope>,
    now: Instant,
) -> AssignmentId {
    let mut rng = state.selector.rng();
    let worker = &chosen.worker.id;
    let credit: Arc<[BlockKey]> = if policy == Policy::Kvroute && prompt.exact { prompt.keys.clone() } else { Arc::from([]) };
    let predicted_cached_tokens = prompt.exact.then(|| {
        // vLLM recomputes a fully cached prompt's last token: hits stop at the full blocks
        // before it.
        let block = prompt.tokens_per_key.max(1);
        let cacheable = prompt.prompt_tokens.saturating_sub(1) / block * block;
        chosen.matched.saturating_mul(block).min(cacheable)
    });
    // The proxy's own id first (it cancels by it); a random one when it named none or the
    // id is taken.
    let mut next = (requested != 0).then_some(requested);
    loop {
        let id = AssignmentId(next.take().unwrap_or_else(|| rng.next_u64() ^ state.store.id_salt()));
        if id.0 == 0 {
            continue;
        }
        let assignment = Assignment {
            id,
            worker: worker.clone(),
            policy,
            prompt_tokens: prompt.prompt_tokens,
            uncached_tokens: chosen.prediction.uncached_tokens,
            predicted_ttft_ms: chosen.prediction.ttft_ms,
            features: chosen.prediction.features,
            created_at: now,
            first_token_at: None,
            predicted_cached_tokens,
            budget: budget.clone(),
        };
        match state.apply_at(FleetEvent::Assigned { assignment, credit: credit.clone() }, now) {
            // Taken (2^-64 odds, or a replica sharing seed and salt): drawn again rather than
            // shadowing a live assignment.
            Applied::Duplicate => continue,
            // The proxy cancelled it already: nothing is recorded or learned.
            Applied::Abandoned => {
                state.metrics.picks_abandoned.inc();
                if let Some(scope) = budget {
                    state.tenants.settle(scope, id.0, 0);
                }
                return id;
            }
            _ => {}
        }
        match policy {
            Policy::Kvroute if prompt.exact => {}
            Policy::Kvroute => state.fleet.learn(&prompt.keys, worker),
            Policy::SglangCacheAware | Policy::LlmdDefault => state.fleet.peer_learn(policy, peer_keys(policy, prompt), worker),
            _ => {}
        }
        return id;
    }
}
