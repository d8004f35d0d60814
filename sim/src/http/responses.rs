//! The OpenAI Responses API as vLLM 0.33 serves it for a non-Harmony model
//! (`entrypoints/openai/responses/{api_router,serving,protocol,streaming_events}.py`, no
//! reasoning or tool parser, `SimpleContext`):
//!
//! - `POST /v1/responses`: the request's chat messages are built as vLLM's
//!   `construct_input_messages` builds them (`instructions` as a system message, then with
//!   `previous_response_id` the stored conversation minus its system messages and the stored
//!   response's output text as assistant messages, then the new `input`), by
//!   `kvroute_tokenize::responses`, and rendered like a chat completion. So a follow-up turn's
//!   prompt starts with the previous turn's prompt and answer, and hits their cached blocks.
//!   The answer is `ResponsesResponse` (fields in pydantic's order, `id` first) or, with
//!   `stream`, vLLM's simple event sequence (see [`generate`]). `background` runs it detached.
//! - `GET /v1/responses/{id}` (`?stream=true&starting_after=N` replays a background stream)
//!   and `POST /v1/responses/{id}/cancel`. vLLM has no DELETE route: FastAPI answers 405.
//!
//! What is stored and when is vLLM's (see `store.rs`): the final response of a `store: true`
//! request (vLLM only with `VLLM_ENABLE_RESPONSES_API_STORE=1`, the simulator unless started
//! with `--responses-store false`), in this worker's memory only.

mod store;

pub use store::{ResponseStore, DEFAULT_CAPACITY};

use super::body::{fields_of, parse_object};
use super::error::{request_validation, ApiError, FieldError};
use super::limits::{self, PromptForm, Requested};
use super::openai::{check_model, start, Generate};
use super::stream::guarded_body;
use super::AppState;
use crate::engine::{FinishReason, Finished};
use crate::worker::TokenRx;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvroute_tokenize::Api;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};
use store::{CancelError, CloseOnDrop, Entry, EventLog};
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tokio_stream::StreamExt;

fn stored_default() -> Option<bool> {
    Some(true)
}

/// The request fields the simulator reads; `input`, `instructions`, `tools`,
/// `chat_template_kwargs` and `reasoning` also go to the renderer from the raw body.
#[derive(Deserialize)]
struct ResponsesBody {
    model: Option<String>,
    input: Option<Value>,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    max_tool_calls: Option<i64>,
    metadata: Option<Value>,
    parallel_tool_calls: Option<bool>,
    previous_response_id: Option<String>,
    prompt: Option<Value>,
    reasoning: Option<Value>,
    service_tier: Option<String>,
    /// `bool | None = True`: absent is true, `null` is false.
    #[serde(default = "stored_default")]
    store: Option<bool>,
    stream: Option<bool>,
    background: Option<bool>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    text: Option<Value>,
    tool_choice: Option<Value>,
    tools: Option<Vec<Value>>,
    truncation: Option<String>,
    user: Option<String>,
    prompt_cache_key: Option<String>,
    prompt_cache_options: Option<Map<String, Value>>,
    prompt_cache_retention: Option<String>,
    safety_identifier: Option<String>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    /// vLLM's extra field: the response id (default `resp_<uuid>`).
    request_id: Option<String>,
    previous_input_messages: Option<Value>,
    #[serde(default)]
    ignore_eos: bool,
    cache_salt: Option<String>,
    #[serde(default)]
    enable_response_messages: bool,
}

/// `uuid.uuid4().hex`, vLLM's `random_uuid()`.
fn random_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn not_found(id: &str) -> ApiError {
    ApiError::invalid(StatusCode::NOT_FOUND, format!("Response with id '{id}' not found."), "response_id")
}

/// A request without `input`: pydantic's missing-field error through vLLM's validation
/// handler (type `Bad Request`, `param` the cleaned location).
fn missing_input(body: &Map<String, Value>) -> ApiError {
    request_validation(&[FieldError::missing("body.input", body.len())])
}

/// Request fields (or their sampling parameters) the response echoes, in pydantic's order,
/// split where the response's own fields go between them.
struct Echo {
    /// `instructions`, `metadata` (then `model`, `object`, `output`).
    before_model: Map<String, Value>,
    /// `parallel_tool_calls` ... `service_tier` (then `status`).
    before_status: Map<String, Value>,
    /// `text`, `top_logprobs`, `truncation` (then `usage`).
    before_usage: Map<String, Value>,
    /// `user` ... `ec_transfer_params` (then `input_messages`, `output_messages`).
    after_usage: Map<String, Value>,
}

/// Everything the response object is built from (`ResponsesResponse.from_request`).
struct Turn {
    id: String,
    created_at: u64,
    model: String,
    echo: Echo,
    block_size: usize,
    /// With `enable_response_messages`: the rendered prompt and its ids.
    raw_prompt: Option<(String, Vec<u32>)>,
    pieces: Vec<String>,
}

impl Turn {
    /// The `ResponsesResponse` object, fields in pydantic's dump order (`metrics` omitted, as
    /// vLLM excludes it when unset).
    fn object(&self, status: &str, output: Vec<Value>, usage: Value, raw: Option<(Value, Value)>) -> Value {
        let e = &self.echo;
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("created_at".into(), json!(self.created_at));
        let incomplete = if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null };
        m.insert("incomplete_details".into(), incomplete);
        m.extend(e.before_model.clone());
        m.insert("model".into(), json!(self.model));
        m.insert("object".into(), json!("response"));
        m.insert("output".into(), Value::Array(output));
        m.extend(e.before_status.clone());
        m.insert("status".into(), json!(status));
        m.extend(e.before_usage.clone());
        m.insert("usage".into(), usage);
        m.extend(e.after_usage.clone());
        let (input_messages, output_messages) = raw.unwrap_or((Value::Null, Value::Null));
        m.insert("input_messages".into(), input_messages);
        m.insert("output_messages".into(), output_messages);
        Value::Object(m)
    }

    fn piece(&self, i: usize) -> &str {
        self.pieces.get(i).map(String::as_str).unwrap_or("")
    }

    /// `usage` as vLLM's `ResponseUsage`: cached tokens always (no `--enable-prompt-tokens-
    /// details` needed here), `cache_write_tokens` = the prompt's full blocks the request
    /// computed rather than found (`PrefillStats.finalize`), per-turn lists empty
    /// (`SimpleContext` does not track turns).
    fn usage(&self, f: &Finished) -> Value {
        let bs = self.block_size.max(1);
        let written = (f.prompt_tokens / bs * bs).saturating_sub(f.cached_tokens);
        json!({
            "input_tokens": f.prompt_tokens,
            "input_tokens_details": {"cached_tokens": f.cached_tokens, "cache_write_tokens": written,
                "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
            "output_tokens": f.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []},
            "total_tokens": f.prompt_tokens + f.completion_tokens,
        })
    }

    /// `input_messages` / `output_messages` (`enable_response_messages`): the raw prompt and
    /// output, each a `ResponseRawMessageAndToken`.
    fn raw_messages(&self, text: &str, ids: &[u32]) -> Option<(Value, Value)> {
        let (prompt, prompt_ids) = self.raw_prompt.as_ref()?;
        let input = json!([{"message": prompt, "tokens": prompt_ids, "type": "raw_message_tokens"}]);
        let output = if text.is_empty() && ids.is_empty() { json!([]) } else { json!([{"message": text, "tokens": ids, "type": "raw_message_tokens"}]) };
        Some((input, output))
    }
}

fn output_text(text: &str, logprobs: Value) -> Value {
    json!({"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs})
}

fn message_item(id: &str, content: Vec<Value>, status: &str) -> Value {
    json!({"id": id, "content": content, "role": "assistant", "status": status, "type": "message", "phase": null})
}

/// Where a generation's events go.
enum Sink {
    /// Not streamed.
    None,
    /// A client's SSE body.
    Client(tokio::sync::mpsc::UnboundedSender<Bytes>),
    /// A background stream's log.
    Log(EventLog),
}

/// Numbers events (`sequence_number` from 0) and writes them as vLLM's router does:
/// `event: <type>\ndata: <json>\n\n`.
struct Emitter {
    seq: u64,
    sink: Sink,
}

impl Emitter {
    fn streaming(&self) -> bool {
        !matches!(self.sink, Sink::None)
    }

    /// False when the client is gone.
    fn emit(&mut self, kind: &str, build: impl FnOnce(u64) -> Value) -> bool {
        let v = build(self.seq);
        self.seq += 1;
        let bytes = Bytes::from(format!("event: {kind}\ndata: {v}\n\n"));
        let terminal = matches!(kind, "response.completed" | "response.incomplete" | "error");
        match &self.sink {
            Sink::None => true,
            Sink::Client(tx) => tx.send(bytes).is_ok(),
            Sink::Log(log) => {
                log.push(bytes, terminal);
                true
            }
        }
    }
}

enum Outcome {
    /// The final response object.
    Done(Value),
    /// The streaming client went away (the engine request is aborted with the channel).
    Gone,
    /// The worker restarted mid-generation.
    Died,
}

/// Runs one generation to its end. Streamed, the events are exactly those of vLLM's
/// `responses_stream_generator` on the simple path: `response.created` and
/// `response.in_progress` (status `in_progress`, no output or usage), then at the first
/// non-empty text `response.output_item.added` (an `in_progress` message) and
/// `response.content_part.added`, one `response.output_text.delta` per token, then
/// `response.output_text.done`, `response.content_part.done`, `response.output_item.done`,
/// and ([`finish_stream`]) `response.completed` — or `response.incomplete` when
/// `max_output_tokens` cut it — with the final response. A restart ends the stream with an
/// `error` event.
async fn generate(turn: &Turn, mut rx: TokenRx, em: &mut Emitter) -> Outcome {
    if em.streaming() {
        let initial = turn.object("in_progress", vec![], Value::Null, None);
        for kind in ["response.created", "response.in_progress"] {
            if !em.emit(kind, |n| json!({"response": initial, "sequence_number": n, "type": kind})) {
                return Outcome::Gone;
            }
        }
    }
    let item_id = format!("msg_{}", random_uuid());
    let (mut text, mut ids, mut opened) = (String::new(), Vec::new(), false);
    while let Some(t) = rx.recv().await {
        let t = t.out;
        let piece = turn.piece(ids.len()).to_string();
        ids.push(t.token);
        if em.streaming() && !piece.is_empty() {
            if !opened {
                opened = true;
                let item = message_item(&item_id, vec![], "in_progress");
                let ok = em.emit("response.output_item.added", |n| json!({"item": item, "output_index": 0, "sequence_number": n, "type": "response.output_item.added"}))
                    && em.emit("response.content_part.added", |n| {
                        json!({"content_index": 0, "item_id": item_id, "output_index": 0, "part": output_text("", json!([])),
                            "sequence_number": n, "type": "response.content_part.added"})
                    });
                if !ok {
                    return Outcome::Gone;
                }
            }
            let sent = em.emit("response.output_text.delta", |n| {
                json!({"content_index": 0, "delta": piece, "item_id": item_id, "logprobs": [], "output_index": 0,
                    "sequence_number": n, "type": "response.output_text.delta"})
            });
            if !sent {
                return Outcome::Gone;
            }
        }
        text.push_str(&piece);
        let Some(f) = t.finished else { continue };
        let status = if f.reason == FinishReason::Length { "incomplete" } else { "completed" };
        let content = if text.is_empty() { vec![] } else { vec![output_text(&text, Value::Null)] };
        let item = message_item(&item_id, content, status);
        let output = if !em.streaming() {
            vec![item]
        } else if opened {
            let part = output_text(&text, Value::Null);
            let ok = em.emit("response.output_text.done", |n| {
                json!({"content_index": 0, "item_id": item_id, "logprobs": [], "output_index": 0, "sequence_number": n,
                    "text": text, "type": "response.output_text.done"})
            }) && em.emit("response.content_part.done", |n| {
                json!({"content_index": 0, "item_id": item_id, "output_index": 0, "part": part, "sequence_number": n,
                    "type": "response.content_part.done"})
            }) && em.emit("response.output_item.done", |n| json!({"item": item, "output_index": 0, "sequence_number": n, "type": "response.output_item.done"}));
            if !ok {
                return Outcome::Gone;
            }
            vec![item]
        } else {
            // Nothing was opened, so nothing was streamed: vLLM's final output is empty.
            vec![]
        };
        return Outcome::Done(turn.object(status, output, turn.usage(&f), turn.raw_messages(&text, &ids)));
    }
    if em.streaming() {
        em.emit("error", |n| {
            json!({"code": "server_error", "message": "the worker restarted while generating", "param": null, "sequence_number": n, "type": "error"})
        });
    }
    Outcome::Died
}

/// The stream's last event, sent once the response is stored (vLLM stores it before yielding
/// this event, so a client that has it can fetch or continue the response at once).
fn finish_stream(em: &mut Emitter, response: &Value) {
    let kind = if response["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
    em.emit(kind, |n| json!({"response": response, "sequence_number": n, "type": kind}));
}

fn sse<S>(stream: S) -> Response
where
    S: tokio_stream::Stream<Item = Bytes> + Send + 'static,
{
    let body = Body::from_stream(stream.map(Ok::<_, std::convert::Infallible>));
    ([(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")], body).into_response()
}

/// The checks vLLM's pydantic validators make (`ResponsesRequest.validate_background`,
/// `validate_prompt`, `check_tool_usage`); returns the `tool_choice` they leave.
fn validate(req: &ResponsesBody) -> Result<Value, ApiError> {
    if req.background == Some(true) && req.store != Some(true) {
        return Err(ApiError::validation("background can only be used when `store` is true", "background"));
    }
    if req.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(ApiError::validation("prompt template is not supported", "prompt"));
    }
    let choice = req.tool_choice.clone().unwrap_or(json!("auto"));
    let has_tools = req.tools.as_ref().is_some_and(|t| !t.is_empty());
    let named = choice.get("type").and_then(Value::as_str).is_some_and(|t| t == "function" || t == "custom");
    if has_tools {
        if named && choice.get("name").and_then(Value::as_str).is_none_or(str::is_empty) {
            return Err(ApiError::validation("Tool choice 'function' not found in 'tools' parameter.", "tool_choice"));
        }
        return Ok(choice);
    }
    match choice.as_str() {
        Some("auto" | "none") => Ok(json!("none")),
        Some("required") => Err(ApiError::validation("Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice")),
        _ if named => Err(ApiError::validation("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")),
        _ => Ok(choice),
    }
}

/// `prompt_cache_options.to_response()`: the request's options less `prewarm`.
fn cache_options(o: &Option<Map<String, Value>>) -> Value {
    match o {
        None => Value::Null,
        Some(o) => json!({
            "mode": o.get("mode").cloned().unwrap_or(json!("implicit")),
            "ttl": o.get("ttl").cloned().unwrap_or(json!("30m")),
            "comparison_response_id": o.get("comparison_response_id").cloned().unwrap_or(Value::Null),
        }),
    }
}

/// What `ResponsesResponse.from_request` copies from the request and its sampling parameters
/// (defaults: temperature and top_p 1.0, penalties 0.0, `max_output_tokens` the effective
/// limit).
fn echo(req: &ResponsesBody, tool_choice: Value, background: bool, max_tokens: usize) -> Echo {
    let mut before_model = Map::new();
    before_model.insert("instructions".into(), json!(req.instructions));
    before_model.insert("metadata".into(), json!(req.metadata));
    let mut s = Map::new();
    s.insert("parallel_tool_calls".into(), json!(req.parallel_tool_calls.unwrap_or(true)));
    s.insert("temperature".into(), json!(req.temperature.unwrap_or(1.0)));
    s.insert("tool_choice".into(), tool_choice);
    s.insert("tools".into(), json!(req.tools.clone().unwrap_or_default()));
    s.insert("top_p".into(), json!(req.top_p.unwrap_or(1.0)));
    s.insert("background".into(), json!(background));
    s.insert("max_output_tokens".into(), json!(max_tokens));
    s.insert("max_tool_calls".into(), json!(req.max_tool_calls));
    s.insert("previous_response_id".into(), json!(req.previous_response_id));
    s.insert("prompt".into(), Value::Null);
    s.insert("prompt_cache_options".into(), cache_options(&req.prompt_cache_options));
    s.insert("prompt_cache_key".into(), json!(req.prompt_cache_key));
    let retention = req.prompt_cache_retention.as_deref().map(|r| if r == "in-memory" { "in_memory" } else { r });
    s.insert("prompt_cache_retention".into(), json!(retention));
    s.insert("reasoning".into(), json!(req.reasoning));
    s.insert("safety_identifier".into(), json!(req.safety_identifier));
    s.insert("service_tier".into(), json!(req.service_tier.as_deref().unwrap_or("auto")));
    let mut u = Map::new();
    u.insert("text".into(), json!(req.text));
    u.insert("top_logprobs".into(), Value::Null);
    u.insert("truncation".into(), json!(req.truncation.as_deref().unwrap_or("disabled")));
    let mut a = Map::new();
    a.insert("user".into(), json!(req.user));
    a.insert("presence_penalty".into(), json!(req.presence_penalty.unwrap_or(0.0)));
    a.insert("frequency_penalty".into(), json!(req.frequency_penalty.unwrap_or(0.0)));
    a.insert("kv_transfer_params".into(), Value::Null);
    a.insert("ec_transfer_params".into(), Value::Null);
    Echo { before_model, before_status: s, before_usage: u, after_usage: a }
}

pub async fn create(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    // What the renderer reads besides the request's fields: `chat_template_kwargs`.
    let raw = parse_object(&body, &[fields_of::<ResponsesBody>(), &["chat_template_kwargs"]].concat())?;
    let req: ResponsesBody = serde_json::from_value(Value::Object(raw.clone())).map_err(|e| ApiError::BadRequest(format!("invalid request body: {e}")))?;
    if req.input.is_none() {
        return Err(missing_input(&raw));
    }
    let tool_choice = validate(&req)?;
    check_model(&state, req.model.as_deref())?;
    let store = &state.responses;
    let background = req.background == Some(true);
    if req.store == Some(true) && !store.enabled() && background {
        return Err(ApiError::invalid(
            StatusCode::BAD_REQUEST,
            "This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these \
             features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
            "background",
        ));
    }
    if req.previous_input_messages.as_ref().is_some_and(|m| !m.is_null()) && req.previous_response_id.is_some() {
        return Err(ApiError::invalid(StatusCode::BAD_REQUEST, "Only one of `previous_input_messages` and `previous_response_id` can be set.", "previous_response_id"));
    }
    // vLLM silently ignores `store` when its store is off.
    let keep = req.store == Some(true) && store.enabled();

    let previous = match &req.previous_response_id {
        Some(id) => {
            let (response, messages) = store.get(id).ok_or_else(|| not_found(id))?;
            let output = response["output"].as_array().cloned().unwrap_or_default();
            Some((messages, output))
        }
        None => None,
    };
    let chat = kvroute_tokenize::responses::chat_template_input(&raw, previous.as_ref().map(|(m, o)| (m.as_slice(), o.as_slice())))
        .map_err(ApiError::Chat)?;
    let messages = chat.get("messages").and_then(Value::as_array).cloned().unwrap_or_default();
    let chat_body = Value::Object(chat).to_string();
    let cfg = state.worker.config();
    // `max_output_tokens` is the limit (a `max_tokens` field is not one of the request's and
    // is ignored); with none, the rest of the context.
    let requested = Requested { value: req.max_output_tokens, param: "max_output_tokens" };
    limits::check_requested(requested, cfg.max_model_len)?;
    let prompt = state.tokenizer.encode_chat(&chat_body, Api::ChatCompletions)?;
    limits::check_prompt(prompt.len(), cfg.max_model_len, PromptForm::Text)?;
    if prompt.len() >= cfg.max_model_len {
        let message = format!("The engine prompt length {} exceeds the max_model_len {}. Please reduce prompt.", prompt.len(), cfg.max_model_len);
        return Err(ApiError::invalid(StatusCode::BAD_REQUEST, message, "input"));
    }
    let max = limits::max_tokens(requested.value, prompt.len(), cfg.max_model_len);
    // No `n`: the engine always gets one sequence.
    let (_, max) = limits::sampling(1, max, req.temperature)?;
    let raw_prompt = if req.enable_response_messages { Some((state.tokenizer.render_chat(&chat_body, Api::ChatCompletions)?, prompt.clone())) } else { None };

    let plan = Generate { prompts: vec![(prompt, max)], n: 1, ignore_eos: req.ignore_eos, cache_salt: req.cache_salt.clone() };
    let mut started = start(&state, &headers, plan)?;
    let echo = echo(&req, tool_choice, background, max);
    let turn = Turn {
        id: req.request_id.clone().unwrap_or_else(|| format!("resp_{}", random_uuid())),
        created_at: now(),
        model: state.worker.model().to_string(),
        echo,
        block_size: cfg.block_size,
        raw_prompt,
        pieces: std::mem::take(&mut started.answers[0].pieces),
    };
    let rank = HeaderValue::from(started.dp_rank);
    let rx = started.rx;
    let stream = req.stream == Some(true);

    let mut response = if background {
        // Stored at once as `queued` (it stays so until done: vLLM never marks it
        // `in_progress`), generated detached; cancel aborts it.
        let queued = turn.object("queued", vec![], Value::Null, None);
        let log = stream.then(EventLog::default);
        store.insert(turn.id.clone(), Entry { response: queued.clone(), messages: messages.clone(), task: None, events: log.clone() });
        let (id, responses) = (turn.id.clone(), state.responses.clone());
        let task_id = id.clone();
        let sink = log.clone();
        let task = tokio::spawn(async move {
            let _close = sink.clone().map(CloseOnDrop);
            let mut em = Emitter { seq: 0, sink: sink.map_or(Sink::None, Sink::Log) };
            match generate(&turn, rx, &mut em).await {
                Outcome::Done(r) => {
                    responses.finish(&id, r.clone(), messages);
                    finish_stream(&mut em, &r);
                }
                Outcome::Gone | Outcome::Died => responses.fail(&id),
            }
        });
        state.responses.set_task(&task_id, task.abort_handle());
        match log {
            Some(log) => sse(ReceiverStream::new(log.replay(0))),
            None => Json(queued).into_response(),
        }
    } else if stream {
        let (tx, out) = tokio::sync::mpsc::unbounded_channel();
        let responses = state.responses.clone();
        // The body stands for the client: dropped (the client went away), it aborts the
        // generation at once. A background stream's body (above) does not: vLLM runs it detached.
        let abort = rx.abort_guard();
        tokio::spawn(async move {
            let mut em = Emitter { seq: 0, sink: Sink::Client(tx) };
            if let Outcome::Done(r) = generate(&turn, rx, &mut em).await {
                if keep {
                    responses.finish(&turn.id, r.clone(), messages);
                }
                finish_stream(&mut em, &r);
            }
        });
        ([(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")], guarded_body(UnboundedReceiverStream::new(out), abort)).into_response()
    } else {
        let mut em = Emitter { seq: 0, sink: Sink::None };
        match generate(&turn, rx, &mut em).await {
            Outcome::Done(r) => {
                if keep {
                    store.finish(&turn.id, r.clone(), messages);
                }
                Json(r).into_response()
            }
            Outcome::Gone | Outcome::Died => return Err(ApiError::Unavailable("the worker restarted while generating".into())),
        }
    };
    response.headers_mut().insert("x-sim-dp-rank", rank);
    Ok(response)
}

/// FastAPI's query booleans.
fn query_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" | "t" | "y" => Some(true),
        "0" | "false" | "off" | "no" | "f" | "n" => Some(false),
        _ => None,
    }
}

fn query_error(param: &'static str, msg: &str) -> ApiError {
    ApiError::Typed { status: StatusCode::BAD_REQUEST, kind: "Bad Request", message: format!("1 validation error:\n  {msg}"), param: Some(param) }
}

/// `GET /v1/responses/{id}`: the stored response; `?stream=true` replays a background
/// stream's events after `starting_after`.
pub async fn retrieve(State(state): State<AppState>, Path(id): Path<String>, Query(q): Query<HashMap<String, String>>) -> Result<Response, ApiError> {
    let stream = match q.get("stream") {
        None => false,
        Some(v) => query_bool(v).ok_or_else(|| query_error("query.stream", "Input should be a valid boolean"))?,
    };
    let starting_after = match q.get("starting_after") {
        None => None,
        Some(v) => Some(v.parse::<i64>().map_err(|_| query_error("query.starting_after", "Input should be a valid integer"))?),
    };
    let store = &state.responses;
    let (response, _) = store.get(&id).ok_or_else(|| not_found(&id))?;
    if !stream {
        return Ok(Json(response).into_response());
    }
    match store.events(&id).flatten() {
        Some(log) => {
            let from = starting_after.map_or(0, |n| (n + 1).max(0) as usize);
            Ok(sse(ReceiverStream::new(log.replay(from))))
        }
        // vLLM raises this inside its stream; the simulator answers it before streaming.
        None => Err(ApiError::Typed {
            status: StatusCode::BAD_REQUEST,
            kind: "BadRequestError",
            message: format!("Unknown response_id: {id} (parameter=response_id, value={id})"),
            param: Some("response_id"),
        }),
    }
}

/// `POST /v1/responses/{id}/cancel`: only a background response still queued or in progress.
pub async fn cancel(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    match state.responses.cancel(&id) {
        Ok(r) => Ok(Json(r).into_response()),
        Err(CancelError::NotFound) => Err(not_found(&id)),
        Err(CancelError::NotCancellable) => Err(ApiError::invalid(StatusCode::BAD_REQUEST, "Cannot cancel a synchronous response.", "response_id")),
    }
}
