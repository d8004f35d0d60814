//! Admin endpoints (behind the admin-token layer, `auth::admin`).

use super::ApiError;
use crate::config::WorkerConfig;
use crate::fleet::Fleet;
use crate::membership::{Membership, RegisterError};
use crate::pick::Picker;
use crate::tenancy::Tenants;
use kvroute_score::Policy;
use std::sync::Arc;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

fn json_body<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("invalid JSON {what}: {e}")))
}

pub async fn add_worker(State(membership): State<Arc<Membership>>, body: Bytes) -> Result<(StatusCode, Json<Value>), ApiError> {
    let worker: WorkerConfig = json_body(&body, "worker")?;
    match membership.add_shared(worker).await {
        Ok(entry) => Ok((
            StatusCode::CREATED,
            Json(json!({ "id": entry.id.as_str(), "engines": entry.engines.len(), "block_size": entry.block_size })),
        )),
        Err(e @ RegisterError::Exists(_)) => Err(ApiError::Conflict(e.to_string())),
        Err(e @ RegisterError::Unavailable(_)) => Err(ApiError::Unavailable(e.to_string())),
        Err(e @ RegisterError::Invalid(_)) => Err(ApiError::BadRequest(e.to_string())),
    }
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct RemoveQuery {
    /// Remove at once, failing whatever still runs there (default: drain first).
    force: bool,
}

/// Removes a worker: drained first (no new picks; removed when its in-flight requests end,
/// 202 with their count), at once when nothing runs there or with `?force=true` (204). A
/// shared worker leaves every replica; a config worker only this one.
pub async fn remove_worker(
    State(fleet): State<Arc<Fleet>>,
    State(membership): State<Arc<Membership>>,
    Path(id): Path<String>,
    query: Query<RemoveQuery>,
) -> Result<Response, ApiError> {
    let Some(entry) = fleet.worker(&id) else { return Err(ApiError::NotFound(format!("no worker {id:?}"))) };
    if query.force || fleet.in_flight(&entry.id) == 0 {
        membership.retire(&id).await.map_err(|e| ApiError::Unavailable(format!("worker not removed: {e}")))?;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    drain_answer(&membership, &id).map(IntoResponse::into_response)
}

/// `POST /admin/workers/{id}/drain`: no new picks to the worker on any replica; it is removed
/// once its in-flight requests end (`resilience.drain_timeout_ms` at most).
pub async fn drain_worker(State(membership): State<Arc<Membership>>, Path(id): Path<String>) -> Result<(StatusCode, Json<Value>), ApiError> {
    drain_answer(&membership, &id)
}

fn drain_answer(membership: &Arc<Membership>, id: &str) -> Result<(StatusCode, Json<Value>), ApiError> {
    let in_flight = membership.drain(id).ok_or_else(|| ApiError::NotFound(format!("no worker {id:?}")))?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "id": id, "draining": true, "in_flight": in_flight }))))
}

#[derive(Deserialize)]
struct PolicyBody {
    policy: String,
}

pub async fn set_policy(State(picker): State<Arc<Picker>>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let body: PolicyBody = json_body(&body, "policy body")?;
    let policy: Policy = body.policy.parse().map_err(|e: kvroute_score::UnknownPolicy| ApiError::BadRequest(e.to_string()))?;
    let previous = picker.set_policy(policy);
    tracing::info!(%policy, %previous, "policy switched");
    Ok(Json(json!({ "policy": policy, "previous": previous })))
}

pub async fn reset(State(picker): State<Arc<Picker>>) -> Result<StatusCode, ApiError> {
    picker.reset();
    tracing::info!("learned state reset");
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
pub struct BudgetScope {
    /// The tenant's budget for this model rather than its own.
    model: Option<String>,
}

/// `PUT /admin/tenants/{tenant}/budget[?model=M]` with `{"tokens_per_minute": .., "requests_per_minute": ..,
/// "concurrent_requests": ..}` (an absent limit is unlimited): replaces the configured limits
/// at once, for every replica sharing the ledger. A per-model budget applies only to a model
/// the tenant's configured budget lists.
pub async fn set_budget(
    State(tenants): State<Arc<Tenants>>,
    Path(tenant): Path<String>,
    Query(scope): Query<BudgetScope>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let limits: crate::tenancy::Limits = json_body(&body, "budget")?;
    if !crate::tenancy::valid_tenant(&tenant) {
        return Err(ApiError::BadRequest(format!("{tenant:?} is not a tenant name (1 to 128 printable characters, no spaces)")));
    }
    if [limits.tokens_per_minute, limits.requests_per_minute, limits.concurrent_requests].contains(&Some(0)) {
        return Err(ApiError::BadRequest("a limit of 0 admits nothing: omit it for unlimited".into()));
    }
    tenants.set_limits(&tenant, scope.model.as_deref(), Some(limits)).await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
    tracing::info!(%tenant, model = ?scope.model, ?limits, "budget changed");
    Ok(Json(json!({ "tenant": tenant, "model": scope.model, "limits": limits })))
}

/// `DELETE /admin/tenants/{tenant}/budget[?model=M]`: back to the configured limits.
pub async fn clear_budget(State(tenants): State<Arc<Tenants>>, Path(tenant): Path<String>, Query(scope): Query<BudgetScope>) -> Result<StatusCode, ApiError> {
    tenants.set_limits(&tenant, scope.model.as_deref(), None).await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
    Ok(StatusCode::NO_CONTENT)
}
