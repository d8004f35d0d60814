//! The API's pick: text and chat prompts are first turned into token ids (see
//! [`crate::tokenize`]) so kvroute matches their blocks exactly, then decided like token-id
//! prompts. Only kvroute and dynamo_kv (whose frontend tokenizes) do: the other baselines
//! either ignore keys or, like SGLang's and llm-d's approximate routers, match request text.
//!
//! Tokenizing needs only the model's static facts (its base model's tokenizer, block size,
//! a worker to ask); the decision's snapshot of load and health is taken after it, so a
//! slow tokenization never decides on load that is milliseconds old.

use super::{decide, finish, PromptView};
use crate::score::Policy;
use crate::state::AppState;
use crate::tokenize::wants_tokens;
use kvroute_core::keys::{token_block_keys, KeyRoot};
use kvroute_core::wire::{PickRequest, PickResponse};

/// Decides where `req` goes, tokenizing its prompt when that can make the match exact.
///
/// `budget`: when the proxy stops waiting for the answer; tokenizing gives up before it (the
/// pick then uses text-chunk keys), whatever `tokenization.deadline_ms` allows.
pub async fn pick(state: &AppState, req: &PickRequest, budget: Option<std::time::Instant>) -> PickResponse {
    let policy = state.policy();
    let prompt = match policy {
        // Dynamo tokenizes in its frontend: its KV router matches exact blocks too.
        Policy::Kvroute | Policy::DynamoKv if wants_tokens(req) => match budget {
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
    let view = state.fleet.model_view(&req.model);
    finish(state, policy, started, decide(state, policy, req, view, prompt))
}

async fn exact_prompt(state: &AppState, req: &PickRequest) -> Option<PromptView> {
    let target = state.fleet.tokenize_target(&req.model)?;
    let exact = state.tokenization.exact_ids(&state.metrics, req, &target).await?;
    // Rooted at the request's model: the adapter's name for a LoRA request, as vLLM roots it.
    let root = KeyRoot::new(&req.model, &req.cache_salt);
    let keys = token_block_keys(&root, &exact.ids, target.block_size as usize);
    Some(PromptView::from_ids(keys, exact.prompt_tokens as usize, target.block_size, exact.path))
}
