//! The request path: pick and report.

use super::{ApiError, Format};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use crate::assign::AssignmentId;
use crate::fleet::FleetEvent;
use kvroute_core::wire::{PickRequest, PickResponse, ReportBatch};
use std::time::Duration;

/// Decides a pick when a slot is free within `resilience.pick_queue_ms`, else answers 429 at
/// once: the proxy falls back immediately instead of waiting out its pick timeout.
///
/// A pick decided after the proxy's own timeout (`x-kvroute-deadline-ms`, from arrival here) is
/// cancelled at once: the proxy has routed the request elsewhere already.
pub async fn pick(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let arrived = std::time::Instant::now();
    let deadline = headers
        .get(DEADLINE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis);
    let format = Format::from_headers(&headers)?;
    let queue = Duration::from_millis(state.config.resilience.pick_queue_ms);
    let slot = match state.pick_slots.try_acquire() {
        Ok(slot) => Some(slot),
        Err(_) => tokio::time::timeout(queue, state.pick_slots.acquire()).await.ok().and_then(Result::ok),
    };
    let Some(_slot) = slot else {
        state.metrics.picks_shed.inc();
        return Err(ApiError::Overloaded(state.config.resilience.max_concurrent_picks));
    };
    let request: PickRequest = format.decode(&body, "PickRequest")?;
    // The reports riding along first: a completion they carry frees its worker's load before
    // this pick is scored. Applied even when the pick is refused below (its proxy then sends
    // them again, which the service counts as duplicates: reports are idempotent).
    let applied = apply_reports(&state, &request.reports);
    if !request.tenant.is_empty() && !crate::tenancy::valid_tenant(&request.tenant) {
        return Err(ApiError::BadRequest("PickRequest.tenant: 1 to 128 printable characters, no spaces".into()));
    }
    // Tokenizing may use most of the proxy's time, never all of it: the decision and the
    // answer's trip back need the rest.
    let until = deadline.map(|d| arrived + d.mul_f64(0.7));
    let mut response = crate::pick::tokenized::pick(&state, &request, until).await;
    response.reports_applied = applied;
    if deadline.is_some_and(|d| arrived.elapsed() > d) && response.assignment_id != 0 {
        let applied = state.apply(FleetEvent::Cancelled { id: AssignmentId(response.assignment_id) });
        crate::report::refund(&state, &applied);
        state.metrics.picks_abandoned.inc();
    }
    Ok(format.respond(&response))
}

/// The proxy's pick timeout, in milliseconds, sent with every pick.
pub const DEADLINE_HEADER: &str = "x-kvroute-deadline-ms";

pub async fn report(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<StatusCode, ApiError> {
    let format = Format::from_headers(&headers)?;
    let batch: ReportBatch = format.decode(&body, "ReportBatch")?;
    apply_reports(&state, &batch.reports);
    Ok(StatusCode::NO_CONTENT)
}

/// Applies reports from a ReportBatch or a pick's `reports`; returns how many it took.
fn apply_reports(state: &AppState, reports: &[kvroute_core::wire::Report]) -> u32 {
    for report in reports {
        crate::report::apply(state, report);
    }
    u32::try_from(reports.len()).unwrap_or(u32::MAX)
}

/// Where a stored Responses API response lives (the proxy's `GET` / `DELETE` / cancel on
/// `/v1/responses/{id}`): a `PickResponse` naming its worker, no assignment recorded.
pub async fn locate(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let format = Format::from_headers(&headers)?;
    let request: kvroute_core::wire::LocateRequest = format.decode(&body, "LocateRequest")?;
    if !crate::responses::valid_id(&request.response_id) {
        return Err(ApiError::BadRequest("LocateRequest.response_id: 1 to 128 printable characters, no spaces or quotes".into()));
    }
    let mut response = PickResponse { policy: "affinity".into(), ..PickResponse::default() };
    if let Some(owner) = crate::pick::affinity::owner(&state, &request.response_id, "locate").await {
        match state.fleet.worker(owner.worker.as_str()) {
            Some(w) => {
                state.metrics.count_affinity("locate", "routed");
                response.worker_id = w.id.to_string();
                response.endpoint = w.config.endpoint.clone();
                response.cluster = w.config.cluster.clone();
            }
            None => {
                state.metrics.count_affinity("locate", "gone");
                response.set_degraded_reason(kvroute_core::wire::DegradedReason::DegradedResponseOwnerGone);
            }
        }
    }
    tracing::debug!(request_id = %request.request_id, response = %request.response_id, worker = %response.worker_id, "locate");
    Ok(format.respond(&response))
}
