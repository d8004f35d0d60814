//! Reports from the proxy: first token, complete, cancel, each applied as a [`FleetEvent`].
//! A first-token report closes the loop of the TTFT model (the fleet refits the worker's
//! calibration; here the predicted-vs-actual metrics are observed); a completion's `usage`
//! tells how many prompt tokens the engine really served from cache, compared with what the
//! pick predicted (`kvroute_cache_prediction_error`). Reports about unknown assignments
//! (expired, or from before a restart) are counted and otherwise ignored: the proxy never
//! needs an error back.

use crate::assign::{Assignment, AssignmentId};
use crate::fleet::{Applied, FleetEvent, Usage};
use crate::metrics::{Failure, FailureLabels, Metrics, ReportKindLabel, ReportLabels, ReportOutcomeLabel};
use crate::state::AppState;
use kvroute_core::wire::{Report, ReportKind, UpstreamFailure};

/// Applies one report and counts it.
pub fn apply(state: &AppState, report: &Report) -> ReportOutcomeLabel {
    suspect(state, report);
    let (kind, event) = match event(report) {
        Some((kind, event)) => (kind, Some(event)),
        None => (kind_label(report.kind), None),
    };
    let outcome = match event {
        None => ReportOutcomeLabel::Invalid,
        Some(event) => {
            let applied = state.apply(event);
            observe(&state.metrics, report, kind, &applied);
            settle(state, report, &applied);
            learn_response(state, report, &applied);
            match applied {
                Applied::FirstToken { .. } | Applied::Freed(_) => ReportOutcomeLabel::Applied,
                Applied::Duplicate => ReportOutcomeLabel::Duplicate,
                _ => ReportOutcomeLabel::Unknown,
            }
        }
    };
    state.metrics.reports.get_or_create(&ReportLabels { kind, outcome }).inc();
    outcome
}

/// A finished request's budget reservation is replaced by what it really cost (see
/// [`crate::tenancy::settled_tokens`]); its usage is counted for its tenant.
fn settle(state: &AppState, report: &Report, applied: &Applied) {
    let Applied::Freed(a) = applied else { return };
    let tenant = a.budget.as_ref().map_or(report.tenant.as_str(), |s| &*s.tenant);
    let label = state.tenants.label(tenant);
    let m = &state.metrics;
    m.count_tenant_tokens(&label, "prompt", u64::from(report.prompt_tokens));
    m.count_tenant_tokens(&label, "cached", u64::from(report.cached_tokens.unwrap_or(0)));
    m.count_tenant_tokens(&label, "completion", u64::from(report.completion_tokens));
    let Some(scope) = a.budget.clone() else { return };
    let tokens = crate::tenancy::settled_tokens(
        report.prompt_tokens,
        report.cached_tokens,
        report.completion_tokens,
        a.uncached_tokens,
        a.first_token_at.is_some(),
    );
    m.count_tenant_tokens(&label, "charged", tokens);
    state.tenants.settle(scope, a.id.0, tokens);
}

/// A Responses API response was stored by the worker that served it: remember where (for
/// follow-ups, GET and cancel), with its conversation's length once the usage tells it.
fn learn_response(state: &AppState, report: &Report, applied: &Applied) {
    if report.response_id.is_empty() || !crate::responses::valid_id(&report.response_id) {
        return;
    }
    let (a, tokens) = match applied {
        Applied::FirstToken { assignment, .. } => (assignment, assignment.prompt_tokens),
        Applied::Freed(a) if report.prompt_tokens > 0 => (a, report.prompt_tokens.saturating_add(report.completion_tokens)),
        Applied::Freed(a) => (a, a.prompt_tokens),
        _ => return,
    };
    // Failed over: the fallback that answered stored it.
    let worker = match report.served_by.as_str() {
        "" => a.worker.clone(),
        served => match state.fleet.workers().into_iter().find(|w| w.config.endpoint == served || w.config.cluster == served) {
            Some(w) => w.id.clone(),
            None => return,
        },
    };
    let owner = crate::responses::Owner { worker, tokens };
    state.owners.learn(&report.response_id, owner.clone(), tokio::time::Instant::now());
    state.store.share_response(&report.response_id, &owner, state.owners.ttl());
}

/// An assignment freed without a report (the proxy never used the pick): its reservation is
/// given back.
pub fn refund(state: &AppState, applied: &Applied) {
    if let Applied::Freed(a) = applied {
        if let Some(scope) = a.budget.clone() {
            state.tenants.settle(scope, a.id.0, 0);
        }
    }
}

/// Passive detection: a failure the proxy saw on the chosen worker marks it suspect at once
/// (on every replica, through the store), before the report frees the assignment that names it.
fn suspect(state: &AppState, report: &Report) {
    // A value from a newer filter is still a failure; it counts under the generic reset.
    let reason = match UpstreamFailure::try_from(report.upstream_failure) {
        Ok(UpstreamFailure::UpstreamOk) => return,
        Ok(r) => r,
        Err(_) => UpstreamFailure::UpstreamReset,
    };
    state.metrics.upstream_failures.get_or_create(&FailureLabels { reason: Failure(reason) }).inc();
    let worker = state.fleet.assignments().get(AssignmentId(report.assignment_id)).map(|a| a.worker.clone());
    let Some(worker) = worker else { return };
    if let Applied::Marked(_) = state.apply(FleetEvent::Suspected { worker: worker.clone(), reason }) {
        tracing::warn!(%worker, reason = reason.label(), served_by = %report.served_by, "worker suspect: the proxy saw it fail");
    }
}

fn kind_label(kind: i32) -> ReportKindLabel {
    match ReportKind::try_from(kind) {
        Ok(ReportKind::ReportFirstToken) => ReportKindLabel::FirstToken,
        Ok(ReportKind::ReportComplete) => ReportKindLabel::Complete,
        Ok(ReportKind::ReportCancel) => ReportKindLabel::Cancel,
        _ => ReportKindLabel::Unspecified,
    }
}

/// The fleet event a valid report stands for.
fn event(report: &Report) -> Option<(ReportKindLabel, FleetEvent)> {
    if report.assignment_id == 0 {
        return None;
    }
    let id = AssignmentId(report.assignment_id);
    let kind = kind_label(report.kind);
    let event = match kind {
        ReportKindLabel::FirstToken => FleetEvent::FirstToken { id, elapsed_ms: report.elapsed_ms },
        ReportKindLabel::Complete => FleetEvent::Completed { id, usage: usage(report) },
        ReportKindLabel::Cancel => FleetEvent::Cancelled { id },
        ReportKindLabel::Unspecified => return None,
    };
    Some((kind, event))
}

fn usage(report: &Report) -> Usage {
    Usage { prompt_tokens: report.prompt_tokens, completion_tokens: report.completion_tokens, cached_tokens: report.cached_tokens }
}

/// What this replica learns from its own reports (replicated ones are not observed twice).
fn observe(m: &Metrics, report: &Report, kind: ReportKindLabel, applied: &Applied) {
    match applied {
        Applied::FirstToken { assignment: a, .. } if report.elapsed_ms.is_finite() && report.elapsed_ms > 0.0 => {
            m.ttft_predicted.observe(a.predicted_ttft_ms / 1000.0);
            m.ttft_actual.observe(report.elapsed_ms / 1000.0);
            if a.predicted_ttft_ms > 0.0 {
                m.ttft_error_ratio.observe(report.elapsed_ms / a.predicted_ttft_ms);
            }
        }
        Applied::Freed(a) if kind == ReportKindLabel::Complete => {
            if let Some(error) = cache_prediction_error(a, &usage(report)) {
                m.cache_prediction_error.observe(error);
            }
        }
        _ => {}
    }
}

/// (cached tokens the engine reported - cached tokens the pick predicted) / prompt tokens:
/// 0 when the index knew exactly what the worker held, negative when it promised blocks the
/// worker no longer had (evicted before scheduling), positive when the worker had more
/// (another request warmed it meanwhile). `None` without the usage to compare.
/// Only exact picks are compared: an approximate pick's token counts are estimates.
pub fn cache_prediction_error(a: &Assignment, usage: &Usage) -> Option<f64> {
    let (cached, predicted) = (usage.cached_tokens?, a.predicted_cached_tokens?);
    let prompt = if usage.prompt_tokens > 0 { usage.prompt_tokens } else { a.prompt_tokens };
    if prompt == 0 {
        return None;
    }
    Some((f64::from(cached.min(prompt)) - f64::from(predicted.min(prompt))) / f64::from(prompt))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::{Features, Policy};
    use crate::types::WorkerId;

    fn assignment(prompt_tokens: u32, predicted_cached: u32) -> Assignment {
        Assignment {
            id: AssignmentId(1),
            worker: WorkerId::new("w"),
            policy: Policy::Kvroute,
            prompt_tokens,
            uncached_tokens: prompt_tokens - predicted_cached,
            predicted_ttft_ms: 1.0,
            features: Features::default(),
            created_at: tokio::time::Instant::now(),
            first_token_at: None,
            predicted_cached_tokens: Some(predicted_cached),
            budget: None,
        }
    }

    fn usage(prompt_tokens: u32, cached_tokens: Option<u32>) -> Usage {
        Usage { prompt_tokens, completion_tokens: 3, cached_tokens }
    }

    #[tokio::test]
    async fn cache_prediction_error_is_signed_and_needs_the_cached_count() {
        // Predicted 64 of 100 cached.
        let a = assignment(100, 64);
        assert_eq!(cache_prediction_error(&a, &usage(100, Some(64))), Some(0.0));
        assert_eq!(cache_prediction_error(&a, &usage(100, Some(0))), Some(-0.64));
        assert_eq!(cache_prediction_error(&a, &usage(100, Some(96))), Some(0.32));
        assert_eq!(cache_prediction_error(&a, &usage(100, None)), None, "vLLM without --enable-prompt-tokens-details");
        assert_eq!(cache_prediction_error(&assignment(0, 0), &usage(0, Some(0))), None);
        let approximate = Assignment { predicted_cached_tokens: None, ..a };
        assert_eq!(cache_prediction_error(&approximate, &usage(100, Some(64))), None, "estimates are not compared");
    }
}
