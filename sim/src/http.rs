//! The per-worker HTTP surface: OpenAI-compatible endpoints (`openai`; the Responses API with
//! its per-worker store in `responses`; Anthropic's `messages`), with vLLM's output-limit and
//! `n` checks in `limits`, vLLM's extra endpoints (`admin`) and the simulator's own
//! admin/debug endpoints (`simctl`); request bodies parse through `body` (JSON nested as deep
//! as vLLM's Python decoder takes it). Every response
//! carries `x-sim-worker: <id>` so end-to-end tests know who served a request; generation
//! responses also carry `x-sim-dp-rank: <r>`, the rank that ran it (see `dp.rs`).

mod admin;
mod body;
mod error;
mod limits;
mod messages;
mod openai;
mod responses;
mod simctl;
mod stream;

use crate::answer::Answerer;
use crate::chat::ChatTokenizer;
use crate::dp::DpWorker;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
pub use error::ApiError;
pub use responses::{ResponseStore, DEFAULT_CAPACITY as RESPONSES_CAPACITY};
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::Arc;

/// Fault knobs currently applied to one rank of a worker (reported by `/sim/state`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Faults {
    pub drop_fraction: f64,
    pub stop_publishing: bool,
    pub slowdown: f64,
    /// The engine died (vLLM's `EngineDeadError`): every vLLM endpoint answers 5xx (`/health`
    /// and `/metrics` 503, generation 500) until cleared; `/sim/*` still works.
    pub engine_dead: bool,
    /// Blocks announced by floods so far (`flood_blocks`); never held.
    pub flooded_blocks: u64,
}

#[derive(Clone)]
pub struct AppState {
    pub worker: DpWorker,
    pub tokenizer: Arc<ChatTokenizer>,
    /// Generated answers, made with the same tokenizer.
    pub answers: Arc<Answerer>,
    /// Indexed by rank.
    pub faults: Arc<Mutex<Vec<Faults>>>,
    /// Endpoints advertised by `/sim/state`.
    pub layout: Arc<serde_json::Value>,
    /// Stored Responses API responses (this worker's memory, as a vLLM server's).
    pub responses: Arc<ResponseStore>,
}

/// What a vLLM server whose engine died answers: 503 on `/health` and `/metrics`, 500 with an
/// OpenAI error body on everything else (the simulator's own `/sim/*` keeps working).
async fn engine_dead(State(s): State<AppState>, request: Request, next: Next) -> Response {
    let dead = s.faults.lock().iter().any(|f| f.engine_dead);
    let path = request.uri().path();
    if !dead || path.starts_with("/sim/") {
        return next.run(request).await;
    }
    let status = if path == "/health" || path == "/metrics" { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::INTERNAL_SERVER_ERROR };
    let body = serde_json::json!({"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "type": "InternalServerError", "param": null, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

/// A known path with another method: what FastAPI answers (its own handler, not vLLM's error
/// body: vLLM registers its handler for FastAPI's `HTTPException`, and the router raises
/// Starlette's). axum adds the `allow` header. So `DELETE /v1/responses/{id}`, which vLLM
/// 0.33 does not route, is a 405.
async fn method_not_allowed() -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, axum::Json(serde_json::json!({"detail": "Method Not Allowed"}))).into_response()
}

pub fn app(state: AppState) -> Router {
    let header = HeaderValue::from_str(&state.worker.id().to_string()).unwrap_or(HeaderValue::from_static("?"));
    let routes = Router::new()
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{response_id}", get(responses::retrieve))
        .route("/v1/responses/{response_id}/cancel", post(responses::cancel))
        .route("/v1/models", get(admin::models))
        .route("/health", get(admin::health))
        .route("/tokenize", post(admin::tokenize))
        .route("/detokenize", post(admin::detokenize))
        .route("/metrics", get(admin::metrics))
        .route("/reset_prefix_cache", post(admin::reset_prefix_cache))
        .route("/sim/reset_prefix_cache", post(admin::reset_prefix_cache))
        .route("/sim/state", get(simctl::state))
        .route("/sim/fault", post(simctl::fault))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), engine_dead))
        .with_state(state);
    // Wrapped whole, so that the layer below sees responses as the router finishes them.
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::map_response(move |mut r: Response| {
            let header = header.clone();
            async move {
                r.headers_mut().insert("x-sim-worker", header);
                if r.status() == StatusCode::METHOD_NOT_ALLOWED {
                    // FastAPI's routes do not add HEAD to GET, as axum's do.
                    let allow = r.headers().get(axum::http::header::ALLOW).and_then(|v| v.to_str().ok()).map(|v| v.split(',').filter(|m| *m != "HEAD").collect::<Vec<_>>().join(", "));
                    if let Some(v) = allow.and_then(|a| HeaderValue::from_str(&a).ok()) {
                        r.headers_mut().insert(axum::http::header::ALLOW, v);
                    }
                }
                r
            }
        }))
}
