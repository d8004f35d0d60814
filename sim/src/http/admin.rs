//! vLLM's auxiliary endpoints: `/health`, `/v1/models`, `/tokenize`, `/metrics` (one series
//! per data-parallel rank) and `/reset_prefix_cache` (every rank; `?reset_external=true` also
//! empties the CPU offload tier, as vLLM's connector reset). The simulator's own
//! endpoints are in `simctl.rs`.

use super::error::{parse_json, ApiError};
use super::openai::{check_model, utf8};
use super::AppState;
use crate::metrics::{render, MetricsInput};
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use kvroute_tokenize::Api;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};

pub async fn health() -> impl IntoResponse {
    axum::http::StatusCode::OK
}

pub async fn models(State(s): State<AppState>) -> Json<Value> {
    let max_len = s.worker.config().max_model_len;
    Json(json!({"object": "list", "data": [{
        "id": s.worker.model(), "object": "model", "created": 0, "owned_by": "vllm",
        "root": s.worker.model(), "parent": null, "max_model_len": max_len, "permission": []
    }]}))
}

#[derive(Deserialize)]
struct TokenizeBody {
    model: Option<String>,
    prompt: Option<String>,
    /// Read by the tokenizer from the raw body, with `tools`, `add_generation_prompt`, ...
    messages: Option<IgnoredAny>,
}

pub async fn tokenize(State(s): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: TokenizeBody = parse_json(&body)?;
    check_model(&s, req.model.as_deref())?;
    let tokens = match (req.prompt, req.messages) {
        (Some(p), None) => s.tokenizer.encode_text(&p)?,
        (None, Some(_)) => s.tokenizer.encode_chat(utf8(&body)?, Api::ChatCompletions)?,
        _ => return Err(ApiError::BadRequest("give exactly one of `prompt` or `messages`".into())),
    };
    let max_len = s.worker.config().max_model_len;
    Ok(Json(json!({
        "count": tokens.len(), "max_model_len": max_len, "tokens": tokens, "token_strs": null,
        "sim_tokenizer": s.tokenizer.kind(),
    })))
}

pub async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    let text = {
        // Locked in rank order; each engine task only ever takes its own lock.
        let guards: Vec<_> = s.worker.ranks().iter().map(|w| (w.dp_rank, w.inner.lock())).collect();
        let engines: Vec<_> = guards.iter().map(|(r, g)| (*r, &g.engine)).collect();
        render(&MetricsInput { model: s.worker.model(), engines: &engines })
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
}

#[derive(Deserialize, Default)]
pub struct ResetQuery {
    #[serde(default)]
    reset_external: bool,
}

pub async fn reset_prefix_cache(State(s): State<AppState>, Query(q): Query<ResetQuery>) -> Json<Value> {
    let ok = s.worker.reset_prefix_cache(q.reset_external);
    Json(json!({"reset": ok, "message": if ok { "prefix cache reset" } else { "blocks in use; not reset (as vLLM)" }}))
}
