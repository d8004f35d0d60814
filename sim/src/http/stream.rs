//! Turning a generation's tokens into responses: one JSON body, or SSE with one chunk per
//! token. Choice `i`'s token `k` has the text of its planned answer's piece `k`
//! (`answer.rs`), so the chunks concatenate to the decoding of the ids the engine cached;
//! counts and timing are the engine's.
//!
//! OpenAI (`chat_completion/serving.py`, `completion/serving.py`): `data: [DONE]` at the end
//! and a final usage chunk when `stream_options.include_usage` is set; a chat stream opens
//! with one role chunk per choice. Usage counts each prompt once (chat: the one prompt;
//! completions: the sum over the prompts) and sums the completion tokens of every choice;
//! `cached_tokens` is, as vLLM reports it, that of the first output streamed, or of the
//! request that finished last (completions: last among the last prompt's).
//!
//! Anthropic (`/v1/messages`, one choice), as vLLM's converter writes it: `message_start`,
//! `content_block_start` and the first `content_block_delta` with the first token, a delta
//! per token, then `content_block_stop`, `message_delta` (stop reason and usage) and
//! `message_stop`.
//!
//! A stream's body holds an abort guard: when hyper drops it (the client went away) the
//! generation is aborted at once, not when its next token fails to send.

use super::error::{anthropic_error, ApiError};
use crate::engine::{FinishReason, Finished};
use crate::ids::RequestId;
use crate::worker::{AbortOnDrop, Token, TokenRx};
use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
    /// Anthropic's Messages API.
    Messages,
}

pub struct Params {
    pub kind: Kind,
    pub model: String,
    pub request: RequestId,
    pub include_usage: bool,
    /// Per prompt.
    pub prompt_tokens: Vec<usize>,
    /// Choices per prompt.
    pub n: usize,
    /// Per choice, the text of each output token (the engine generates exactly the planned
    /// ids).
    pub pieces: Vec<Vec<String>>,
}

fn created() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A response's token counts.
struct Usage {
    prompt: usize,
    completion: usize,
    cached: usize,
}

impl Usage {
    fn openai(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "total_tokens": self.prompt + self.completion,
            "completion_tokens": self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }

    /// Anthropic's usage: `input_tokens` excludes the cache reads, as vLLM computes it.
    fn anthropic(&self) -> Value {
        json!({
            "input_tokens": self.prompt.saturating_sub(self.cached),
            "output_tokens": self.completion,
            "cache_read_input_tokens": self.cached,
        })
    }
}

fn anthropic_stop(r: FinishReason) -> Option<&'static str> {
    match r {
        FinishReason::Stop => Some("end_turn"),
        FinishReason::Length => Some("max_tokens"),
        FinishReason::Abort => None,
    }
}

fn reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
    }
}

impl Params {
    fn piece(&self, choice: usize, index: usize) -> &str {
        self.pieces.get(choice).and_then(|p| p.get(index)).map(String::as_str).unwrap_or("")
    }

    fn choices(&self) -> usize {
        self.pieces.len()
    }

    /// Prompt tokens as the usage counts them: chat's one prompt once, completions' every
    /// prompt once.
    fn prompt_tokens(&self) -> usize {
        match self.kind {
            Kind::Completion => self.prompt_tokens.iter().sum(),
            Kind::Chat | Kind::Messages => self.prompt_tokens.first().copied().unwrap_or(0),
        }
    }

    fn id(&self) -> String {
        match self.kind {
            Kind::Completion => format!("cmpl-sim-{}", self.request.0),
            Kind::Chat => format!("chatcmpl-sim-{}", self.request.0),
            Kind::Messages => format!("msg_sim-{}", self.request.0),
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Messages, _) => "message",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id(), "object": self.object(chunk), "created": created(),
            "model": self.model, "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    /// A stream chunk's choice.
    fn delta(&self, index: usize, text: &str, finish: Option<&str>, role: bool) -> Value {
        match self.kind {
            Kind::Completion | Kind::Messages => json!({"index": index, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null}),
            Kind::Chat => {
                let delta = if role { json!({"role": "assistant", "content": text}) } else { json!({"content": text}) };
                json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": finish, "stop_reason": null})
            }
        }
    }
}

/// One choice as it is collected.
#[derive(Default)]
struct Choice {
    text: String,
    tokens: usize,
    finished: Option<Finished>,
}

/// Non-streaming: wait for every choice to finish.
pub async fn collect(p: Params, mut rx: TokenRx) -> Result<Response, ApiError> {
    let mut choices: Vec<Choice> = (0..p.choices()).map(|_| Choice::default()).collect();
    let mut left = choices.len();
    // The cached tokens vLLM reports: those of the request finishing last (completions: the
    // last prompt's).
    let mut cached = 0;
    let last_prompt = p.prompt_tokens.len().saturating_sub(1);
    while left > 0 {
        let Some(Token { index, out }) = rx.recv().await else {
            return Err(ApiError::Unavailable("the worker restarted while generating".into()));
        };
        let Some(c) = choices.get_mut(index) else { continue };
        c.text.push_str(p.piece(index, c.tokens));
        c.tokens += 1;
        if let Some(f) = out.finished {
            if p.kind != Kind::Completion || index / p.n.max(1) == last_prompt {
                cached = f.cached_tokens;
            }
            c.finished = Some(f);
            left -= 1;
        }
    }
    let usage = Usage { prompt: p.prompt_tokens(), completion: choices.iter().map(|c| c.tokens).sum(), cached };
    let finish = |c: &Choice| c.finished.as_ref().map_or(FinishReason::Abort, |f| f.reason);
    if p.kind == Kind::Messages {
        let c = &choices[0];
        return Ok(Json(json!({
            "id": p.id(), "type": "message", "role": "assistant", "model": p.model,
            "content": [{"type": "text", "text": c.text}],
            "stop_reason": anthropic_stop(finish(c)), "stop_sequence": null, "usage": usage.anthropic(),
        }))
        .into_response());
    }
    let out: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| match p.kind {
            Kind::Chat => json!({"index": i, "message": {"role": "assistant", "content": c.text, "tool_calls": []},
                "logprobs": null, "finish_reason": reason(finish(c)), "stop_reason": null}),
            _ => json!({"index": i, "text": c.text, "logprobs": null, "finish_reason": reason(finish(c)), "stop_reason": null}),
        })
        .collect();
    Ok(Json(p.envelope(false, Value::Array(out), Some(usage.openai()))).into_response())
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn event(name: &str, v: &Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

/// The Anthropic events for token `index` (and, when it is the last, the closing ones), in
/// one body chunk.
fn anthropic_events(p: &Params, index: usize, finished: Option<&Usage>, stop: Option<FinishReason>) -> Bytes {
    let mut out = String::new();
    if index == 0 {
        // vLLM builds this from the first chunk's usage, which has no cache details.
        let usage = json!({"input_tokens": p.prompt_tokens(), "output_tokens": 0});
        let message = json!({"id": p.id(), "type": "message", "role": "assistant", "content": [], "model": p.model,
            "stop_reason": null, "stop_sequence": null, "usage": usage});
        out += &event("message_start", &json!({"type": "message_start", "message": message}));
        out += &event("content_block_start", &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}));
    }
    let text = p.piece(0, index);
    if !text.is_empty() {
        out += &event("content_block_delta", &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}));
    }
    if let Some(u) = finished {
        out += &event("content_block_stop", &json!({"type": "content_block_stop", "index": 0}));
        let delta = json!({"stop_reason": stop.and_then(anthropic_stop), "stop_sequence": null});
        out += &event("message_delta", &json!({"type": "message_delta", "delta": delta, "usage": u.anthropic()}));
        out += &event("message_stop", &json!({"type": "message_stop"}));
    }
    Bytes::from(out)
}

/// A response body that aborts its generation when dropped unfinished: hyper drops the body
/// when the client disconnects, even while no chunk is pending.
struct Guarded<S> {
    inner: S,
    _abort: AbortOnDrop,
}

impl<S: Stream + Unpin> Stream for Guarded<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.get_mut().inner).poll_next(cx)
    }
}

/// An SSE body from `chunks` that aborts the generation `abort` guards if dropped first.
pub fn guarded_body<S>(chunks: S, abort: AbortOnDrop) -> Body
where
    S: Stream<Item = Bytes> + Unpin + Send + 'static,
{
    Body::from_stream(Guarded { inner: chunks, _abort: abort }.map(Ok::<_, std::convert::Infallible>))
}

/// What a stream has sent so far.
struct Progress {
    /// Tokens per choice.
    tokens: Vec<usize>,
    left: usize,
    /// `cached_tokens` of the first output (vLLM's `first_iteration`).
    cached: Option<usize>,
}

/// The OpenAI chunks for one token (a chat stream's first token also opens every choice).
fn openai_chunks(p: &Params, progress: &mut Progress, t: &Token) -> Vec<Bytes> {
    let mut out = Vec::new();
    if progress.cached.is_none() {
        progress.cached = Some(t.out.cached_tokens);
        if p.kind == Kind::Chat {
            out.extend((0..p.choices()).map(|i| sse(&p.envelope(true, json!([p.delta(i, "", None, true)]), None))));
        }
    }
    let Some(k) = progress.tokens.get_mut(t.index) else { return out };
    let text = p.piece(t.index, *k);
    *k += 1;
    let finish = t.out.finished.as_ref().map(|f| reason(f.reason));
    out.push(sse(&p.envelope(true, json!([p.delta(t.index, text, finish, false)]), None)));
    if finish.is_some() {
        progress.left -= 1;
    }
    out
}

/// Streaming: a task converts tokens to SSE chunks. The body aborts the generation if the
/// client goes away; the task then finds the token channel closed and the chunk channel too.
pub fn sse_response(p: Params, mut rx: TokenRx) -> Response {
    let (tx, out) = tokio::sync::mpsc::channel::<Bytes>(64);
    let abort = rx.abort_guard();
    tokio::spawn(async move {
        let mut progress = Progress { tokens: vec![0; p.choices()], left: p.choices(), cached: None };
        while progress.left > 0 {
            let Some(t) = rx.recv().await else { break };
            if p.kind == Kind::Messages {
                let index = progress.tokens[0];
                progress.tokens[0] += 1;
                let done = t.out.finished.as_ref().map(|f| (Usage { prompt: p.prompt_tokens(), completion: f.completion_tokens, cached: f.cached_tokens }, f.reason));
                let chunk = anthropic_events(&p, index, done.as_ref().map(|(u, _)| u), done.as_ref().map(|(_, r)| *r));
                if tx.send(chunk).await.is_err() || done.is_some() {
                    return;
                }
                continue;
            }
            for chunk in openai_chunks(&p, &mut progress, &t) {
                if tx.send(chunk).await.is_err() {
                    return;
                }
            }
        }
        if progress.left == 0 {
            if p.include_usage {
                let usage = Usage { prompt: p.prompt_tokens(), completion: progress.tokens.iter().sum(), cached: progress.cached.unwrap_or(0) };
                let _ = tx.send(sse(&p.envelope(true, json!([]), Some(usage.openai())))).await;
            }
            let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
            return;
        }
        let message = "the worker restarted while generating";
        let err = if p.kind == Kind::Messages {
            // As vLLM's converter ends a failed stream: close the open block, then an error
            // event (a 503: overloaded_error).
            let mut out = String::new();
            if progress.tokens[0] > 0 {
                out += &event("content_block_stop", &json!({"type": "content_block_stop", "index": 0}));
            }
            out += &event("error", &anthropic_error(StatusCode::SERVICE_UNAVAILABLE, message));
            Bytes::from(out)
        } else {
            sse(&json!({"error": {"message": message, "type": "InternalServerError", "code": 503}}))
        };
        let _ = tx.send(err).await;
    });
    let body = guarded_body(ReceiverStream::new(out), abort);
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}
