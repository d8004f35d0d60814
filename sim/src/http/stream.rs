//! Turning the engine's token channel into OpenAI responses: one JSON body, or SSE with one
//! chunk per token, `data: [DONE]`, and a final usage chunk when
//! `stream_options.include_usage` is set. Token i's text is the planned answer's piece i
//! (`answer.rs`), so the chunks concatenate to the decoding of the ids the engine cached;
//! counts and timing are the engine's.

use super::error::ApiError;
use crate::engine::{FinishReason, Finished};
use crate::ids::RequestId;
use crate::worker::TokenRx;
use axum::body::{Body, Bytes};
use axum::http::header;
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
}

pub struct Params {
    pub kind: Kind,
    pub model: String,
    pub request: RequestId,
    pub include_usage: bool,
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
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
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
            Kind::Completion => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null}),
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
            let choice = match p.kind {
                Kind::Completion => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason(f.reason), "stop_reason": null}),
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

/// Streaming: a task converts tokens to SSE chunks; if the client goes away the chunk
/// channel closes, the task drops the token channel and the engine aborts the request.
pub fn sse_response(p: Params, mut rx: TokenRx) -> Response {
    let (tx, out) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut first = true;
        let mut index = 0;
        while let Some(t) = rx.recv().await {
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
        let err = json!({"error": {"message": "the worker restarted while generating", "type": "InternalServerError", "code": 503}});
        let _ = tx.send(sse(&err)).await;
    });
    let body = Body::from_stream(ReceiverStream::new(out).map(Ok::<_, std::convert::Infallible>));
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}
