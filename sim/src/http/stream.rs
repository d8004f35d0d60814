//! Turning the engine's token channel into responses: one JSON body, or SSE with one chunk per
//! token. OpenAI: `data: [DONE]` at the end and a final usage chunk when
//! `stream_options.include_usage` is set. Anthropic (`/v1/messages`), as vLLM's converter
//! writes it: `message_start`, `content_block_start` and the first `content_block_delta` with
//! the first token, a delta per token, then `content_block_stop`, `message_delta` (stop reason
//! and usage) and `message_stop`. Token i's text is the planned answer's piece i
//! (`answer.rs`), so the chunks concatenate to the decoding of the ids the engine cached;
//! counts and timing are the engine's.

use super::error::{anthropic_error, ApiError};
use crate::engine::{FinishReason, Finished};
use crate::ids::RequestId;
use crate::worker::TokenRx;
use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

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
    pub prompt_tokens: usize,
    /// The text of output token i (the engine generates exactly the planned ids).
    pub pieces: Vec<String>,
}

fn created() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn usage(f: &Finished) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "completion_tokens": f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
    })
}

/// Anthropic's usage: `input_tokens` excludes the cache reads, as vLLM computes it.
fn anthropic_usage(f: &Finished) -> Value {
    json!({
        "input_tokens": f.prompt_tokens.saturating_sub(f.cached_tokens),
        "output_tokens": f.completion_tokens,
        "cache_read_input_tokens": f.cached_tokens,
    })
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
    fn piece(&self, index: usize) -> &str {
        self.pieces.get(index).map(String::as_str).unwrap_or("")
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

    fn choice(&self, text: &str, finish: Option<&str>, first: bool) -> Value {
        match self.kind {
            Kind::Completion | Kind::Messages => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null}),
            Kind::Chat => {
                let delta = if first { json!({"role": "assistant", "content": text}) } else { json!({"content": text}) };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish, "stop_reason": null})
            }
        }
    }
}

/// Non-streaming: wait for the whole generation.
pub async fn collect(p: Params, mut rx: TokenRx) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut index = 0;
    while let Some(t) = rx.recv().await {
        text.push_str(p.piece(index));
        index += 1;
        if let Some(f) = t.finished {
            if p.kind == Kind::Messages {
                return Ok(Json(json!({
                    "id": p.id(), "type": "message", "role": "assistant", "model": p.model,
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": anthropic_stop(f.reason), "stop_sequence": null, "usage": anthropic_usage(&f),
                }))
                .into_response());
            }
            let choice = match p.kind {
                Kind::Completion | Kind::Messages => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason(f.reason), "stop_reason": null}),
                Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                    "logprobs": null, "finish_reason": reason(f.reason), "stop_reason": null}),
            };
            return Ok(Json(p.envelope(false, json!([choice]), Some(usage(&f)))).into_response());
        }
    }
    Err(ApiError::Unavailable("the worker restarted while generating".into()))
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn event(name: &str, v: &Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

/// The Anthropic events for token `index` (and, when it is the last, the closing ones), in
/// one body chunk.
fn anthropic_events(p: &Params, index: usize, finished: Option<&Finished>) -> Bytes {
    let mut out = String::new();
    if index == 0 {
        // vLLM builds this from the first chunk's usage, which has no cache details.
        let usage = json!({"input_tokens": p.prompt_tokens, "output_tokens": 0});
        let message = json!({"id": p.id(), "type": "message", "role": "assistant", "content": [], "model": p.model,
            "stop_reason": null, "stop_sequence": null, "usage": usage});
        out += &event("message_start", &json!({"type": "message_start", "message": message}));
        out += &event("content_block_start", &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}));
    }
    let text = p.piece(index);
    if !text.is_empty() {
        out += &event("content_block_delta", &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}));
    }
    if let Some(f) = finished {
        out += &event("content_block_stop", &json!({"type": "content_block_stop", "index": 0}));
        let delta = json!({"stop_reason": anthropic_stop(f.reason), "stop_sequence": null});
        out += &event("message_delta", &json!({"type": "message_delta", "delta": delta, "usage": anthropic_usage(f)}));
        out += &event("message_stop", &json!({"type": "message_stop"}));
    }
    Bytes::from(out)
}

/// Streaming: a task converts tokens to SSE chunks; if the client goes away the chunk
/// channel closes, the task drops the token channel and the engine aborts the request.
pub fn sse_response(p: Params, mut rx: TokenRx) -> Response {
    let (tx, out) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut first = true;
        let mut index = 0;
        while let Some(t) = rx.recv().await {
            if p.kind == Kind::Messages {
                let chunk = anthropic_events(&p, index, t.finished.as_ref());
                index += 1;
                if tx.send(chunk).await.is_err() || t.finished.is_some() {
                    return;
                }
                continue;
            }
            if p.kind == Kind::Chat && first {
                let c = p.choice("", None, true);
                if tx.send(sse(&p.envelope(true, json!([c]), None))).await.is_err() {
                    return;
                }
                first = false;
            }
            let finish = t.finished.as_ref().map(|f| reason(f.reason));
            let c = p.choice(p.piece(index), finish, false);
            index += 1;
            if tx.send(sse(&p.envelope(true, json!([c]), None))).await.is_err() {
                return;
            }
            if let Some(f) = t.finished {
                if p.include_usage {
                    let _ = tx.send(sse(&p.envelope(true, json!([]), Some(usage(&f))))).await;
                }
                let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                return;
            }
        }
        let message = "the worker restarted while generating";
        let err = if p.kind == Kind::Messages {
            // As vLLM's converter ends a failed stream: close the open block, then an error
            // event (a 503: overloaded_error).
            let mut out = String::new();
            if index > 0 {
                out += &event("content_block_stop", &json!({"type": "content_block_stop", "index": 0}));
            }
            out += &event("error", &anthropic_error(StatusCode::SERVICE_UNAVAILABLE, message));
            Bytes::from(out)
        } else {
            sse(&json!({"error": {"message": message, "type": "InternalServerError", "code": 503}}))
        };
        let _ = tx.send(err).await;
    });
    let body = Body::from_stream(ReceiverStream::new(out).map(Ok::<_, std::convert::Infallible>));
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}
