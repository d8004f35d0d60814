//! `/v1/completions` and `/v1/chat/completions`: parse, tokenize, check the output limit and
//! `n` as vLLM does (`limits.rs`), plan each choice's ids and text (`answer.rs`), submit one
//! engine request per choice, each to the rank vLLM's DP load balancer picks (or the one
//! `X-data-parallel-rank` names), then answer in one piece or as a stream (`stream.rs`).
//!
//! As in vLLM (`v1/engine/async_llm.py`, `completion/serving.py`): a request with `n` > 1
//! fans out into `n` engine requests sharing the prompt (the first prefills it, the others
//! find its blocks cached) that each generate their own answer; a completions request with a
//! list of prompts runs each prompt as its own request, times `n`. Choice `i` is prompt
//! `i / n`'s sample `i % n`. Every engine request counts in the worker's metrics as vLLM's
//! do: `vllm:prompt_tokens` once per engine request, `vllm:generation_tokens` per token.
//!
//! A missing, null or empty `model` is served by the served model (vLLM's `_is_model_supported`
//! answers true for it); replies name the served model. Another name is a 404.

use super::body::{parse_json, template_input};
use super::error::{request_validation, ApiError, FieldError};
use super::limits::{self, PromptForm, Requested};
use super::stream::{collect, sse_response, Kind, Params};
use super::AppState;
use crate::answer::{sample_seed, Answer};
use crate::engine::{EngineConfig, NewRequest};
use crate::ids::RequestId;
use crate::worker::{Group, TokenRx, Worker};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use kvroute_tokenize::Api;
use serde::de::IgnoredAny;
use serde::Deserialize;

#[derive(Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Tokens(Vec<u32>),
    Text(String),
    TokenBatch(Vec<Vec<u32>>),
    TextBatch(Vec<String>),
}

fn one() -> Option<i64> {
    Some(1)
}

#[derive(Deserialize)]
struct CompletionBody {
    model: Option<String>,
    prompt: Prompt,
    /// `int | None = 16`, and an explicit null is reset to 16 (`normalize_null_max_tokens`):
    /// absent or null, 16.
    max_tokens: Option<i64>,
    /// `n: int = 1`: absent is 1, null is a validation error.
    #[serde(default = "one")]
    n: Option<i64>,
    temperature: Option<f64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    ignore_eos: bool,
    cache_salt: Option<String>,
}

/// The fields the simulator reads itself; the tokenizer reads the chat fields (`messages`,
/// `tools`, `add_generation_prompt`, `chat_template_kwargs`, ...) from the raw body.
#[derive(Deserialize)]
struct ChatBody {
    model: Option<String>,
    #[allow(dead_code)]
    messages: IgnoredAny,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    /// `int | None = 1`: null is 1.
    n: Option<i64>,
    temperature: Option<f64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    ignore_eos: bool,
    cache_salt: Option<String>,
}

/// vLLM's `_check_model`: no model (absent, null, empty) is the served one; another is a 404.
pub(super) fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if !m.is_empty() && m != state.worker.model() => Err(ApiError::model_not_found(m, state.worker.model())),
        _ => Ok(()),
    }
}

/// The prompts of a completions request, tokenized, with how each reached the tokenizer.
fn completion_prompts(state: &AppState, prompt: Prompt) -> Result<Vec<(Vec<u32>, PromptForm)>, ApiError> {
    let batch = match &prompt {
        Prompt::TokenBatch(b) => b.len(),
        Prompt::TextBatch(b) => b.len(),
        _ => 0,
    };
    if batch > limits::MAX_COMPLETION_PROMPTS {
        let max = limits::MAX_COMPLETION_PROMPTS;
        return Err(ApiError::validation(
            &format!(
                "prompt list length {batch} exceeds the maximum allowed count of {max}. To increase this limit, set the \
                 VLLM_MAX_COMPLETION_PROMPTS environment variable."
            ),
            "prompt",
        ));
    }
    Ok(match prompt {
        Prompt::Tokens(t) => vec![(t, PromptForm::TokenIds)],
        Prompt::Text(s) => vec![(state.tokenizer.encode_text(&s)?, PromptForm::Text)],
        Prompt::TokenBatch(b) => b.into_iter().map(|t| (t, PromptForm::TokenIds)).collect(),
        Prompt::TextBatch(b) => b.iter().map(|s| Ok((state.tokenizer.encode_text(s)?, PromptForm::Text))).collect::<Result<_, ApiError>>()?,
    })
}

pub async fn completions(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req: CompletionBody = parse_json(&body)?;
    let Some(n) = req.n else { return Err(request_validation(&[FieldError::wrong_type("body.n", "integer", "None".into())])) };
    check_model(&state, req.model.as_deref())?;
    let max_model_len = state.worker.config().max_model_len;
    let requested = Requested { value: Some(req.max_tokens.unwrap_or(16)), param: "max_tokens" };
    limits::check_requested(requested, max_model_len)?;
    // Every prompt is rendered (and length-checked) before any gets its sampling parameters.
    let prompts = completion_prompts(&state, req.prompt)?;
    for (prompt, form) in &prompts {
        limits::check_prompt(prompt.len(), max_model_len, *form)?;
    }
    let mut plan = Generate { n: 1, ignore_eos: req.ignore_eos, cache_salt: req.cache_salt, prompts: Vec::new() };
    for (prompt, _) in prompts {
        let max = limits::max_tokens(requested.value, prompt.len(), max_model_len);
        let (n, max) = limits::sampling(n, max, req.temperature)?;
        plan.n = n;
        plan.prompts.push((prompt, max));
    }
    let include_usage = req.stream_options.unwrap_or_default().include_usage;
    run(&state, &headers, plan, Reply { kind: Kind::Completion, stream: req.stream, include_usage }).await
}

pub async fn chat_completions(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req: ChatBody = parse_json(&body)?;
    check_model(&state, req.model.as_deref())?;
    let max_model_len = state.worker.config().max_model_len;
    // `max_completion_tokens` when not null, else `max_tokens`; never combined.
    let requested = match req.max_completion_tokens {
        Some(v) => Requested { value: Some(v), param: "max_completion_tokens" },
        None => Requested { value: req.max_tokens, param: "max_tokens" },
    };
    limits::check_requested(requested, max_model_len)?;
    let prompt = state.tokenizer.encode_chat(&template_input(&body)?, Api::ChatCompletions)?;
    limits::check_prompt(prompt.len(), max_model_len, PromptForm::Text)?;
    let max = limits::max_tokens(requested.value, prompt.len(), max_model_len);
    let (n, max) = limits::sampling(req.n.unwrap_or(1), max, req.temperature)?;
    let plan = Generate { prompts: vec![(prompt, max)], n, ignore_eos: req.ignore_eos, cache_salt: req.cache_salt };
    let include_usage = req.stream_options.unwrap_or_default().include_usage;
    run(&state, &headers, plan, Reply { kind: Kind::Chat, stream: req.stream, include_usage }).await
}

/// The ids the engine will generate for one choice and their text, as long as the engine can
/// run: to `max_tokens`, or to the simulated EOS without `ignore_eos` (the answer's natural
/// length, never past the limit). Sample 0 of a prompt is the answer an `n` = 1 request gets.
fn plan_answer(state: &AppState, cfg: &EngineConfig, prompt: &[u32], max_tokens: usize, ignore_eos: bool, sample: usize) -> Result<Answer, ApiError> {
    let mut len = max_tokens.min(cfg.max_model_len.saturating_sub(prompt.len()));
    if !ignore_eos {
        len = len.min(cfg.eos_after.max(1));
    }
    Ok(state.answers.answer(sample_seed(prompt, sample), len)?)
}

/// One generation, checked: each prompt with its effective limit, sampled `n` times.
pub(super) struct Generate {
    pub prompts: Vec<(Vec<u32>, usize)>,
    pub n: usize,
    pub ignore_eos: bool,
    pub cache_salt: Option<String>,
}

/// vLLM's header for pinning a request to a data-parallel rank (external DP balancing).
const RANK_HEADER: &str = "x-data-parallel-rank";

/// The rank the header pins, if any.
fn pinned_rank<'a>(state: &'a AppState, headers: &HeaderMap) -> Result<Option<&'a Worker>, ApiError> {
    let Some(v) = headers.get(RANK_HEADER) else { return Ok(None) };
    let rank = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .ok_or_else(|| ApiError::BadRequest(format!("{RANK_HEADER} must be a non-negative integer, got {v:?}")))?;
    state.worker.rank(rank).map(Some).map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// A generation submitted: its tokens and each choice's planned answer.
pub(super) struct Started {
    /// The first engine request's rank and id (the response's `x-sim-dp-rank` and id).
    pub dp_rank: u32,
    pub request: RequestId,
    pub rx: TokenRx,
    /// Per prompt.
    pub prompt_tokens: Vec<usize>,
    /// Per choice.
    pub answers: Vec<Answer>,
}

/// Plans every choice's answer and submits one engine request per choice, each to the rank
/// the header pins or, as vLLM balances every child request, the balancer's pick at that
/// moment. If one is refused, those already queued are aborted.
pub(super) fn start(state: &AppState, headers: &HeaderMap, g: Generate) -> Result<Started, ApiError> {
    let pinned = pinned_rank(state, headers)?;
    let cfg = state.worker.config();
    let mut group = Group::new();
    let mut answers = Vec::with_capacity(g.prompts.len() * g.n);
    let mut first = None;
    for (p, (prompt, max_tokens)) in g.prompts.iter().enumerate() {
        for sample in 0..g.n {
            let answer = plan_answer(state, &cfg, prompt, *max_tokens, g.ignore_eos, sample)?;
            let rank = pinned.unwrap_or_else(|| state.worker.pick());
            let new = NewRequest {
                id: RequestId(0),
                prompt: prompt.clone(),
                max_tokens: *max_tokens,
                ignore_eos: g.ignore_eos,
                cache_salt: g.cache_salt.clone(),
                output: answer.ids.clone(),
            };
            let id = group.submit(rank, p * g.n + sample, new)?;
            first.get_or_insert((rank.dp_rank, id));
            answers.push(answer);
        }
    }
    let (dp_rank, request) = first.ok_or_else(|| ApiError::BadRequest("no prompt to generate from".into()))?;
    let prompt_tokens = g.prompts.iter().map(|(p, _)| p.len()).collect();
    Ok(Started { dp_rank, request, rx: group.listen(), prompt_tokens, answers })
}

/// How a generation is answered.
#[derive(Clone, Copy)]
pub(super) struct Reply {
    pub kind: Kind,
    pub stream: bool,
    pub include_usage: bool,
}

pub(super) async fn run(state: &AppState, headers: &HeaderMap, g: Generate, reply: Reply) -> Result<Response, ApiError> {
    let n = g.n;
    let s = start(state, headers, g)?;
    let pieces = s.answers.into_iter().map(|a| a.pieces).collect();
    let (kind, include_usage) = (reply.kind, reply.include_usage);
    let params = Params { kind, model: state.worker.model().to_string(), request: s.request, include_usage, prompt_tokens: s.prompt_tokens, n, pieces };
    let mut response = if reply.stream { sse_response(params, s.rx) } else { collect(params, s.rx).await? };
    response.headers_mut().insert("x-sim-dp-rank", HeaderValue::from(s.dp_rank));
    Ok(response)
}
