//! vLLM's auxiliary endpoints (`/health`, `/v1/models`, `/tokenize`, `/metrics`,
//! `/reset_prefix_cache`) and the simulator's own: `/sim/state` (what the engine holds, for
//! comparing with the router's index) and `/sim/fault` (fault injection).

use super::error::{parse_json, ApiError};
use super::openai::{check_model, utf8};
use super::AppState;
use crate::events::PubCommand;
use crate::metrics::{render, MetricsInput};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

pub async fn health() -> impl IntoResponse {
    axum::http::StatusCode::OK
}

pub async fn models(State(s): State<AppState>) -> Json<Value> {
    let max_len = s.worker.inner.lock().engine.config().max_model_len;
    Json(json!({"object": "list", "data": [{
        "id": &*s.worker.model, "object": "model", "created": 0, "owned_by": "vllm",
        "root": &*s.worker.model, "parent": null, "max_model_len": max_len, "permission": []
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
        (None, Some(_)) => s.tokenizer.encode_chat(utf8(&body)?)?,
        _ => return Err(ApiError::BadRequest("give exactly one of `prompt` or `messages`".into())),
    };
    let max_len = s.worker.inner.lock().engine.config().max_model_len;
    Ok(Json(json!({
        "count": tokens.len(), "max_model_len": max_len, "tokens": tokens, "token_strs": null,
        "sim_tokenizer": s.tokenizer.kind(),
    })))
}

pub async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    let text = {
        let inner = s.worker.inner.lock();
        render(&MetricsInput { model: &s.worker.model, engine_index: s.worker.dp_rank, engine: &inner.engine })
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
}

pub async fn reset_prefix_cache(State(s): State<AppState>) -> Json<Value> {
    let ok = s.worker.reset_prefix_cache();
    Json(json!({"reset": ok, "message": if ok { "prefix cache reset" } else { "blocks in use; not reset (as vLLM)" }}))
}

pub async fn state(State(s): State<AppState>) -> Json<Value> {
    if let Some(p) = s.worker.publisher() {
        p.flush().await;
    }
    let faults = s.faults.lock().clone();
    let inner = s.worker.inner.lock();
    let e = &inner.engine;
    let publisher = s.worker.publisher().map(|p| {
        let st = &p.stats;
        json!({
            "next_seq": st.next_seq.load(Ordering::SeqCst), "sent": st.sent.load(Ordering::Relaxed),
            "dropped": st.dropped.load(Ordering::Relaxed), "suppressed": st.suppressed.load(Ordering::Relaxed),
            "replays": st.replays.load(Ordering::Relaxed),
        })
    });
    Json(json!({
        "worker": s.worker.id, "model": &*s.worker.model, "dp_rank": s.worker.dp_rank,
        "endpoints": &*s.layout,
        "num_requests_running": e.num_running(), "num_requests_waiting": e.num_waiting(),
        "kv_cache_usage": e.kv_usage(), "num_free_blocks": e.num_free_blocks(),
        "config": e.config(), "stats": e.stats(),
        "cached_block_hashes": e.cached_hashes(),
        "restarts": inner.restarts, "faults": faults, "publisher": publisher,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultBody {
    drop_fraction: Option<f64>,
    stop_publishing: Option<bool>,
    slowdown: Option<f64>,
    #[serde(default)]
    restart: bool,
}

pub async fn fault(State(s): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: FaultBody = parse_json(&body)?;
    if let Some(f) = req.drop_fraction.filter(|f| !(0.0..=1.0).contains(f)) {
        return Err(ApiError::BadRequest(format!("drop_fraction must be within 0..=1, got {f}")));
    }
    if let Some(f) = req.slowdown.filter(|f| !(f.is_finite() && *f > 0.0)) {
        return Err(ApiError::BadRequest(format!("slowdown must be a positive number, got {f}")));
    }
    let mut faults = s.faults.lock();
    if let Some(f) = req.drop_fraction {
        faults.drop_fraction = f;
        if let Some(p) = s.worker.publisher() {
            p.send(PubCommand::SetDropFraction(f));
        }
    }
    if let Some(stop) = req.stop_publishing {
        faults.stop_publishing = stop;
        if let Some(p) = s.worker.publisher() {
            p.send(PubCommand::SetStopped(stop));
        }
    }
    if let Some(f) = req.slowdown {
        faults.slowdown = f;
        s.worker.inner.lock().engine.set_slowdown(f);
    }
    if req.restart {
        s.worker.restart();
    }
    Ok(Json(json!({"faults": &*faults, "restarted": req.restart})))
}
