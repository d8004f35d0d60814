//! Reports from the proxy: first token, complete, cancel. A first-token report closes the
//! loop of the TTFT model: it feeds the worker's calibration and the predicted-vs-actual
//! metrics. Reports about unknown assignments (expired, or from before a restart) are
//! counted and otherwise ignored: the proxy never needs an error back.

use crate::assign::{AssignmentId, ReportOutcome};
use crate::metrics::{ReportKindLabel, ReportLabels, ReportOutcomeLabel};
use crate::state::AppState;
use crate::store::ReportEvent;
use kvroute_core::wire::{Report, ReportKind};
use tokio::time::Instant;

/// Applies one report and counts it.
pub fn apply(state: &AppState, report: &Report) -> ReportOutcomeLabel {
    let kind = match ReportKind::try_from(report.kind) {
        Ok(ReportKind::ReportFirstToken) => ReportKindLabel::FirstToken,
        Ok(ReportKind::ReportComplete) => ReportKindLabel::Complete,
        Ok(ReportKind::ReportCancel) => ReportKindLabel::Cancel,
        _ => ReportKindLabel::Unspecified,
    };
    let outcome = if report.assignment_id == 0 || kind == ReportKindLabel::Unspecified {
        ReportOutcomeLabel::Invalid
    } else {
        apply_kind(state, kind, AssignmentId(report.assignment_id), report.elapsed_ms)
    };
    state.metrics.reports.get_or_create(&ReportLabels { kind, outcome }).inc();
    outcome
}

fn apply_kind(state: &AppState, kind: ReportKindLabel, id: AssignmentId, elapsed_ms: f64) -> ReportOutcomeLabel {
    let outcome = match kind {
        ReportKindLabel::FirstToken => state.assignments.lock().first_token(id, Instant::now()),
        _ => state.assignments.lock().finish(id),
    };
    match outcome {
        ReportOutcome::FirstToken(a) => {
            if elapsed_ms.is_finite() && elapsed_ms > 0.0 {
                if let Some(worker) = state.registry.read().get(a.worker.as_str()) {
                    worker.calibration.lock().observe(&a.features, elapsed_ms);
                }
                let m = &state.metrics;
                m.ttft_predicted.observe(a.predicted_ttft_ms / 1000.0);
                m.ttft_actual.observe(elapsed_ms / 1000.0);
                if a.predicted_ttft_ms > 0.0 {
                    m.ttft_error_ratio.observe(elapsed_ms / a.predicted_ttft_ms);
                }
            }
            state.store.reported(state, &a, ReportEvent::FirstToken { elapsed_ms });
            ReportOutcomeLabel::Applied
        }
        ReportOutcome::Freed(a) => {
            state.store.reported(state, &a, ReportEvent::Freed);
            state.update_in_flight();
            ReportOutcomeLabel::Applied
        }
        ReportOutcome::Duplicate => ReportOutcomeLabel::Duplicate,
        ReportOutcome::Unknown => ReportOutcomeLabel::Unknown,
    }
}
