//! Admin endpoints, behind `Authorization: Bearer <admin_token>`.

use super::ApiError;
use crate::config::WorkerConfig;
use crate::fleet::{AddWorkerError, RegistryError};
use crate::score::Policy;
use crate::state::AppState;
use crate::store::ShareError;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header::AUTHORIZATION, HeaderMap, StatusCode};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

/// Constant-time comparison: the token must not leak through response timing.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = state.config.admin_token.as_deref() else { return Err(ApiError::AdminDisabled) };
    let given = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(given) if same(given.trim().as_bytes(), token.as_bytes()) => Ok(()),
        _ => Err(ApiError::Unauthorized),
    }
}

fn json_body<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("invalid JSON {what}: {e}")))
}

pub async fn add_worker(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<(StatusCode, Json<Value>), ApiError> {
    authorize(&state, &headers)?;
    let worker: WorkerConfig = json_body(&body, "worker")?;
    if state.fleet.worker(&worker.id).is_some() {
        return Err(ApiError::Conflict(RegistryError::Duplicate(worker.id).to_string()));
    }
    state.config.validate_worker(&worker).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    // Shared first (with Redis: stored for every replica), then registered here.
    let id = worker.id.clone();
    state.store.share_worker(&worker).await.map_err(|e| match e {
        ShareError::Exists(_) => ApiError::Conflict(e.to_string()),
        ShareError::Unavailable(_) => ApiError::Unavailable(format!("worker not registered: {e}")),
    })?;
    match state.add_worker(worker) {
        Ok(entry) => Ok((
            StatusCode::CREATED,
            Json(json!({ "id": entry.id.as_str(), "engines": entry.engines.len(), "block_size": entry.block_size })),
        )),
        // Registered meanwhile (a shared registration of the same id arrived): keep it.
        Err(AddWorkerError::Registry(e @ RegistryError::Duplicate(_))) => Err(ApiError::Conflict(e.to_string())),
        Err(e) => {
            // Rejected here (e.g. a block size its model's workers do not use): take the shared
            // registration back so no replica adopts a worker this one refused.
            if let Err(undo) = state.store.unshare_worker(&id).await {
                tracing::warn!(worker = %id, error = %undo, "rejected worker could not be unshared");
            }
            Err(ApiError::BadRequest(e.to_string()))
        }
    }
}

pub async fn remove_worker(State(state): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    authorize(&state, &headers)?;
    if state.fleet.worker(&id).is_none() {
        return Err(ApiError::NotFound(format!("no worker {id:?}")));
    }
    // A shared worker leaves every replica; a config worker only this one.
    if state.store.is_shared(&id) {
        state.store.unshare_worker(&id).await.map_err(|e| ApiError::Unavailable(format!("worker not removed: {e}")))?;
    }
    state.remove_worker(&id);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct PolicyBody {
    policy: String,
}

pub async fn set_policy(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    let body: PolicyBody = json_body(&body, "policy body")?;
    let policy: Policy = body.policy.parse().map_err(|e: crate::score::UnknownPolicy| ApiError::BadRequest(e.to_string()))?;
    let previous = state.set_policy(policy);
    tracing::info!(%policy, %previous, "policy switched");
    Ok(Json(json!({ "policy": policy, "previous": previous })))
}

pub async fn reset(State(state): State<AppState>, headers: HeaderMap) -> Result<StatusCode, ApiError> {
    authorize(&state, &headers)?;
    state.reset();
    tracing::info!("learned state reset");
    Ok(StatusCode::NO_CONTENT)
}
