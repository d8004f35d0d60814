//! Text and chat prompts -> the token ids vLLM will cache, so their blocks are keyed exactly.
//!
//! vLLM caches blocks of the chat-template-rendered prompt's token ids; a chat request matches
//! a worker's cache exactly only if kvroute computes the same ids. Paths, tried in order (each
//! counted in `kvroute_tokenization_total{path}` and named in the pick response):
//! 1. `local`: this service's tokenizer and chat template ([`local`], `kvroute-tokenize`);
//! 2. `worker`: a worker's vLLM `/tokenize` ([`worker`]), short timeout, paused after failures;
//! 3. `text_chunks`: the filter's approximate text-chunk keys (the pick path's default);
//! 4. `none`: load only.
//! Paths 2-4 are degraded decisions (`tokenizer_unavailable`). Why a path gave nothing is
//! counted in `kvroute_tokenization_failures_total{path,reason}`.
//!
//! Tokenization is CPU-bound (a warm conversation turn is sub-ms to ~2 ms, a cold 32k-token
//! prompt ~75 ms), so prompts above `inline_max_bytes` and tokenizer loading run on tokio's
//! blocking pool; small prompts run inline, where a pool hop would cost more than the work.

pub mod collector;
pub mod local;
pub mod worker;

use crate::config::Config;
use crate::fleet::TokenizeTarget;
use crate::metrics::{Metrics, TokenizeFailure};
use kvroute_core::wire::{Endpoint, PickRequest, TokenizationPath};
use kvroute_tokenize::{Api, ModelTokenizer, TokenizeError};
use local::{LocalTokenizers, Lookup};
use std::sync::Arc;
use std::time::Duration;
use worker::WorkerTokenizer;

/// Exact token ids of a prompt and where they came from.
#[derive(Clone, Debug, PartialEq)]
pub struct ExactIds {
    pub ids: Vec<u32>,
    /// `TokenizationLocal` or `TokenizationWorker`.
    pub path: TokenizationPath,
}

pub struct Tokenization {
    pub local: Arc<LocalTokenizers>,
    worker: WorkerTokenizer,
    inline_max_bytes: usize,
    worker_fallback: bool,
}

/// Whether a pick's prompt needs tokenizing (text or chat, no exact keys from the filter).
pub fn wants_tokens(req: &PickRequest) -> bool {
    req.token_keys.is_empty() && (!req.prompt_text.is_empty() || !req.chat_json.is_empty())
}

impl Tokenization {
    pub fn new(config: &Config) -> Tokenization {
        let t = &config.tokenization;
        Tokenization {
            local: Arc::new(LocalTokenizers::new(config)),
            worker: WorkerTokenizer::new(Duration::from_millis(t.worker_timeout_ms), Duration::from_millis(t.worker_retry_ms)),
            inline_max_bytes: t.inline_max_bytes,
            worker_fallback: t.worker_fallback,
        }
    }

    /// Starts loading the tokenizers of `models` on the blocking pool (start-up; needs a
    /// runtime). [`Self::loading`] is true until they are done.
    pub fn preload(&self, models: Vec<String>) {
        for model in models {
            self.start_load(&model);
        }
    }

    fn start_load(&self, model: &str) {
        if self.local.claim(model) {
            let (local, model) = (self.local.clone(), model.to_string());
            tokio::task::spawn_blocking(move || local.finish_load(&model));
        }
    }

    /// Whether a tokenizer load is under way.
    pub fn loading(&self) -> bool {
        self.local.loading()
    }

    /// Whether `model`'s worker path is paused after a failed call.
    pub fn worker_paused(&self, model: &str) -> bool {
        self.worker.is_paused(model)
    }

    /// The prompt's exact ids via the local tokenizer of `target`'s base model, else a worker
    /// of `target` (healthy workers of the request's model); `None` when neither path could
    /// give them.
    pub async fn exact_ids(&self, metrics: &Metrics, req: &PickRequest, target: &TokenizeTarget) -> Option<ExactIds> {
        let started = std::time::Instant::now();
        match self.local_ids(req, &target.base_model).await {
            Ok(ids) => {
                metrics.observe_tokenize(TokenizationPath::TokenizationLocal, started.elapsed().as_secs_f64());
                return Some(ExactIds { ids, path: TokenizationPath::TokenizationLocal });
            }
            Err(reason) => {
                metrics.count_tokenize_failure(TokenizationPath::TokenizationLocal, reason);
                tracing::debug!(request_id = %req.request_id, model = %req.model, reason = reason.as_str(), "no local tokenization");
            }
        }
        if !self.worker_fallback {
            return None;
        }
        let started = std::time::Instant::now();
        match self.worker_ids(req, &target.workers).await {
            Ok(ids) => {
                metrics.observe_tokenize(TokenizationPath::TokenizationWorker, started.elapsed().as_secs_f64());
                Some(ExactIds { ids, path: TokenizationPath::TokenizationWorker })
            }
            Err(reason) => {
                metrics.count_tokenize_failure(TokenizationPath::TokenizationWorker, reason);
                tracing::debug!(request_id = %req.request_id, model = %req.model, reason = reason.as_str(), "no worker tokenization");
                None
            }
        }
    }

    async fn local_ids(&self, req: &PickRequest, model: &str) -> Result<Vec<u32>, TokenizeFailure> {
        let tokenizer = match self.local.lookup(model) {
            Lookup::Ready(t) => t,
            Lookup::Unavailable => return Err(TokenizeFailure::Unavailable),
            // The pick never waits for a load: it takes the next path meanwhile.
            Lookup::NeedsLoad => {
                self.start_load(model);
                return Err(TokenizeFailure::Loading);
            }
            Lookup::Loading => return Err(TokenizeFailure::Loading),
        };
        if req.chat_json.len() + req.prompt_text.len() <= self.inline_max_bytes {
            return encode(&tokenizer, req.endpoint, &req.chat_json, &req.prompt_text);
        }
        let (endpoint, chat, text) = (req.endpoint, req.chat_json.clone(), req.prompt_text.clone());
        tokio::task::spawn_blocking(move || encode(&tokenizer, endpoint, &chat, &text))
            .await
            .unwrap_or(Err(TokenizeFailure::Encode))
    }

    async fn worker_ids(&self, req: &PickRequest, workers: &[Arc<crate::fleet::WorkerEntry>]) -> Result<Vec<u32>, TokenizeFailure> {
        if self.worker.is_paused(&req.model) {
            return Err(TokenizeFailure::Backoff);
        }
        let url = workers.iter().find_map(|w| worker::tokenize_url(&w.config)).ok_or(TokenizeFailure::NoEndpoint)?;
        let body = worker::request_body(req)?;
        self.worker.tokenize(&req.model, &url, &body).await
    }
}

/// Chat prompts through the template (media makes the ids inexact: vLLM adds placeholder
/// tokens we do not reproduce); text prompts encoded as `/v1/completions` does.
fn encode(tokenizer: &ModelTokenizer, endpoint: i32, chat: &str, text: &str) -> Result<Vec<u32>, TokenizeFailure> {
    if chat.is_empty() {
        return tokenizer.encode_text(text).map_err(|e| failure(&e));
    }
    let api = if endpoint == Endpoint::Messages as i32 { Api::Messages } else { Api::ChatCompletions };
    let rendered = tokenizer.render_chat(chat, api).map_err(|e| failure(&e))?;
    if rendered.media_items > 0 {
        return Err(TokenizeFailure::Media);
    }
    tokenizer.encoder().encode(&rendered.text).map_err(|e| failure(&e))
}

fn failure(e: &TokenizeError) -> TokenizeFailure {
    match e {
        TokenizeError::Json(_) | TokenizeError::Input(_) => TokenizeFailure::Input,
        TokenizeError::Unsupported(_) | TokenizeError::Template(_) | TokenizeError::NoTemplate => TokenizeFailure::Template,
        TokenizeError::Encode(_) => TokenizeFailure::Encode,
        TokenizeError::Io { .. } | TokenizeError::Tokenizer { .. } => TokenizeFailure::Unavailable,
    }
}
