//! [`ModelTokenizer`]: one model's tokenizer + chat template + piece cache, shared by every
//! request for that model (`&self` methods, `Send + Sync`).
//!
//! The top of the crate: it wires the lower modules together and nothing in the crate depends
//! on it. A chat request flows `template_input` -> [`crate::input`] (parse + normalize) ->
//! [`crate::prefix`] or [`crate::chat`] (render) -> [`crate::encode`] (pieces through
//! [`crate::cache`]) -> token ids.
//!
//! Cost (see the README for figures): a cold request renders and encodes the whole prompt
//! (tens of milliseconds for 32k tokens: run it in `spawn_blocking`); a warm turn of a
//! conversation renders only the messages since its last user query ([`crate::prefix`]) and
//! encodes only text pieces not seen recently, under a millisecond for 32k tokens.

use crate::anthropic::AnthropicRendering;
use crate::cache::CacheStats;
use crate::chat::{ChatTemplate, RenderInput};
/// Re-exported at its old path: callers name it `kvroute_tokenize::model::RenderedChat`.
pub use crate::chat::RenderedChat;
use crate::config::TokenizerConfig;
use crate::encode::{CachedEncoder, Prefix};
use crate::error::TokenizeError;
use crate::input::{self, RenderSettings};
use crate::openai::ContentFormat;
use crate::prefix::PrefixRenderer;
use kvroute_core::request::Api;
use serde_json::{json, Map, Value as Json};
use std::path::Path;

/// Configuration of one model's tokenizer.
#[derive(Clone, Debug)]
pub struct TokenizerOptions {
    /// Byte budget of the piece cache (prompt text bytes + 4 per token id); 0 disables it.
    pub cache_bytes: usize,
    pub content_format: ContentFormat,
    pub anthropic: AnthropicRendering,
    /// vLLM's `--default-chat-template-kwargs`, if the workers set it.
    pub default_template_kwargs: Map<String, Json>,
    /// Byte budget of the rendered-prefix cache ([`crate::prefix`]); 0 renders every request
    /// in full.
    pub render_cache_bytes: usize,
}

impl Default for TokenizerOptions {
    fn default() -> Self {
        TokenizerOptions {
            cache_bytes: 64 << 20,
            content_format: ContentFormat::Auto,
            anthropic: AnthropicRendering::Vllm,
            default_template_kwargs: Map::new(),
            render_cache_bytes: 64 << 20,
        }
    }
}

pub struct ModelTokenizer {
    template: ChatTemplate,
    prefix: PrefixRenderer,
    encoder: CachedEncoder,
    settings: RenderSettings,
    /// Prepended to plain-text prompts when `add_bos_token` is set and the post-processor
    /// did not add it.
    text_bos: Option<u32>,
    /// The post-processor adds tokens: plain text bypasses the piece cache.
    text_post_processed: bool,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer").field("encoder", &self.encoder).field("settings", &self.settings).finish()
    }
}

impl ModelTokenizer {
    /// Loads `tokenizer.json` and `tokenizer_config.json` from `dir` with default options.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizeError> {
        Self::from_dir_with(dir, TokenizerOptions::default())
    }

    pub fn from_dir_with(dir: &Path, options: TokenizerOptions) -> Result<Self, TokenizeError> {
        let path = dir.join("tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(&path).map_err(|e| TokenizeError::Tokenizer { path: path.clone(), message: e.to_string() })?;
        let config = TokenizerConfig::from_file(&dir.join("tokenizer_config.json"))?;
        Self::new(tokenizer, &config, options)
    }

    pub fn new(tokenizer: tokenizers::Tokenizer, config: &TokenizerConfig, options: TokenizerOptions) -> Result<Self, TokenizeError> {
        let template = ChatTemplate::new(&config.chat_template, &config.special_tokens)?;
        let encoder = CachedEncoder::new(tokenizer, options.cache_bytes);
        let text_bos = config.bos_token.as_deref().filter(|_| config.add_bos_token).and_then(|b| encoder.tokenizer().token_to_id(b));
        let probe = "kvroute probe";
        let text_post_processed = encoder.encode_uncached(probe, true)? != encoder.encode_uncached(probe, false)?;
        let merge_inline_system = rejects_inline_system(&template);
        let settings = RenderSettings {
            content_format: options.content_format,
            anthropic: options.anthropic,
            default_kwargs: options.default_template_kwargs,
            merge_inline_system,
        };
        let prefix = PrefixRenderer::new(options.render_cache_bytes, &template, &settings);
        Ok(ModelTokenizer { template, prefix, encoder, settings, text_bos, text_post_processed })
    }

    /// Renders a chat request's `template_input` (see `kvroute_core::request::Prompt::Chat`),
    /// reusing the rendered history of earlier turns where that is exact ([`crate::prefix`]).
    pub fn render_chat(&self, template_input: &str, api: Api) -> Result<RenderedChat, TokenizeError> {
        match self.prefix.render(template_input, api, &self.template, &self.settings) {
            Some(rendered) => Ok(rendered),
            None => self.render_chat_full(template_input, api),
        }
    }

    /// [`Self::render_chat`] from scratch: the reference for tests and benchmarks.
    pub fn render_chat_full(&self, template_input: &str, api: Api) -> Result<RenderedChat, TokenizeError> {
        let parsed = input::parse(template_input, api, self.template.source(), &self.settings)?;
        let text = self.template.render(&parsed.render)?;
        Ok(RenderedChat { text, media_items: parsed.media_items })
    }

    /// The token ids vLLM computes for a chat request: render, then encode without adding
    /// special tokens (through the piece cache).
    pub fn encode_chat(&self, template_input: &str, api: Api) -> Result<Vec<u32>, TokenizeError> {
        let rendered = self.render_chat(template_input, api)?;
        self.encoder.encode(&rendered.text)
    }

    /// [`Self::encode_chat`] without any cache: the reference for tests and benchmarks.
    pub fn encode_chat_uncached(&self, template_input: &str, api: Api) -> Result<Vec<u32>, TokenizeError> {
        let rendered = self.render_chat_full(template_input, api)?;
        self.encoder.encode_uncached(&rendered.text, false)
    }

    /// A `/v1/completions` string prompt, encoded with special tokens as vLLM does
    /// (`add_special_tokens=True`; for Qwen3 that adds nothing).
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        let mut ids = if self.text_post_processed { self.encoder.encode_uncached(text, true)? } else { self.encoder.encode(text)? };
        if let Some(bos) = self.text_bos.filter(|b| ids.first() != Some(b)) {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// [`Self::encode_text`] of the text up to its last space within `budget` bytes, which are
    /// exactly the whole text's first ids (see [`CachedEncoder::space_cut`]); only those bytes
    /// are read, however long the text. `None` when no cut is exact: no such space, a tokenizer
    /// that cannot be cut at spaces, or a post-processor that adds tokens (at the end too, for
    /// all we know).
    pub fn encode_text_prefix(&self, text: &str, budget: usize) -> Result<Option<Prefix>, TokenizeError> {
        if self.text_post_processed {
            return Ok(None);
        }
        let Some(cut) = self.encoder.space_cut(text, budget) else { return Ok(None) };
        let ids = self.encode_text(&text[..cut])?;
        Ok(Some(Prefix { ids, rest_bytes: text.len() - cut }))
    }

    /// Renders arbitrary template input (already normalized messages), for tests.
    pub fn render_raw(&self, input: &RenderInput) -> Result<String, TokenizeError> {
        self.template.render(input)
    }

    /// Whether warm turns reuse rendered history (the template passed the self-check).
    pub fn renders_incrementally(&self) -> bool {
        self.prefix.is_enabled()
    }

    /// Whether `/v1/messages` inline system messages are merged into the leading one.
    pub fn merges_inline_system(&self) -> bool {
        self.settings.merge_inline_system
    }

    /// The cached encoder, for callers that already hold rendered text.
    pub fn encoder(&self) -> &CachedEncoder {
        &self.encoder
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.encoder.stats()
    }
}

/// vLLM's `_detect_merge_inline_system`: does the template fail on a non-leading system message?
fn rejects_inline_system(template: &ChatTemplate) -> bool {
    let messages = ["system", "user", "system", "user"].iter().map(|r| json!({"role": r, "content": "t"})).collect();
    let probe = RenderInput { messages, add_generation_prompt: false, ..RenderInput::default() };
    template.render(&probe).is_err()
}
