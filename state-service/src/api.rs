//! HTTP API (axum). [`app`] builds the router from an [`ApiState`] (`crate::app::App::router`
//! builds that from the service's components); `main` only serves it, so tests drive the same
//! router with `tower::ServiceExt::oneshot`. Handlers take only the components they need.
//!
//! | method, path | body | answer |
//! |---|---|---|
//! | POST /v1/pick | PickRequest (protobuf, or JSON) | 200 PickResponse in the request's format; 429 when overloaded |
//! | POST /v1/report | ReportBatch (protobuf, or JSON) | 204 |
//! | GET /v1/workers | | 200 JSON: load, health, index, events, calibration |
//! | GET /v1/assignments | | 200 JSON: count and in-flight assignments |
//! | GET /v1/models | | 200 JSON per model: block size, workers, tokenizer status and cache |
//! | POST /admin/workers | JSON worker (as in the config file) | 201 / 400 / 409 |
//! | DELETE /admin/workers/{id}[?force=true] | | 204 removed / 202 draining (in-flight count) / 404 |
//! | POST /admin/workers/{id}/drain | | 202 `{"in_flight": n}`: no new picks, removed when done / 404 |
//! | POST /admin/policy | JSON `{"policy": "..."}` | 200 `{"policy": ..., "previous": ...}` |
//! | POST /admin/reset | | 204 |
//! | GET /healthz, /readyz, /metrics | | 200 (readyz: 503 when no worker is healthy) |
//!
//! `/v1/*` needs `Authorization: Bearer <api_token>` when one is configured (the filter sends
//! its `state_token`), `/admin/*` the `admin_token`; both are compared in constant time, and a
//! missing or wrong one is a 401. Health, readiness and metrics stay open (nothing secret).
//!
//! Bad input is a 4xx with a message saying what was wrong ([`error::ApiError`]); an unknown
//! model is a 200 with `degraded_reason = "unknown_model"` and no worker, so the proxy falls
//! back to its default route without treating the state service as broken.

mod admin;
mod auth;
mod codec;
mod error;
mod info;
mod models;
mod routes;
mod serve;

pub use codec::Format;
pub use error::ApiError;
pub use serve::serve;

use crate::config::Config;
use crate::fleet::Fleet;
use crate::membership::Membership;
use crate::metrics::Registry;
use crate::pick::Picker;
use crate::reporter::Reporter;
use crate::tenancy::Tenants;
use crate::tokenization::Tokenization;
use axum::extract::{DefaultBodyLimit, FromRef};
use axum::middleware;
use axum::routing::{delete, get, post, put};
use axum::Router;
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use std::time::Duration;

/// Pick bodies carry whole chat prompts (the filter inspects bodies up to 4 MiB by default,
/// `max_body_bytes`) plus their keys; axum's 2 MiB default is too small, and anything much
/// larger than a real prompt is refused (413) before it is read.
const BODY_LIMIT: usize = 8 * 1024 * 1024;

/// What the handlers are given; each takes only the parts it needs ([`FromRef`]).
#[derive(Clone)]
pub struct ApiState {
    pub config: Arc<Config>,
    pub fleet: Arc<Fleet>,
    pub picker: Arc<Picker>,
    pub reporter: Arc<Reporter>,
    pub membership: Arc<Membership>,
    pub tenants: Arc<Tenants>,
    pub tokenization: Arc<Tokenization>,
    pub registry: Arc<Registry>,
    pub metrics: Arc<ApiMetrics>,
}

macro_rules! parts {
    ($($field:ident: $ty:ty),+ $(,)?) => {$(
        impl FromRef<ApiState> for $ty {
            fn from_ref(state: &ApiState) -> $ty {
                state.$field.clone()
            }
        }
    )+};
}

parts!(
    config: Arc<Config>,
    fleet: Arc<Fleet>,
    picker: Arc<Picker>,
    reporter: Arc<Reporter>,
    membership: Arc<Membership>,
    tenants: Arc<Tenants>,
    tokenization: Arc<Tokenization>,
    registry: Arc<Registry>,
);

/// The API's own metric families.
pub struct ApiMetrics {
    /// Requests refused for a missing or wrong token (401).
    unauthorized: Counter,
    /// Picks refused at once because too many were in progress (answered 429).
    picks_shed: Counter,
}

impl ApiMetrics {
    pub fn register(registry: &mut Registry) -> ApiMetrics {
        let m = ApiMetrics { unauthorized: Counter::default(), picks_shed: Counter::default() };
        registry.register("unauthorized_requests", "Requests refused for a missing or wrong token", m.unauthorized.clone());
        registry.register("picks_shed", "Picks answered 429 overloaded at once instead of queueing past the proxy's timeout", m.picks_shed.clone());
        m
    }
}

/// Picks being decided at once (`resilience.max_concurrent_picks`), and how long a pick may
/// wait for a slot (`resilience.pick_queue_ms`) before it is answered 429.
pub(crate) struct PickGate {
    slots: tokio::sync::Semaphore,
    max: usize,
    queue: Duration,
    metrics: Arc<ApiMetrics>,
}

pub fn app(state: ApiState) -> Router {
    if state.config.api_token.is_none() {
        tracing::warn!("no api_token: /v1/pick, /v1/report and the read views accept any caller");
    }
    let r = &state.config.resilience;
    let gate = Arc::new(PickGate {
        slots: tokio::sync::Semaphore::new(r.max_concurrent_picks),
        max: r.max_concurrent_picks,
        queue: Duration::from_millis(r.pick_queue_ms),
        metrics: state.metrics.clone(),
    });
    // The proxy's API and the read views: the filter's `state_token`.
    let api = Router::new()
        .route("/v1/pick", post(routes::pick).layer(axum::Extension(gate)))
        .route("/v1/report", post(routes::report))
        .route("/v1/locate", post(routes::locate))
        .route("/v1/workers", get(info::workers))
        .route("/v1/assignments", get(info::assignments))
        .route("/v1/models", get(models::models))
        .route("/v1/tenants", get(info::tenants))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::api));
    // The operator's: one auth layer for every admin route.
    let admin = Router::new()
        .route("/admin/workers", post(admin::add_worker))
        .route("/admin/workers/{id}", delete(admin::remove_worker))
        .route("/admin/workers/{id}/drain", post(admin::drain_worker))
        .route("/admin/policy", post(admin::set_policy))
        .route("/admin/reset", post(admin::reset))
        .route("/admin/tenants/{tenant}/budget", put(admin::set_budget).delete(admin::clear_budget))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::admin));
    Router::new()
        .merge(api)
        .merge(admin)
        .route("/healthz", get(info::healthz))
        .route("/readyz", get(info::readyz))
        .route("/metrics", get(info::metrics))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}
