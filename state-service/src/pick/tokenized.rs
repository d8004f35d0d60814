//! The API's pick: text and chat prompts are first turned into token ids (see
//! [`crate::tokenize`]) so kvroute matches their blocks exactly, then decided like token-id
//! prompts. Only the kvroute policy tokenizes: the baselines either ignore keys or, like
//! `approx_prefix`, are defined by text chunks.

use super::{pick_with, PromptView};
use crate::score::Policy;
use crate::state::AppState;
use crate::tokenize::wants_tokens;
use kvroute_core::keys::{token_block_keys, KeyRoot};
use kvroute_core::wire::{PickRequest, PickResponse};

/// Decides where `req` goes, tokenizing its prompt when that can make the match exact.
pub async fn pick(state: &AppState, req: &PickRequest) -> PickResponse {
    if *state.policy.read() != Policy::Kvroute || !wants_tokens(req) {
        return pick_with(state, req, None);
    }
    let workers: Vec<_> = state.registry.read().for_model(&req.model).into_iter().filter(|w| w.load.lock().healthy).collect();
    let Some(block_size) = workers.first().map(|w| w.block_size) else {
        // Unknown model or no healthy worker: the sync path answers the fallback.
        return pick_with(state, req, None);
    };
    let Some(exact) = state.tokenization.exact_ids(&state.metrics, req, &workers).await else {
        return pick_with(state, req, None);
    };
    let root = KeyRoot::new(&req.model, &req.lora_name, &req.cache_salt);
    let keys = token_block_keys(&root, &exact.ids, block_size as usize);
    let view = PromptView::from_ids(keys, exact.ids.len(), block_size, exact.path);
    pick_with(state, req, Some(view))
}
