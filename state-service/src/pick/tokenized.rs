//! The API's pick: text and chat prompts are first turned into token ids (see
//! [`crate::tokenize`]) so kvroute matches their blocks exactly, then decided like token-id
//! prompts. Only kvroute and dynamo_kv (whose frontend tokenizes) do: the other baselines
//! either ignore keys or, like SGLang's and llm-d's approximate routers, match request text.
//!
//! Tokenizing needs only the model's static facts (its base model's tokenizer, block size,
//! a worker to ask); the decision's snapshot of load and health is taken after it, so a
//! slow tokenization never decides on load that is milliseconds old.

use super::{commit, finish, plan, rejected, Plan, PromptView};
use crate::tenancy::{Admission, Charge};
use rand::RngCore;
use crate::score::Policy;
use crate::state::AppState;
use crate::tokenize::wants_tokens;
use kvroute_core::keys::{token_block_keys, KeyRoot};
use kvroute_core::wire::{PickRequest, PickResponse};

/// Decides where `req` goes, tokenizing its prompt when that can make the match exact.
///
/// `deadline`: when the proxy stops waiting for the answer; tokenizing gives up before it (the
/// pick then uses text-chunk keys), whatever `tokenization.deadline_ms` allows.
///
/// A request with a tenant whose budget applies is admitted between the decision and its
/// record: charged the predicted uncached prompt tokens on the chosen worker plus its output
/// reservation; a request that does not fit is answered with a rejection and leaves nothing
/// behind.
pub async fn pick(state: &AppState, req: &PickRequest, deadline: Option<std::time::Instant>) -> PickResponse {
    let policy = state.policy();
    let prompt = match policy {
        // Dynamo tokenizes in its frontend: its KV router matches exact blocks too.
        Policy::Kvroute | Policy::DynamoKv if wants_tokens(req) => match deadline {
            Some(until) => match tokio::time::timeout_at(until.into(), exact_prompt(state, req)).await {
                Ok(prompt) => prompt,
                Err(_) => {
                    state.metrics.count_tokenize_failure(kvroute_core::wire::TokenizationPath::TokenizationLocal, crate::metrics::TokenizeFailure::Deadline);
                    None
                }
            },
            None => exact_prompt(state, req).await,
        },
        _ => None,
    };
    // `pick_latency_seconds` is the decision; tokenizing has its own `tokenize_seconds`.
    let started = std::time::Instant::now();
    let mut view = state.fleet.model_view(&req.model);
    let mut continued = 0;
    if !req.previous_response_id.is_empty() {
        match crate::pick::affinity::owner(state, &req.previous_response_id, "pick").await {
            // Nobody stored it (or it expired): any worker answers vLLM's own 404.
            None => {}
            Some(owner) => {
                view = state.fleet.pinned_view(&req.model, &owner.worker);
                if view.workers.is_empty() {
                    state.metrics.count_affinity("pick", "gone");
                    return finish(state, policy, started, super::fallback(state, policy, req, kvroute_core::wire::DegradedReason::DegradedResponseOwnerGone));
                }
                state.metrics.count_affinity("pick", "routed");
                continued = owner.tokens;
            }
        }
    }
    let chosen = match plan(state, policy, req, view, prompt, continued) {
        Plan::Fallback(response) => return finish(state, policy, started, response),
        Plan::Chosen(chosen) => chosen,
    };
    // The budget's reservation is named by the assignment id: the proxy's, else one drawn now.
    let id = match req.assignment_id {
        0 => state.selector.rng().next_u64() ^ state.store.id_salt(),
        id => id,
    };
    let output = match req.max_tokens {
        0 => state.tenants.config().default_output_tokens,
        n => n,
    };
    let charge = Charge { tenant: &req.tenant, model: &req.model, id, tokens: u64::from(chosen.uncached_tokens()) + u64::from(output) };
    let response = match state.tenants.admit(&charge, &state.metrics).await {
        Admission::Rejected(rejection) => rejected(policy, rejection),
        admitted => commit(state, req, chosen, id, admitted.scope().cloned()),
    };
    finish(state, policy, started, response)
}

async fn exact_prompt(state: &AppState, req: &PickRequest) -> Option<PromptView> {
    let target = state.fleet.tokenize_target(&req.model)?;
    let exact = state.tokenization.exact_ids(&state.metrics, req, &target).await?;
    // Rooted at the request's model: the adapter's name for a LoRA request, as vLLM roots it.
    let root = KeyRoot::new(&req.model, &req.cache_salt);
    let keys = token_block_keys(&root, &exact.ids, target.block_size as usize);
    // Not one full block within the encoding budget (a first message longer than
    // `max_encode_bytes` stops before its text): the filter's text-chunk keys still route it
    // by what was learned, a degraded decision, where empty exact keys would route it on
    // load alone and call that exact.
    if keys.is_empty() && !req.text_chunk_keys.is_empty() {
        return None;
    }
    Some(PromptView::from_ids(keys, exact.prompt_tokens as usize, target.block_size, exact.path))
}
