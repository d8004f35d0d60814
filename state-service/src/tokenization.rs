//! Text and chat prompts -> the token ids vLLM will cache, so their blocks are keyed exactly.
//!
//! vLLM caches blocks of the chat-template-rendered prompt's token ids; a chat request matches
//! a worker's cache exactly only if kvroute computes the same ids. Paths, tried in order (each
//! counted in `kvroute_tokenization_total{path}` and named in the pick response):
//! 1. `local`: this service's tokenizer and chat template ([`local`], `kvroute-tokenize`);
//! 2. `worker`: a worker's vLLM `/tokenize` ([`worker`]), short timeout, paused after failures;
//! 3. `text_chunks`: the filter's approximate text-chunk keys (the pick path's default);
//! 4. `none`: load only.
//!
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
use crate::metrics::{Path, Registry, TokenizationLabels, TokenizeFailure, TokenizeFailureLabels};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use kvroute_core::wire::{Endpoint, PickRequest, TokenizationPath};
use kvroute_tokenize::{Api, ModelTokenizer, TokenizeError};
use local::{LocalTokenizers, Lookup};
use std::sync::Arc;
use std::time::Duration;
use worker::WorkerTokenizer;

/// Exact token ids of a prompt (or of its leading part) and where they came from.
#[derive(Clone, Debug, PartialEq)]
pub struct ExactIds {
    /// The prompt's first ids, exactly: all of them, or those of the leading messages that
    /// fit the encoding budget.
    pub ids: Vec<u32>,
    /// The whole prompt's tokens: `ids.len()`, plus an estimate for the unencoded rest.
    pub prompt_tokens: u32,
    /// `TokenizationLocal` or `TokenizationWorker`.
    pub path: TokenizationPath,
    /// The whole prompt was encoded (else its leading part, `prompt_tokens` estimating the rest).
    pub complete: bool,
}

/// How far a pick's encoding goes (see `config::Tokenization::probe_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// `probe_bytes` of text no cache holds: enough to key a prompt until it leaves every
    /// worker's cache, for most prompts.
    Probe,
    /// The rest of `max_encode_bytes`.
    Full,
}

/// What the local encoder produced.
struct Encoded {
    ids: Vec<u32>,
    rest_bytes: usize,
}

impl Encoded {
    fn whole(ids: Vec<u32>) -> Encoded {
        Encoded { ids, rest_bytes: 0 }
    }

    /// The whole prompt's tokens, the rest estimated at the encoded part's bytes per token.
    fn prompt_tokens(&self, encoded_bytes: usize) -> u32 {
        let n = self.ids.len();
        let rest = if self.rest_bytes == 0 || n == 0 { self.rest_bytes / 4 } else { self.rest_bytes * n / encoded_bytes.max(1) };
        u32::try_from(n + rest).unwrap_or(u32::MAX)
    }
}

pub struct Tokenization {
    pub local: Arc<LocalTokenizers>,
    worker: WorkerTokenizer,
    inline_max_bytes: usize,
    worker_fallback: bool,
    /// Cache-missing bytes a pick encodes first, and at most (see
    /// `config::Tokenization::probe_bytes` and `max_encode_bytes`).
    probe_bytes: usize,
    max_encode_bytes: usize,
    /// A pick stops waiting for its local tokenization after this (the filter gave up soon
    /// after); the encoding finishes in the background and warms the piece cache.
    deadline: Duration,
    /// Blocking-pool tokenizations at once; a pick that finds none free does not queue.
    permits: Arc<tokio::sync::Semaphore>,
    metrics: TokenizeMetrics,
}

/// Tokenization's metric families (the tokenizers' own state is read at scrape time by
/// [`collector::TokenizerCollector`]).
struct TokenizeMetrics {
    /// Tokenization attempts that gave no ids, by path and reason.
    failures: Family<TokenizeFailureLabels, Counter>,
    /// Time to tokenize a prompt and cut its keys (local and worker paths), seconds.
    latency: Family<TokenizationLabels, Histogram>,
}

impl TokenizeMetrics {
    fn register(registry: &mut Registry) -> TokenizeMetrics {
        let m = TokenizeMetrics {
            failures: Family::default(),
            latency: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.000_05, 2.0, 16))),
        };
        registry.register("tokenization_failures", "Tokenization attempts without ids, by path and reason", m.failures.clone());
        registry.register("tokenize_seconds", "Time to tokenize a prompt, by path", m.latency.clone());
        m
    }

    fn failure(&self, path: TokenizationPath, reason: TokenizeFailure) {
        self.failures.get_or_create(&TokenizeFailureLabels { path: Path(path), reason }).inc();
    }

    fn observe(&self, path: TokenizationPath, seconds: f64) {
        self.latency.get_or_create(&TokenizationLabels { path: Path(path) }).observe(seconds);
    }
}

/// Whether a pick's prompt needs tokenizing (text or chat, no exact keys from the filter).
pub fn wants_tokens(req: &PickRequest) -> bool {
    req.token_keys.is_empty() && (!req.prompt_text.is_empty() || !req.chat_json.is_empty())
}

impl Tokenization {
    /// Registers its metrics and the tokenizers' scrape-time collector in `registry`.
    pub fn new(config: &Config, registry: &mut Registry) -> Tokenization {
        let t = &config.tokenization;
        let local = Arc::new(LocalTokenizers::new(config));
        registry.register_collector(Box::new(collector::TokenizerCollector { local: local.clone() }));
        Tokenization {
            metrics: TokenizeMetrics::register(registry),
            local,
            worker: WorkerTokenizer::new(Duration::from_millis(t.worker_timeout_ms), Duration::from_millis(t.worker_retry_ms)),
            inline_max_bytes: t.inline_max_bytes,
            worker_fallback: t.worker_fallback,
            probe_bytes: t.probe_bytes.min(t.max_encode_bytes),
            max_encode_bytes: t.max_encode_bytes,
            deadline: Duration::from_millis(t.deadline_ms),
            permits: Arc::new(tokio::sync::Semaphore::new(t.max_concurrent.max(1))),
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

    /// Counts a tokenization that gave no ids for a reason found outside it (the pick's
    /// deadline).
    pub fn count_failure(&self, path: TokenizationPath, reason: TokenizeFailure) {
        self.metrics.failure(path, reason);
    }

    /// Whether a tokenizer load is under way.
    pub fn loading(&self) -> bool {
        self.local.loading()
    }

    /// Whether `model`'s worker path is paused after a failed call.
    pub fn worker_paused(&self, model: &str) -> bool {
        self.worker.is_paused(model)
    }

    /// How many cache-missing bytes an encoding may cover: the probe, then what is left of
    /// `max_encode_bytes` (what the probe encoded is cached by then and costs nothing again).
    pub fn budget(&self, reach: Reach) -> usize {
        match reach {
            Reach::Probe => self.probe_bytes,
            Reach::Full => self.max_encode_bytes - self.probe_bytes,
        }
    }

    /// The prompt's exact ids via the local tokenizer of `target`'s base model, as far as
    /// `reach` allows, else a worker of `target` (healthy workers of the request's model); why
    /// neither path gave them otherwise.
    pub async fn exact_ids(&self, req: &PickRequest, target: &TokenizeTarget, reach: Reach) -> Result<ExactIds, TokenizeFailure> {
        let metrics = &self.metrics;
        if req.endpoint == Endpoint::Responses as i32 && !req.previous_response_id.is_empty() {
            // vLLM prepends the stored conversation, which only its owner has: the prompt
            // without it is not the one vLLM computes.
            metrics.failure(TokenizationPath::TokenizationLocal, TokenizeFailure::Template);
            return Err(TokenizeFailure::Template);
        }
        let started = std::time::Instant::now();
        match self.local_ids(req, &target.base_model, self.budget(reach)).await {
            Ok((encoded, bytes)) => {
                metrics.observe(TokenizationPath::TokenizationLocal, started.elapsed().as_secs_f64());
                let prompt_tokens = encoded.prompt_tokens(bytes.saturating_sub(encoded.rest_bytes));
                let complete = encoded.rest_bytes == 0;
                return Ok(ExactIds { ids: encoded.ids, prompt_tokens, path: TokenizationPath::TokenizationLocal, complete });
            }
            Err(reason) => {
                metrics.failure(TokenizationPath::TokenizationLocal, reason);
                tracing::debug!(request_id = %req.request_id, model = %req.model, reason = reason.as_str(), "no local tokenization");
                // Out of time or capacity, or too long for the budget: a worker call would
                // cost more of the same and push the overload onto the workers.
                if matches!(reason, TokenizeFailure::Deadline | TokenizeFailure::Busy | TokenizeFailure::Truncated | TokenizeFailure::TooLong) {
                    return Err(reason);
                }
                if !self.worker_fallback {
                    return Err(reason);
                }
            }
        }
        let started = std::time::Instant::now();
        match self.worker_ids(req, &target.workers).await {
            Ok(ids) => {
                metrics.observe(TokenizationPath::TokenizationWorker, started.elapsed().as_secs_f64());
                let prompt_tokens = u32::try_from(ids.len()).unwrap_or(u32::MAX);
                Ok(ExactIds { ids, prompt_tokens, path: TokenizationPath::TokenizationWorker, complete: true })
            }
            Err(reason) => {
                metrics.failure(TokenizationPath::TokenizationWorker, reason);
                tracing::debug!(request_id = %req.request_id, model = %req.model, reason = reason.as_str(), "no worker tokenization");
                Err(reason)
            }
        }
    }

    /// The local encoding within `budget` cache-missing bytes, and the prompt's size in bytes
    /// (rendered chat, or text).
    async fn local_ids(&self, req: &PickRequest, model: &str, budget: usize) -> Result<(Encoded, usize), TokenizeFailure> {
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
            return encode(&tokenizer, req.endpoint, &req.chat_json, &req.prompt_text, budget);
        }
        // Bounded work: a few encodings at once, each waited for until the deadline.
        let Ok(permit) = self.permits.clone().try_acquire_owned() else { return Err(TokenizeFailure::Busy) };
        let (endpoint, chat, text) = (req.endpoint, req.chat_json.clone(), req.prompt_text.clone());
        let work = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            encode(&tokenizer, endpoint, &chat, &text, budget)
        });
        match tokio::time::timeout(self.deadline, work).await {
            Ok(done) => done.unwrap_or(Err(TokenizeFailure::Encode)),
            Err(_) => Err(TokenizeFailure::Deadline),
        }
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
/// tokens we do not reproduce) and text prompts as `/v1/completions` encodes them, each as far
/// as `budget` cache-missing bytes reach at a point the whole encoding also breaks at (a
/// message boundary, or a space inside a long message or text: see
/// `CachedEncoder::encode_prefix`). Returns the encoding and the prompt's bytes.
fn encode(tokenizer: &ModelTokenizer, endpoint: i32, chat: &str, text: &str, budget: usize) -> Result<(Encoded, usize), TokenizeFailure> {
    if chat.is_empty() {
        if text.len() <= budget {
            return tokenizer.encode_text(text).map(|ids| (Encoded::whole(ids), text.len())).map_err(|e| failure(&e));
        }
        // An encoding cannot be stopped once started, so a longer text is encoded only up to
        // the budget (a few whole ones would otherwise keep every core busy long after their
        // picks gave up, starving the small ones), and not at all where no cut is exact.
        return match tokenizer.encode_text_prefix(text, budget).map_err(|e| failure(&e))? {
            Some(prefix) if !prefix.ids.is_empty() => Ok((Encoded { ids: prefix.ids, rest_bytes: prefix.rest_bytes }, text.len())),
            _ => Err(TokenizeFailure::TooLong),
        };
    }
    let api = match Endpoint::try_from(endpoint) {
        Ok(Endpoint::Messages) => Api::Messages,
        Ok(Endpoint::Responses) => Api::Responses,
        _ => Api::ChatCompletions,
    };
    let rendered = tokenizer.render_chat(chat, api).map_err(|e| failure(&e))?;
    if rendered.media_items > 0 {
        return Err(TokenizeFailure::Media);
    }
    let prefix = tokenizer.encoder().encode_prefix(&rendered.text, budget).map_err(|e| failure(&e))?;
    if prefix.ids.is_empty() {
        return Err(TokenizeFailure::Truncated);
    }
    Ok((Encoded { ids: prefix.ids, rest_bytes: prefix.rest_bytes }, rendered.text.len()))
}

fn failure(e: &TokenizeError) -> TokenizeFailure {
    match e {
        TokenizeError::Json(_) | TokenizeError::Input(_) => TokenizeFailure::Input,
        TokenizeError::Unsupported(_) | TokenizeError::Template(_) | TokenizeError::NoTemplate => TokenizeFailure::Template,
        TokenizeError::Encode(_) => TokenizeFailure::Encode,
        TokenizeError::Io { .. } | TokenizeError::Tokenizer { .. } => TokenizeFailure::Unavailable,
    }
}
