//! `/v1/completions`, `/v1/chat/completions` and (Anthropic) `/v1/messages`: parse,
//! tokenize, plan the answer's ids and text (`answer.rs`), submit to a rank's engine (the one
//! vLLM's DP load balancer picks, or the one `X-data-parallel-rank` names), then answer in one
//! piece or as a stream (see `stream.rs`).

use super::error::{parse_json, ApiError};
use super::stream::{collect, sse_response, Kind, Params};
use super::AppState;
use crate::answer::{seed_for, Answer};
use crate::engine::NewRequest;
use crate::ids::RequestId;
use crate::worker::{TokenRx, Worker};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
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

#[derive(Deserialize)]
struct CompletionBody {
    model: Option<String>,
    prompt: Prompt,
    max_tokens: Option<i64>,
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
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    ignore_eos: bool,
    cache_salt: Option<String>,
}

pub(super) fn utf8(body: &[u8]) -> Result<&str, ApiError> {
    std::str::from_utf8(body).map_err(|e| ApiError::BadRequest(format!("invalid request body: {e}")))
}

pub(super) fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if !m.is_empty() && m != state.worker.model() => Err(ApiError::ModelNotFound(m.to_string())),
        _ => Ok(()),
    }
}

pub(super) fn max_tokens(v: Option<i64>, default: usize) -> Result<usize, ApiError> {
    match v {
        None => Ok(default),
        Some(n) if n >= 1 => Ok(n as usize),
        Some(n) => Err(ApiError::BadRequest(format!("max_tokens must be at least 1, got {n}"))),
    }
}

pub async fn completions(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req: CompletionBody = parse_json(&body)?;
    check_model(&state, req.model.as_deref())?;
    let prompt = match req.prompt {
        Prompt::Tokens(t) => t,
        Prompt::Text(s) => state.tokenizer.encode_text(&s)?,
        Prompt::TokenBatch(mut b) if b.len() == 1 => b.remove(0),
        Prompt::TextBatch(b) if b.len() == 1 => state.tokenizer.encode_text(&b[0])?,
        _ => return Err(ApiError::BadRequest("batched prompts are not supported by kvroute-sim".into())),
    };
    // vLLM's CompletionRequest defaults max_tokens to 16.
    let max = max_tokens(req.max_tokens, 16)?;
    let include_usage = req.stream_options.unwrap_or_default().include_usage;
    let gen = Generate { prompt, max_tokens: max, ignore_eos: req.ignore_eos, cache_salt: req.cache_salt, kind: Kind::Completion, stream: req.stream, include_usage };
    run(&state, &headers, gen).await
}

/// vLLM's Anthropic endpoint: the body is converted to chat messages (`system` first, content
/// blocks, tool use and results) and rendered with the model's chat template; `max_tokens` is
/// required. Streams always carry usage (vLLM forces `include_usage` for them).
#[derive(Deserialize)]
struct MessagesBody {
    model: Option<String>,
    #[allow(dead_code)]
    messages: IgnoredAny,
    max_tokens: Option<i64>,
    #[serde(default)]
    stream: bool,
    /// Not in Anthropic's API: the simulator's way to get exactly `max_tokens`, as for the
    /// OpenAI endpoints.
    #[serde(default)]
    ignore_eos: bool,
    cache_salt: Option<String>,
}

pub async fn messages(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    messages_or_error(state, headers, body).await.unwrap_or_else(ApiError::anthropic)
}

async fn messages_or_error(state: AppState, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req: MessagesBody = parse_json(&body)?;
    check_model(&state, req.model.as_deref())?;
    let Some(max) = req.max_tokens else { return Err(ApiError::BadRequest("max_tokens: field required".into())) };
    let prompt = state.tokenizer.encode_chat(utf8(&body)?, Api::Messages)?;
    let max = max_tokens(Some(max), 1)?;
    let gen = Generate { prompt, max_tokens: max, ignore_eos: req.ignore_eos, cache_salt: req.cache_salt, kind: Kind::Messages, stream: req.stream, include_usage: true };
    run(&state, &headers, gen).await
}

/// `POST /v1/messages/count_tokens` (the Anthropic SDK's `messages.count_tokens`), as vLLM
/// 0.33 answers it: the prompt `/v1/messages` would prefill for the same body, counted
/// (`anthropic/serving.py` `count_tokens`: `input_tokens` and
/// `context_management.original_input_tokens`); errors in Anthropic's shape.
pub async fn count_tokens(State(state): State<AppState>, body: Bytes) -> Response {
    count_tokens_or_error(state, body).await.unwrap_or_else(ApiError::anthropic)
}

async fn count_tokens_or_error(state: AppState, body: Bytes) -> Result<Response, ApiError> {
    let req: MessagesBody = parse_json(&body)?;
    check_model(&state, req.model.as_deref())?;
    let n = state.tokenizer.encode_chat(utf8(&body)?, Api::Messages)?.len();
    Ok(axum::Json(serde_json::json!({"input_tokens": n, "context_management": {"original_input_tokens": n}})).into_response())
}

pub async fn chat_completions(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req: ChatBody = parse_json(&body)?;
    check_model(&state, req.model.as_deref())?;
    let prompt = state.tokenizer.encode_chat(utf8(&body)?, Api::ChatCompletions)?;
    // vLLM's chat default: whatever context is left after the prompt.
    let room = state.worker.config().max_model_len.saturating_sub(prompt.len()).max(1);
    let max = max_tokens(req.max_completion_tokens.or(req.max_tokens), room)?;
    let include_usage = req.stream_options.unwrap_or_default().include_usage;
    let gen = Generate { prompt, max_tokens: max, ignore_eos: req.ignore_eos, cache_salt: req.cache_salt, kind: Kind::Chat, stream: req.stream, include_usage };
    run(&state, &headers, gen).await
}

/// The ids the engine will generate and their text, as long as the engine can run: to
/// `max_tokens`, or to the simulated EOS without `ignore_eos`, never past the context (a
/// request that long is rejected by the engine anyway).
fn plan_answer(state: &AppState, prompt: &[u32], max_tokens: usize, ignore_eos: bool) -> Result<Answer, ApiError> {
    let cfg = state.worker.config();
    let (eos_after, max_model_len) = (cfg.eos_after, cfg.max_model_len);
    let mut len = max_tokens.min(max_model_len.saturating_sub(prompt.len()));
    if !ignore_eos {
        len = len.min(eos_after.max(1));
    }
    Ok(state.answers.answer(seed_for(prompt), len)?)
}

/// One generation request, parsed.
struct Generate {
    prompt: Vec<u32>,
    max_tokens: usize,
    ignore_eos: bool,
    cache_salt: Option<String>,
    kind: Kind,
    stream: bool,
    include_usage: bool,
}

/// vLLM's header for pinning a request to a data-parallel rank (external DP balancing).
const RANK_HEADER: &str = "x-data-parallel-rank";

/// The rank to run on: the one the header names, else the load balancer's pick.
fn choose_rank<'a>(state: &'a AppState, headers: &HeaderMap) -> Result<&'a Worker, ApiError> {
    let Some(v) = headers.get(RANK_HEADER) else { return Ok(state.worker.pick()) };
    let rank = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .ok_or_else(|| ApiError::BadRequest(format!("{RANK_HEADER} must be a non-negative integer, got {v:?}")))?;
    state.worker.rank(rank).map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// A generation submitted to a rank's engine: its token channel and the planned answer.
pub(super) struct Started {
    pub dp_rank: u32,
    pub request: RequestId,
    pub rx: TokenRx,
    pub prompt_tokens: usize,
    pub answer: Answer,
}

/// Plans the answer for `prompt` and submits it to the rank the headers (or the load
/// balancer) choose.
pub(super) fn start(state: &AppState, headers: &HeaderMap, prompt: Vec<u32>, max_tokens: usize, ignore_eos: bool, cache_salt: Option<String>) -> Result<Started, ApiError> {
    let rank = choose_rank(state, headers)?;
    let answer = plan_answer(state, &prompt, max_tokens, ignore_eos)?;
    let prompt_tokens = prompt.len();
    let new = NewRequest { id: RequestId(0), prompt, max_tokens, ignore_eos, cache_salt, output: answer.ids.clone() };
    let (request, rx) = rank.submit(new)?;
    Ok(Started { dp_rank: rank.dp_rank, request, rx, prompt_tokens, answer })
}

async fn run(state: &AppState, headers: &HeaderMap, g: Generate) -> Result<Response, ApiError> {
    let s = start(state, headers, g.prompt, g.max_tokens, g.ignore_eos, g.cache_salt)?;
    let params = Params { kind: g.kind, model: state.worker.model().to_string(), request: s.request, include_usage: g.include_usage, prompt_tokens: s.prompt_tokens, pieces: s.answer.pieces };
    let mut response = if g.stream { sse_response(params, s.rx) } else { collect(params, s.rx).await? };
    response.headers_mut().insert("x-sim-dp-rank", HeaderValue::from(s.dp_rank));
    Ok(response)
}
