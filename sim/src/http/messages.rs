//! `/v1/messages` and `/v1/messages/count_tokens`, as vLLM 0.33's Anthropic endpoint serves
//! them (`entrypoints/anthropic/{api_router,protocol,serving}.py`): the body converts to chat
//! messages (`system` first, content blocks, tool use and results) and renders with the
//! model's chat template, then runs as a chat completion with `max_tokens` as both
//! `max_tokens` and `max_completion_tokens`. Streams always carry usage.
//!
//! `model` and `max_tokens` are required by the request model (`model: str` and not empty,
//! `max_tokens: int` above 0; `count_tokens` only needs `model`). A body failing that is
//! refused by pydantic before the handler runs, so the 400 is vLLM's validation error in the
//! OpenAI shape; what the handler refuses (an unknown model, a limit above the context) is in
//! Anthropic's shape. Only those two fields are validated this way; `messages` errors come
//! from the converter, Anthropic-shaped.

use super::body::{parse_json, parse_object, template_input};
use super::error::{request_validation, summarize_input, ApiError, FieldError};
use super::limits::{self, PromptForm, Requested};
use super::openai::{check_model, run, Generate, Reply};
use super::stream::Kind;
use super::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kvroute_tokenize::Api;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The fields read besides `model` and `max_tokens` (read from the validated body).
#[derive(Deserialize)]
struct MessagesBody {
    temperature: Option<f64>,
    #[serde(default)]
    stream: bool,
    /// Not in Anthropic's API: the simulator's way to get exactly `max_tokens`, as for the
    /// OpenAI endpoints.
    #[serde(default)]
    ignore_eos: bool,
    cache_salt: Option<String>,
}

/// pydantic's checks of `model: str` with `validate_model` (not empty).
fn model_error(body: &Map<String, Value>) -> Option<FieldError> {
    match body.get("model") {
        None => Some(FieldError::missing("body.model", body.len())),
        Some(Value::String(m)) if m.is_empty() => Some(FieldError::value_error("body.model", "Model is required", String::new())),
        Some(Value::String(_)) => None,
        Some(other) => Some(FieldError::wrong_type("body.model", "string", summarize_input(other))),
    }
}

/// An `int` field's value; an integral float passes, as pydantic's lax mode lets it.
fn as_int(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e15).map(|f| f as i64))
}

/// pydantic's checks of `max_tokens: int` with `validate_max_tokens` (above 0).
fn max_tokens_error(body: &Map<String, Value>) -> Option<FieldError> {
    let v = match body.get("max_tokens") {
        None => return Some(FieldError::missing("body.max_tokens", body.len())),
        Some(v) => v,
    };
    match as_int(v) {
        None => Some(FieldError::wrong_type("body.max_tokens", "integer", summarize_input(v))),
        Some(n) if n <= 0 => Some(FieldError::value_error("body.max_tokens", "max_tokens must be positive", n.to_string())),
        Some(_) => None,
    }
}

/// The request model's validation (fields in its order); the parsed body when it passes.
fn validate(body: &[u8], max_tokens_required: bool) -> Result<Map<String, Value>, ApiError> {
    let raw = parse_object(body, &["model", "max_tokens"])?;
    let mut errors: Vec<FieldError> = model_error(&raw).into_iter().collect();
    if max_tokens_required {
        errors.extend(max_tokens_error(&raw));
    }
    if errors.is_empty() {
        Ok(raw)
    } else {
        Err(request_validation(&errors))
    }
}

pub async fn messages(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    messages_or_error(state, headers, body).await.unwrap_or_else(ApiError::anthropic)
}

async fn messages_or_error(state: AppState, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let raw = validate(&body, true)?;
    let req: MessagesBody = parse_json(&body)?;
    check_model(&state, raw.get("model").and_then(Value::as_str))?;
    let max_model_len = state.worker.config().max_model_len;
    // The chat request it becomes names its limit `max_completion_tokens`.
    let requested = Requested { value: raw.get("max_tokens").and_then(as_int), param: "max_completion_tokens" };
    limits::check_requested(requested, max_model_len)?;
    let prompt = state.tokenizer.encode_chat(&template_input(&body)?, Api::Messages)?;
    limits::check_prompt(prompt.len(), max_model_len, PromptForm::Text)?;
    let max = limits::max_tokens(requested.value, prompt.len(), max_model_len);
    let (n, max) = limits::sampling(1, max, req.temperature)?;
    let plan = Generate { prompts: vec![(prompt, max)], n, ignore_eos: req.ignore_eos, cache_salt: req.cache_salt };
    run(&state, &headers, plan, Reply { kind: Kind::Messages, stream: req.stream, include_usage: true }).await
}

/// `POST /v1/messages/count_tokens` (the Anthropic SDK's `messages.count_tokens`), as vLLM
/// 0.33 answers it: the prompt `/v1/messages` would prefill for the same body, counted
/// (`anthropic/serving.py` `count_tokens`: `input_tokens` and
/// `context_management.original_input_tokens`); errors in Anthropic's shape.
pub async fn count_tokens(State(state): State<AppState>, body: Bytes) -> Response {
    count_tokens_or_error(state, body).await.unwrap_or_else(ApiError::anthropic)
}

async fn count_tokens_or_error(state: AppState, body: Bytes) -> Result<Response, ApiError> {
    let raw = validate(&body, false)?;
    check_model(&state, raw.get("model").and_then(Value::as_str))?;
    let n = state.tokenizer.encode_chat(&template_input(&body)?, Api::Messages)?.len();
    Ok(axum::Json(serde_json::json!({"input_tokens": n, "context_management": {"original_input_tokens": n}})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(body: &str) -> Option<String> {
        validate(body.as_bytes(), true).err().map(|e| e.to_string())
    }

    #[test]
    fn model_and_max_tokens_are_required_as_pydantic_requires_them() {
        assert_eq!(errors(r#"{"model": "m", "max_tokens": 1, "messages": []}"#), None);
        assert_eq!(errors(r#"{"model": "m", "max_tokens": 2.0}"#), None);
        let e = errors(r#"{"model": "", "max_tokens": 1}"#).unwrap();
        assert!(e.starts_with("1 validation error:") && e.contains("'msg': 'Value error, Model is required'"), "{e}");
        let e = errors(r#"{"max_tokens": 0, "messages": []}"#).unwrap();
        assert!(e.starts_with("2 validation errors:"), "{e}");
        assert!(e.contains("'loc': 'body.model', 'msg': 'Field required', 'input': '<dict of 2 items>'"), "{e}");
        assert!(e.contains("'msg': 'Value error, max_tokens must be positive', 'input': '0'"), "{e}");
        let e = errors(r#"{"model": null, "max_tokens": "x"}"#).unwrap();
        assert!(e.contains("'type': 'string_type'") && e.contains("'type': 'int_type'"), "{e}");
        assert!(validate(br#"{"model": "m"}"#, false).is_ok(), "count_tokens has no max_tokens");
    }
}
