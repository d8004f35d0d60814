//! The two credentials: the proxy's API token on `/v1/*` and the operator's admin token on
//! `/admin/*`, each checked once by a layer in front of its routes.

use super::{ApiError, ApiState};
use axum::extract::{Request, State};
use axum::http::{header::AUTHORIZATION, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Constant-time comparison: a token must not leak through response timing.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(str::trim)
}

fn check(state: &ApiState, expected: &str, headers: &HeaderMap, which: &'static str) -> Result<(), ApiError> {
    match bearer(headers) {
        Some(given) if same(given.as_bytes(), expected.as_bytes()) => Ok(()),
        _ => {
            state.metrics.unauthorized.inc();
            Err(ApiError::Unauthorized(which))
        }
    }
}

/// `/v1/*`: the API token, when one is configured.
pub async fn api(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if let Some(token) = state.config.api_token.as_deref() {
        if let Err(e) = check(&state, token, request.headers(), "api_token") {
            return e.into_response();
        }
    }
    next.run(request).await
}

/// `/admin/*`: the admin token; without one configured the admin API is off (403).
pub async fn admin(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let Some(token) = state.config.admin_token.as_deref() else { return ApiError::AdminDisabled.into_response() };
    if let Err(e) = check(&state, token, request.headers(), "admin_token") {
        return e.into_response();
    }
    next.run(request).await
}
