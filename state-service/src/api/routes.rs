//! The request path: pick and report.

use super::{ApiError, Format};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use kvroute_core::wire::{PickRequest, ReportBatch};

pub async fn pick(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let format = Format::from_headers(&headers)?;
    let request: PickRequest = format.decode(&body, "PickRequest")?;
    let response = crate::pick::tokenized::pick(&state, &request).await;
    Ok(format.respond(&response))
}

pub async fn report(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<StatusCode, ApiError> {
    let format = Format::from_headers(&headers)?;
    let batch: ReportBatch = format.decode(&body, "ReportBatch")?;
    for report in &batch.reports {
        crate::report::apply(&state, report);
    }
    Ok(StatusCode::NO_CONTENT)
}
