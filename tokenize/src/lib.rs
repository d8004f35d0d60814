//! kvroute-tokenize: the token ids vLLM will compute for a request, so the router can key the
//! request's KV blocks exactly.
//!
//! vLLM caches blocks of the *rendered* prompt's token ids. For a chat request that is: the
//! request's messages normalized the way vLLM normalizes them ([`openai`], and for Anthropic
//! `/v1/messages` first converted the way vLLM's endpoint converts them, [`anthropic`], and
//! for `/v1/responses` first built into chat messages the way vLLM's endpoint builds them,
//! [`responses`]),
//! rendered with the model's Jinja chat template exactly as Hugging Face's
//! `apply_chat_template` renders it ([`chat`]), then encoded with the model's `tokenizer.json`
//! without adding special tokens. Plain completion prompts are encoded with special tokens.
//!
//! Multi-turn conversations re-send their whole history, so encoding goes through a bounded
//! cache of prompt pieces cut at added tokens ([`pieces`], [`cache`], [`encode`]): a warm turn
//! encodes only what is new; rendering reuses the rendered history of earlier turns where the
//! template allows it ([`prefix`]). The state service and the simulator share this crate.
//!
//! The modules form layers, each using only those below it: `error`; then `config`, `pieces`,
//! `cache`, `openai`, `anthropic`, `responses`, `chat`; then `input` (request -> [`chat::RenderInput`]),
//! `encode` (text -> ids) and `prefix` (incremental rendering); [`model`] on top.

pub mod anthropic;
pub mod cache;
pub mod chat;
pub mod config;
pub mod encode;
pub mod error;
pub mod input;
pub mod model;
pub mod openai;
pub mod pieces;
pub mod responses;
mod prefix;

pub use anthropic::AnthropicRendering;
pub use cache::CacheStats;
pub use error::TokenizeError;
pub use kvroute_core::request::Api;
pub use chat::RenderedChat;
pub use model::{ModelTokenizer, TokenizerOptions};
pub use openai::ContentFormat;

use kvroute_core::keys::{token_block_keys, KeyRoot};
use kvroute_core::BlockKey;

/// kvroute block keys of a prompt's token ids (full blocks only), under the root of
/// (`model`, no LoRA, `cache_salt`).
pub fn block_keys(model: &str, cache_salt: &str, ids: &[u32], block_size: usize) -> Vec<BlockKey> {
    token_block_keys(&KeyRoot::new(model, cache_salt), ids, block_size)
}

#[cfg(test)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<ModelTokenizer>();
}
