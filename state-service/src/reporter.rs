//! Reports from the proxy: first token, complete, cancel, each applied to the fleet.
//! A first-token report closes the loop of the TTFT model (the fleet refits the worker's
//! calibration; here the predicted-vs-actual metrics are observed); a completion's `usage`
//! tells how many prompt tokens the engine really served from cache, compared with what the
//! pick predicted (`kvroute_cache_prediction_error`). Reports about unknown assignments
//! (expired, or from before a restart) are counted and otherwise ignored: the proxy never
//! needs an error back.

mod background;

use crate::assign::{Assignment, AssignmentId};
use crate::fleet::{End, FirstToken, Fleet, Usage};
use crate::metrics::{Failure, FailureLabels, Registry, ReportKindLabel, ReportLabels, ReportOutcomeLabel};
use crate::stored::{Owner, Owners};
use crate::store::ResponseDirectory;
use crate::tenancy::{settled_tokens, Ending, Tenants};
use kvroute_core::wire::{Report, ReportKind, UpstreamFailure};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::sync::Arc;
use tokio::time::Instant;

/// Applies the proxy's reports. Owns what they change: the fleet (assignments, calibration,
/// suspicion), the tenants' settlements, the stored responses' owners, and its metrics.
pub struct Reporter {
    fleet: Arc<Fleet>,
    tenants: Arc<Tenants>,
    owners: Arc<Owners>,
    responses: Arc<dyn ResponseDirectory>,
    background: background::Background,
    metrics: ReportMetrics,
}

/// What one report did to a live assignment.
enum Applied {
    FirstToken(Assignment),
    Freed(Assignment),
    Duplicate,
    Unknown,
}

impl Reporter {
    pub fn new(
        fleet: Arc<Fleet>,
        tenants: Arc<Tenants>,
        owners: Arc<Owners>,
        responses: Arc<dyn ResponseDirectory>,
        registry: &mut Registry,
    ) -> Reporter {
        let background = background::Background::new(tenants.clone());
        Reporter { fleet, tenants, owners, responses, background, metrics: ReportMetrics::register(registry) }
    }

    /// Applies reports from a ReportBatch or a pick's `reports`; returns how many it took.
    pub fn apply_all(&self, reports: &[Report]) -> u32 {
        for report in reports {
            self.apply(report);
        }
        u32::try_from(reports.len()).unwrap_or(u32::MAX)
    }

    /// Applies one report and counts it.
    pub fn apply(&self, report: &Report) -> ReportOutcomeLabel {
        self.suspect(report);
        let kind = kind_label(report.kind);
        let outcome = match self.change(report, kind) {
            None => ReportOutcomeLabel::Invalid,
            Some(applied) => {
                self.observe(report, kind, &applied);
                self.learn_response(report, &applied);
                self.settle(report, kind, &applied);
                match applied {
                    Applied::FirstToken(_) | Applied::Freed(_) => ReportOutcomeLabel::Applied,
                    Applied::Duplicate => ReportOutcomeLabel::Duplicate,
                    Applied::Unknown => ReportOutcomeLabel::Unknown,
                }
            }
        };
        self.metrics.reports.get_or_create(&ReportLabels { kind, outcome }).inc();
        outcome
    }

    /// What a valid report changes; `None` for an invalid one.
    fn change(&self, report: &Report, kind: ReportKindLabel) -> Option<Applied> {
        if report.assignment_id == 0 {
            return None;
        }
        let (id, now) = (AssignmentId(report.assignment_id), Instant::now());
        let applied = match kind {
            ReportKindLabel::FirstToken => match self.fleet.first_token(id, report.elapsed_ms, now) {
                FirstToken::Marked { assignment, .. } => Applied::FirstToken(assignment),
                FirstToken::Duplicate => Applied::Duplicate,
                FirstToken::Unknown => Applied::Unknown,
            },
            ReportKindLabel::Complete => self.fleet.finish(id, End::Completed, ending(report, kind), now).map_or(Applied::Unknown, Applied::Freed),
            ReportKindLabel::Cancel => self.fleet.finish(id, End::Cancelled, ending(report, kind), now).map_or(Applied::Unknown, Applied::Freed),
            ReportKindLabel::Unspecified => return None,
        };
        Some(applied)
    }

    /// A finished request's budget reservation is replaced by what it really cost (see
    /// [`crate::tenancy::settled_tokens`]); its usage is counted for its tenant. A background
    /// response's creation ends at once while the engine goes on: it is settled from the
    /// stored response when that ends ([`background`]).
    fn settle(&self, report: &Report, kind: ReportKindLabel, applied: &Applied) {
        let Applied::Freed(a) = applied else { return };
        let tenant = a.budget.as_ref().map_or(report.tenant.as_str(), |s| &*s.tenant);
        self.tenants.count_usage(tenant, report.prompt_tokens, report.cached_tokens.unwrap_or(0), report.completion_tokens);
        let Some(scope) = a.budget.clone() else { return };
        let end = ending(report, kind);
        let accepted = end.completed && (200..300).contains(&end.status);
        if a.background && accepted && crate::stored::valid_id(&report.response_id) {
            if let Some(url) = self.stored_response_url(&report.response_id, a) {
                self.background.follow(url, scope, a.id.0, a.reserved);
                return;
            }
        }
        self.tenants.settle_charged(scope, a.id.0, settled_tokens(&end, a.uncached_tokens, a.reserved), a.reserved);
    }

    /// Where the worker that stored response `id` serves it (`GET /v1/responses/{id}`).
    fn stored_response_url(&self, id: &str, a: &Assignment) -> Option<String> {
        let owner = self.owners.get(id, Instant::now()).map_or_else(|| a.worker.clone(), |o| o.worker);
        let worker = self.fleet.worker(owner.as_str())?;
        let base = crate::tokenization::worker::base_url(&worker.config)?;
        Some(format!("{base}/v1/responses/{id}"))
    }

    /// A Responses API response was stored by the worker that served it: remember where (for
    /// follow-ups, GET and cancel), with its conversation's length once the usage tells it.
    fn learn_response(&self, report: &Report, applied: &Applied) {
        if report.response_id.is_empty() || !crate::stored::valid_id(&report.response_id) {
            return;
        }
        let (a, tokens) = match applied {
            Applied::FirstToken(a) => (a, a.prompt_tokens),
            Applied::Freed(a) if report.prompt_tokens > 0 => (a, report.prompt_tokens.saturating_add(report.completion_tokens)),
            Applied::Freed(a) => (a, a.prompt_tokens),
            _ => return,
        };
        // Failed over: the fallback that answered stored it.
        let worker = match report.served_by.as_str() {
            "" => a.worker.clone(),
            served => match self.fleet.workers().into_iter().find(|w| w.config.endpoint == served || w.config.cluster == served) {
                Some(w) => w.id.clone(),
                None => return,
            },
        };
        let owner = Owner { worker, tokens, tenant: report.tenant.clone() };
        self.owners.learn(&report.response_id, owner.clone(), Instant::now());
        self.responses.share_response(&report.response_id, &owner, self.owners.ttl());
    }

    /// Passive detection: a failure the proxy saw on the chosen worker marks it suspect at once
    /// (on every replica, through the store), before the report frees the assignment that
    /// names it.
    fn suspect(&self, report: &Report) {
        // A value from a newer filter is still a failure; it counts under the generic reset.
        let reason = match UpstreamFailure::try_from(report.upstream_failure) {
            Ok(UpstreamFailure::UpstreamOk) => return,
            Ok(r) => r,
            Err(_) => UpstreamFailure::UpstreamReset,
        };
        self.metrics.upstream_failures.get_or_create(&FailureLabels { reason: Failure(reason) }).inc();
        let worker = self.fleet.assignments().get(AssignmentId(report.assignment_id)).map(|a| a.worker.clone());
        let Some(worker) = worker else { return };
        if self.fleet.suspect(&worker, reason, Instant::now()).is_some() {
            tracing::warn!(%worker, reason = reason.label(), served_by = %report.served_by, "worker suspect: the proxy saw it fail");
        }
    }

    /// What this replica learns from its own reports (replicated ones are not observed twice).
    fn observe(&self, report: &Report, kind: ReportKindLabel, applied: &Applied) {
        let m = &self.metrics;
        match applied {
            Applied::FirstToken(a) if report.elapsed_ms.is_finite() && report.elapsed_ms > 0.0 => {
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
}

/// The reporter's metric families.
struct ReportMetrics {
    /// Reports received by kind and what they matched.
    reports: Family<ReportLabels, Counter>,
    /// Predicted TTFT of assignments that got a first-token report, seconds.
    ttft_predicted: Histogram,
    /// Actual TTFT reported by the proxy, seconds.
    ttft_actual: Histogram,
    /// actual / predicted TTFT.
    ttft_error_ratio: Histogram,
    /// (cached tokens the worker reported - cached tokens the pick predicted) / prompt tokens.
    cache_prediction_error: Histogram,
    /// Failures the proxy saw on the chosen worker, by what it saw.
    upstream_failures: Family<FailureLabels, Counter>,
}

impl ReportMetrics {
    fn register(registry: &mut Registry) -> ReportMetrics {
        let ttft = || Histogram::new(exponential_buckets(0.005, 2.0, 14));
        let m = ReportMetrics {
            reports: Family::default(),
            ttft_predicted: ttft(),
            ttft_actual: ttft(),
            ttft_error_ratio: Histogram::new([0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0]),
            cache_prediction_error: Histogram::new([-0.75, -0.5, -0.25, -0.1, -0.02, 0.02, 0.1, 0.25, 0.5, 0.75, 1.0]),
            upstream_failures: Family::default(),
        };
        registry.register("reports", "Reports received by kind and outcome", m.reports.clone());
        registry.register("ttft_predicted_seconds", "Predicted TTFT of reported assignments", m.ttft_predicted.clone());
        registry.register("ttft_actual_seconds", "Actual TTFT from first-token reports", m.ttft_actual.clone());
        registry.register("ttft_error_ratio", "Actual over predicted TTFT", m.ttft_error_ratio.clone());
        registry.register(
            "cache_prediction_error",
            "Reported minus predicted cached prompt tokens, over prompt tokens (0: the index was right)",
            m.cache_prediction_error.clone(),
        );
        registry.register("upstream_failures", "Failures the proxy saw on a chosen worker, by reason (each marks it suspect)", m.upstream_failures.clone());
        m
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

/// How the proxy reported the request ended.
fn ending(report: &Report, kind: ReportKindLabel) -> Ending {
    Ending {
        completed: kind == ReportKindLabel::Complete,
        status: report.status,
        prompt_tokens: report.prompt_tokens,
        cached_tokens: report.cached_tokens,
        completion_tokens: report.completion_tokens,
        forwarded: report.forwarded,
        streaming: report.streaming,
    }
}

fn usage(report: &Report) -> Usage {
    Usage { prompt_tokens: report.prompt_tokens, completion_tokens: report.completion_tokens, cached_tokens: report.cached_tokens }
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
    use kvroute_kv::types::WorkerId;
    use kvroute_score::{Features, Policy};

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
            reserved: 0,
            background: false,
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
