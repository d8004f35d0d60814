//! A pick: from a [`PickRequest`] to a worker, an assignment and a [`PickResponse`].
//!
//! Every policy sees the same candidates (the model's healthy workers, with their load, their
//! matched prefix and a TTFT prediction); only the choice differs (see [`choose`]). The
//! prediction is computed for every policy, so the predicted-vs-actual metric and calibration
//! work whichever policy a benchmark pass runs. Unknown models and fleets without a healthy
//! worker answer 200 with an empty worker and a `degraded_reason`: the proxy then uses its
//! default route, which is the filter's fail-open path anyway.

pub mod choose;
pub mod prompt;
pub mod tokenized;

pub use prompt::PromptView;

use crate::assign::{Assignment, AssignmentId};
use crate::metrics::{DegradedReason, PickLabels, PickOutcome, TokenizationLabels, TokenizationPathLabel};
use crate::registry::WorkerEntry;
use crate::score::{predict, Cost, LoadView, Policy, Prediction};
use crate::state::AppState;
use crate::types::WorkerId;
use kvroute_core::wire::{PickRequest, PickResponse, TokenizationPath};
use rand::Rng;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::time::Instant;

/// One healthy worker of the request's model, as every policy sees it.
pub struct Candidate {
    pub worker: Arc<WorkerEntry>,
    pub load: LoadView,
    /// Leading keys it holds: KV index or speculative credit for token keys, learned routing
    /// for text chunks.
    pub matched: u32,
    pub prediction: Prediction,
}

/// Decides where `req` goes and records the assignment, without tokenizing text or chat
/// prompts (they use text chunks; [`tokenized::pick`] is the API's path).
pub fn pick(state: &AppState, req: &PickRequest) -> PickResponse {
    pick_with(state, req, None)
}

/// [`pick`] with the prompt already resolved (`None`: from the request as it is).
pub fn pick_with(state: &AppState, req: &PickRequest, prompt: Option<PromptView>) -> PickResponse {
    let started = std::time::Instant::now();
    let policy = *state.policy.read();
    let response = decide(state, policy, req, prompt);
    let outcome = match (response.worker_id.is_empty(), response.degraded_reason.is_empty()) {
        (true, _) => PickOutcome::Fallback,
        (false, true) => PickOutcome::Routed,
        (false, false) => PickOutcome::Degraded,
    };
    state.metrics.picks.get_or_create(&PickLabels { policy, outcome }).inc();
    let path = tokenization_label(response.tokenization);
    state.metrics.tokenization.get_or_create(&TokenizationLabels { path }).inc();
    state.metrics.pick_latency.observe(started.elapsed().as_secs_f64());
    response
}

fn decide(state: &AppState, policy: Policy, req: &PickRequest, prompt: Option<PromptView>) -> PickResponse {
    let workers = state.registry.read().for_model(&req.model);
    if workers.is_empty() {
        return fallback(state, policy, req, DegradedReason::UnknownModel);
    }
    let healthy: Vec<_> = workers.into_iter().filter(|w| w.load.lock().healthy).collect();
    if healthy.is_empty() {
        return fallback(state, policy, req, DegradedReason::NoHealthyWorker);
    }
    let prompt = prompt.unwrap_or_else(|| PromptView::new(req, healthy[0].block_size, state.config.text_chunk_bytes));
    let now = Instant::now();
    let candidates = candidates(state, healthy, &prompt, now);
    let chosen = &candidates[choose::choose(state, policy, &candidates, &prompt)];
    learn(state, policy, &prompt, &chosen.worker.id, now);
    let id = record(state, policy, &prompt, chosen, now);
    let degraded = degraded_reason(policy, prompt.limitation)
        .or_else(|| state.store.degraded().then_some(DegradedReason::StateUnavailable));
    if let Some(reason) = degraded {
        state.metrics.count_degraded(reason);
    }
    if !prompt.keys.is_empty() {
        state.metrics.matched_prefix_ratio.observe(f64::from(chosen.matched) / prompt.keys.len() as f64);
    }
    tracing::debug!(request_id = %req.request_id, worker = %chosen.worker.id, %policy, matched = chosen.matched,
        predicted_ms = chosen.prediction.ttft_ms, "pick");
    PickResponse {
        assignment_id: id.0,
        worker_id: chosen.worker.id.to_string(),
        endpoint: chosen.worker.config.endpoint.clone(),
        cluster: chosen.worker.config.cluster.clone(),
        matched_blocks: chosen.matched,
        total_blocks: prompt.keys.len() as u32,
        predicted_ttft_ms: chosen.prediction.ttft_ms,
        policy: policy.to_string(),
        tokenization: tokenization(policy, &prompt) as i32,
        degraded_reason: degraded.map(|r| r.as_str().to_string()).unwrap_or_default(),
    }
}

/// Which prompt limitations degrade which policy: kvroute wants exact keys; approx_prefix
/// lives on text chunks anyway but loses token keys cut with the wrong block size.
fn degraded_reason(policy: Policy, limitation: Option<DegradedReason>) -> Option<DegradedReason> {
    match (policy, limitation) {
        (Policy::Kvroute, reason) => reason,
        (Policy::ApproxPrefix, Some(DegradedReason::BlockSizeMismatch)) => Some(DegradedReason::BlockSizeMismatch),
        _ => None,
    }
}

fn tokenization(policy: Policy, prompt: &PromptView) -> TokenizationPath {
    match policy {
        Policy::Kvroute | Policy::ApproxPrefix if !prompt.keys.is_empty() => prompt.tokenization,
        _ => TokenizationPath::TokenizationNone,
    }
}

fn tokenization_label(path: i32) -> TokenizationPathLabel {
    match TokenizationPath::try_from(path).unwrap_or(TokenizationPath::TokenizationNone) {
        TokenizationPath::TokenizationExactTokenIds => TokenizationPathLabel::ExactTokenIds,
        TokenizationPath::TokenizationLocal => TokenizationPathLabel::Local,
        TokenizationPath::TokenizationWorker => TokenizationPathLabel::Worker,
        TokenizationPath::TokenizationTextChunks => TokenizationPathLabel::TextChunks,
        TokenizationPath::TokenizationNone | TokenizationPath::TokenizationUnspecified => TokenizationPathLabel::None,
    }
}

fn fallback(state: &AppState, policy: Policy, req: &PickRequest, reason: DegradedReason) -> PickResponse {
    state.metrics.count_degraded(reason);
    tracing::info!(request_id = %req.request_id, model = %req.model, reason = reason.as_str(), "pick fell back to the default route");
    PickResponse {
        policy: policy.to_string(),
        tokenization: TokenizationPath::TokenizationNone as i32,
        degraded_reason: reason.as_str().to_string(),
        ..Default::default()
    }
}

fn candidates(state: &AppState, workers: Vec<Arc<WorkerEntry>>, prompt: &PromptView, now: Instant) -> Vec<Candidate> {
    let matched = matches(state, &workers, prompt, now);
    let assignments = state.assignments.lock();
    let priors = &state.config.priors;
    workers
        .into_iter()
        .zip(matched)
        .map(|(worker, matched)| {
            let scraped = worker.load.lock().load.clone();
            let pending = assignments.pending(&worker.id);
            let load = LoadView {
                running: scraped.running,
                waiting: scraped.waiting,
                own_waiting: pending.waiting,
                own_waiting_tokens: pending.waiting_tokens,
                own_in_flight: pending.in_flight,
            };
            let cost = {
                let c = worker.calibration.lock();
                Cost {
                    per_token_ms: c.per_token_ms(),
                    overhead_ms: c.overhead_ms(),
                    decode_ms_per_running: priors.decode_ms_per_running,
                    default_request_tokens: priors.default_request_tokens,
                    step_tokens: worker.config.max_num_batched_tokens.unwrap_or(priors.max_num_batched_tokens),
                }
            };
            let matched_tokens = matched.saturating_mul(prompt.tokens_per_key);
            let prediction = predict(prompt.prompt_tokens, matched_tokens, &load, &cost);
            Candidate { worker, load, matched, prediction }
        })
        .collect()
}

/// Per worker (in `workers` order), leading keys held: for token keys the larger of the KV
/// index (any engine of the worker) and speculative credit; for text chunks, learned routing.
fn matches(state: &AppState, workers: &[Arc<WorkerEntry>], prompt: &PromptView, now: Instant) -> Vec<u32> {
    if prompt.keys.is_empty() {
        return vec![0; workers.len()];
    }
    if !prompt.exact {
        let learned = state.approx.lock().matches(&prompt.keys);
        return workers.iter().map(|w| learned.get(&w.id).copied().unwrap_or(0)).collect();
    }
    let by_engine: HashMap<_, _> = state.index.match_prefix(&prompt.keys).into_iter().map(|m| (m.engine, m.matched_blocks)).collect();
    let speculative = state.speculative.lock().matches(&prompt.keys, now);
    workers
        .iter()
        .map(|w| {
            let indexed = w.slots().filter_map(|s| by_engine.get(&s).copied()).max().unwrap_or(0);
            let credited = speculative.iter().find(|(id, _)| id == &w.id).map_or(0, |(_, n)| *n);
            indexed.max(credited)
        })
        .collect()
}

/// What a pick teaches: kvroute credits the worker with exact keys until its events arrive;
/// text chunks are remembered by the policies that route on them.
fn learn(state: &AppState, policy: Policy, prompt: &PromptView, worker: &WorkerId, now: Instant) {
    match policy {
        Policy::Kvroute if prompt.exact => state.speculative.lock().credit(&prompt.keys, worker, now),
        Policy::Kvroute | Policy::ApproxPrefix => state.approx.lock().learn(&prompt.keys, worker),
        _ => {}
    }
}

fn record(state: &AppState, policy: Policy, prompt: &PromptView, chosen: &Candidate, now: Instant) -> AssignmentId {
    let id = {
        let mut rng = state.rng.lock();
        AssignmentId(loop {
            let id: u64 = rng.gen::<u64>() ^ state.store.id_salt();
            if id != 0 {
                break id;
            }
        })
    };
    let assignment = Assignment {
        id,
        worker: chosen.worker.id.clone(),
        policy,
        prompt_tokens: prompt.prompt_tokens,
        uncached_tokens: chosen.prediction.uncached_tokens,
        predicted_ttft_ms: chosen.prediction.ttft_ms,
        features: chosen.prediction.features,
        created_at: now,
        first_token_at: None,
    };
    let credited = if policy == Policy::Kvroute && prompt.exact { &prompt.keys[..] } else { &[] };
    state.store.assigned(&assignment, credited);
    let mut table = state.assignments.lock();
    table.insert(assignment);
    state.metrics.assignments_in_flight.set(table.len() as i64);
    id
}
