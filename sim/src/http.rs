//! The per-worker HTTP surface: OpenAI-compatible endpoints (`openai`), vLLM's extra
//! endpoints and the simulator's own admin/debug endpoints (`admin`). Every response
//! carries `x-sim-worker: <id>` so end-to-end tests know who served a request; generation
//! responses also carry `x-sim-dp-rank: <r>`, the rank that ran it (see `dp.rs`).

mod admin;
mod error;
mod openai;
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

pub fn app(state: AppState) -> Router {
    let header = HeaderValue::from_str(&state.worker.id().to_string()).unwrap_or(HeaderValue::from_static("?"));
    Router::new()
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/messages", post(openai::messages))
        .route("/v1/messages/count_tokens", post(openai::count_tokens))
        .route("/v1/models", get(admin::models))
        .route("/health", get(admin::health))
        .route("/tokenize", post(admin::tokenize))
        .route("/metrics", get(admin::metrics))
        .route("/reset_prefix_cache", post(admin::reset_prefix_cache))
        .route("/sim/reset_prefix_cache", post(admin::reset_prefix_cache))
        .route("/sim/state", get(simctl::state))
        .route("/sim/fault", post(simctl::fault))
        .layer(axum::middleware::from_fn_with_state(state.clone(), engine_dead))
        .with_state(state)
        .layer(axum::middleware::map_response(move |mut r: Response| {
            let header = header.clone();
            async move {
                r.headers_mut().insert("x-sim-worker", header);
                r
            }
        }))
}
