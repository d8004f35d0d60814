//! vLLM's auxiliary endpoints: `/health`, `/v1/models`, `/tokenize`, `/detokenize`, `/metrics` (one series
//! per data-parallel rank) and `/reset_prefix_cache` (every rank; `?reset_external=true` also
//! empties the CPU offload tier, as vLLM's connector reset). The simulator's own
//! endpoints are in `simctl.rs`.

use super::body::{parse_json, template_input};
use super::error::ApiError;
use super::openai::check_model;
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
    /// Default true for a prompt (`TokenizeCompletionRequest`), false for messages.
    add_special_tokens: Option<bool>,
    #[serde(default)]
    return_token_strs: Option<bool>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
}

/// vLLM's `/tokenize` (`serve/tokenize`): `{"prompt"}` (a completion prompt, special tokens
/// added unless `add_special_tokens: false`) or `{"messages", ...}` (rendered as the chat
/// endpoint renders it) -> `TokenizeResponse` `{count, max_model_len, tokens, token_strs}`
/// (`token_strs` with `return_token_strs`), plus the simulator's `sim_tokenizer`.
pub async fn tokenize(State(s): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: TokenizeBody = parse_json(&body)?;
    check_model(&s, req.model.as_deref())?;
    let tokens = match (req.prompt, req.messages) {
        (Some(p), None) if req.add_special_tokens == Some(false) => s.tokenizer.encode_text_plain(&p)?,
        (Some(p), None) => s.tokenizer.encode_text(&p)?,
        (None, Some(_)) => {
            if req.continue_final_message == Some(true) && req.add_generation_prompt == Some(true) {
                return Err(ApiError::BadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.".into()));
            }
            s.tokenizer.encode_chat(&template_input(&body)?, Api::ChatCompletions)?
        }
        _ => return Err(ApiError::BadRequest("give exactly one of `prompt` or `messages`".into())),
    };
    let max_len = s.worker.config().max_model_len;
    let token_strs = if req.return_token_strs == Some(true) { json!(s.tokenizer.token_strs(&tokens)) } else { Value::Null };
    Ok(Json(json!({
        "count": tokens.len(), "max_model_len": max_len, "tokens": tokens, "token_strs": token_strs,
        "sim_tokenizer": s.tokenizer.kind(),
    })))
}

#[derive(Deserialize)]
struct DetokenizeBody {
    model: Option<String>,
    tokens: Vec<i64>,
}

/// vLLM's `/detokenize`: `{"model"?, "tokens"}` -> `{"prompt"}`, the tokenizer's decoding with
/// special tokens kept (ids past the vocabulary decode to nothing, as in `tokenizers`; a
/// negative id fails validation).
pub async fn detokenize(State(s): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: DetokenizeBody = parse_json(&body)?;
    check_model(&s, req.model.as_deref())?;
    let ids = req
        .tokens
        .iter()
        .map(|t| match *t {
            t if t < 0 => Err(ApiError::BadRequest(format!("tokens: Input should be greater than or equal to 0, got {t}"))),
            t => Ok(u32::try_from(t).unwrap_or(u32::MAX)),
        })
        .collect::<Result<Vec<u32>, _>>()?;
    Ok(Json(json!({"prompt": s.tokenizer.decode_all(&ids)?})))
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
