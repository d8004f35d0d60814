//! The request path: pick, report, locate.

use super::{ApiError, Format, PickGate};
use crate::pick::{Deadline, Picked, Picker};
use crate::reporter::Reporter;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use kvroute_core::wire::{LocateRequest, PickRequest, ReportBatch};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The proxy's pick timeout, in milliseconds, sent with every pick.
pub const DEADLINE_HEADER: &str = "x-kvroute-deadline-ms";

/// What a queued pick's call leaves of the proxy's timeout for the answer's trip back.
const QUEUE_SLACK: Duration = Duration::from_millis(150);

/// Decides a pick when a slot is free within `resilience.pick_queue_ms`, else answers 429 at
/// once: the proxy falls back immediately instead of waiting out its pick timeout.
pub async fn pick(
    State(picker): State<Arc<Picker>>,
    State(reporter): State<Arc<Reporter>>,
    Extension(gate): Extension<Arc<PickGate>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let timeout = headers
        .get(DEADLINE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis);
    let format = Format::from_headers(&headers)?;
    let slot = match gate.slots.try_acquire() {
        Ok(slot) => Some(slot),
        Err(_) => tokio::time::timeout(gate.queue, gate.slots.acquire()).await.ok().and_then(Result::ok),
    };
    let Some(slot) = slot else {
        gate.metrics.picks_shed.inc();
        return Err(ApiError::Overloaded(gate.max));
    };
    let request: PickRequest = format.decode(&body, "PickRequest")?;
    // The reports riding along first: a completion they carry frees its worker's load before
    // this pick is scored. Applied even when the pick is refused below (its proxy then sends
    // them again, which the service counts as duplicates: reports are idempotent).
    let applied = reporter.apply_all(&request.reports);
    if !request.tenant.is_empty() && !crate::tenancy::valid_tenant(&request.tenant) {
        return Err(ApiError::BadRequest("PickRequest.tenant: 1 to 128 printable characters, no spaces".into()));
    }
    let deadline = timeout.map_or_else(Deadline::default, |t| Deadline::after(arrived, t));
    let mut response = match picker.pick_or_queue(&request, deadline).await {
        Picked::Decided(response) => response,
        // A queued pick waits without holding one of the concurrent-pick slots, and answers
        // "still queued" with QUEUE_SLACK of the proxy's timeout to spare: the first call
        // (the short pick timeout) at once, later ones (`wait_ms` + pick timeout + 100 ms)
        // after `wait_ms`.
        Picked::Queued(waiting) => {
            drop(slot);
            waiting.answer(timeout.map(|t| arrived + t.saturating_sub(QUEUE_SLACK))).await
        }
    };
    response.reports_applied = applied;
    Ok(format.respond(&response))
}

pub async fn report(State(reporter): State<Arc<Reporter>>, headers: HeaderMap, body: Bytes) -> Result<StatusCode, ApiError> {
    let format = Format::from_headers(&headers)?;
    let batch: ReportBatch = format.decode(&body, "ReportBatch")?;
    reporter.apply_all(&batch.reports);
    Ok(StatusCode::NO_CONTENT)
}

/// Where a stored Responses API response lives (the proxy's `GET` / `DELETE` / cancel on
/// `/v1/responses/{id}`): a `PickResponse` naming its worker, no assignment recorded.
pub async fn locate(State(picker): State<Arc<Picker>>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let format = Format::from_headers(&headers)?;
    let request: LocateRequest = format.decode(&body, "LocateRequest")?;
    if !crate::stored::valid_id(&request.response_id) {
        return Err(ApiError::BadRequest("LocateRequest.response_id: 1 to 128 printable characters, no spaces or quotes".into()));
    }
    Ok(format.respond(&picker.locate(&request).await))
}
