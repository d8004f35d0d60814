//! Prometheus metrics, registered once and handed out as handles.
//!
//! Families that count what the request path does (picks, reports, TTFT) are updated where it
//! happens, through the handles here. Families that describe a component's current state (the
//! fleet's load, health, index size and event feeds; the store; the tokenizers) are read at
//! scrape time by collectors those components provide ([`Metrics::register_collector`]), so a
//! removed worker's series disappear with it and nothing has to be kept in sync. This module
//! depends on no other component: they receive handles, it never reaches into them.

mod labels;

pub use labels::{
    ExpiryKind, Failure, FailureLabels, Path, PickLabels, PickOutcome, Reason, ReasonLabels, ReportKindLabel, ReportLabels, ReportOutcomeLabel, TokenizationLabels,
    TokenizeFailure, TokenizeFailureLabels,
};
use kvroute_core::wire::{DegradedReason, TokenizationPath};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry as PromRegistry;

pub struct Metrics {
    registry: PromRegistry,
    /// Pick decisions by policy and outcome.
    pub picks: Family<PickLabels, Counter>,
    /// Degraded decisions by reason; every fallback is counted here.
    pub degraded: Family<ReasonLabels, Counter>,
    /// Reports received by kind and what they matched.
    pub reports: Family<ReportLabels, Counter>,
    /// Assignments freed by a TTL because nobody reported them.
    pub assignments_expired: Family<labels::ExpiryLabels, Counter>,
    /// Time spent deciding a pick, seconds.
    pub pick_latency: Histogram,
    /// Predicted TTFT of assignments that got a first-token report, seconds.
    pub ttft_predicted: Histogram,
    /// Actual TTFT reported by the proxy, seconds.
    pub ttft_actual: Histogram,
    /// actual / predicted TTFT.
    pub ttft_error_ratio: Histogram,
    /// matched blocks / prompt blocks of the chosen worker.
    pub matched_prefix_ratio: Histogram,
    /// (cached tokens the worker reported - cached tokens the pick predicted) / prompt tokens.
    pub cache_prediction_error: Histogram,
    /// Assignments in flight.
    pub assignments_in_flight: Gauge,
    /// Picks by how their prompt became keys (the response's `tokenization`).
    pub tokenization: Family<TokenizationLabels, Counter>,
    /// Tokenization attempts that gave no ids, by path and reason.
    pub tokenization_failures: Family<TokenizeFailureLabels, Counter>,
    /// Time to tokenize a prompt and cut its keys (local and worker paths), seconds.
    pub tokenize_latency: Family<TokenizationLabels, Histogram>,
    /// Failures the proxy saw on the chosen worker, by what it saw.
    pub upstream_failures: Family<FailureLabels, Counter>,
    /// Picks refused at once because too many were in progress (answered 429).
    pub picks_shed: Counter,
    /// Picks the proxy had given up on before they were decided (cancelled first, or decided
    /// past the proxy's timeout): not recorded, so they leave no load behind.
    pub picks_abandoned: Counter,
    /// Requests refused for a missing or wrong token (401).
    pub unauthorized: Counter,
    /// Budgeted picks by tenant (allowlisted, else `other`) and outcome.
    pub tenant_requests: Family<labels::TenantLabels, Counter>,
    /// Budget tokens by tenant and kind: `reserved` at admission, `charged` when settled,
    /// and the usage the responses reported (`prompt`, `cached`, `completion`).
    pub tenant_tokens: Family<labels::TenantTokenLabels, Counter>,
    /// Admissions decided without the shared ledger (unreachable: local share or reject).
    pub budget_degraded: Counter,
    /// Requests naming a stored response (`pick`: previous_response_id; `locate`: GET, DELETE,
    /// cancel), by outcome: `routed` to its worker, `unknown` id, its worker `gone`.
    pub response_affinity: Family<labels::AffinityLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = PromRegistry::with_prefix("kvroute");
        let ttft = || Histogram::new(exponential_buckets(0.005, 2.0, 14));
        let m = Metrics {
            picks: Family::default(),
            degraded: Family::default(),
            reports: Family::default(),
            assignments_expired: Family::default(),
            pick_latency: Histogram::new(exponential_buckets(0.000_01, 2.0, 16)),
            ttft_predicted: ttft(),
            ttft_actual: ttft(),
            ttft_error_ratio: Histogram::new([0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0]),
            matched_prefix_ratio: Histogram::new([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),
            cache_prediction_error: Histogram::new([-0.75, -0.5, -0.25, -0.1, -0.02, 0.02, 0.1, 0.25, 0.5, 0.75, 1.0]),
            assignments_in_flight: Gauge::default(),
            tokenization: Family::default(),
            tokenization_failures: Family::default(),
            tokenize_latency: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.000_05, 2.0, 16))),
            upstream_failures: Family::default(),
            picks_shed: Counter::default(),
            picks_abandoned: Counter::default(),
            unauthorized: Counter::default(),
            tenant_requests: Family::default(),
            tenant_tokens: Family::default(),
            budget_degraded: Counter::default(),
            response_affinity: Family::default(),
            registry: PromRegistry::default(),
        };
        registry.register("picks", "Pick decisions by policy and outcome", m.picks.clone());
        registry.register("degraded_decisions", "Degraded pick decisions by reason", m.degraded.clone());
        registry.register("reports", "Reports received by kind and outcome", m.reports.clone());
        registry.register("assignments_expired", "Assignments freed by a TTL, by which TTL", m.assignments_expired.clone());
        registry.register("pick_latency_seconds", "Time to decide a pick", m.pick_latency.clone());
        registry.register("ttft_predicted_seconds", "Predicted TTFT of reported assignments", m.ttft_predicted.clone());
        registry.register("ttft_actual_seconds", "Actual TTFT from first-token reports", m.ttft_actual.clone());
        registry.register("ttft_error_ratio", "Actual over predicted TTFT", m.ttft_error_ratio.clone());
        registry.register("matched_prefix_ratio", "Matched over total prompt blocks of the chosen worker", m.matched_prefix_ratio.clone());
        registry.register(
            "cache_prediction_error",
            "Reported minus predicted cached prompt tokens, over prompt tokens (0: the index was right)",
            m.cache_prediction_error.clone(),
        );
        registry.register("assignments_in_flight", "Assignments not yet completed, cancelled or expired", m.assignments_in_flight.clone());
        registry.register("tokenization", "Picks by how the prompt became keys", m.tokenization.clone());
        registry.register("tokenization_failures", "Tokenization attempts without ids, by path and reason", m.tokenization_failures.clone());
        registry.register("tokenize_seconds", "Time to tokenize a prompt, by path", m.tokenize_latency.clone());
        registry.register("upstream_failures", "Failures the proxy saw on a chosen worker, by reason (each marks it suspect)", m.upstream_failures.clone());
        registry.register("picks_abandoned", "Picks the proxy gave up on before they were decided (not recorded)", m.picks_abandoned.clone());
        registry.register("unauthorized_requests", "Requests refused for a missing or wrong token", m.unauthorized.clone());
        registry.register("picks_shed", "Picks answered 429 overloaded at once instead of queueing past the proxy's timeout", m.picks_shed.clone());
        registry.register("tenant_requests", "Budgeted requests by tenant and outcome (admitted, rejected_<limit>)", m.tenant_requests.clone());
        registry.register("tenant_tokens", "Budget tokens by tenant and kind (reserved, charged; usage: prompt, cached, completion)", m.tenant_tokens.clone());
        registry.register("budget_degraded", "Admissions decided without the shared budget ledger (it was unreachable)", m.budget_degraded.clone());
        registry.register(
            "response_affinity",
            "Requests naming a stored Responses API response, by path (pick, locate) and outcome (routed, unknown, gone)",
            m.response_affinity.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Adds a component's scrape-time collector. Called once per component, when the state is built.
    pub fn register_collector(&mut self, collector: Box<dyn prometheus_client::collector::Collector>) {
        self.registry.register_collector(collector);
    }

    /// OpenMetrics text of every family.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    pub fn count_expired(&self, ttl: ExpiryKind, n: u64) {
        if n > 0 {
            self.assignments_expired.get_or_create(&labels::ExpiryLabels { ttl }).inc_by(n);
        }
    }

    pub fn count_tokenize_failure(&self, path: TokenizationPath, reason: TokenizeFailure) {
        self.tokenization_failures.get_or_create(&TokenizeFailureLabels { path: Path(path), reason }).inc();
    }

    /// `tenant`: the label ([`crate::tenancy::Tenants::label`]), never an unbounded name.
    pub fn count_tenant_request(&self, tenant: &str, outcome: &str) {
        self.tenant_requests.get_or_create(&labels::TenantLabels { tenant: tenant.into(), outcome: outcome.into() }).inc();
    }

    pub fn count_affinity(&self, path: &'static str, outcome: &'static str) {
        self.response_affinity.get_or_create(&labels::AffinityLabels { path: path.into(), outcome: outcome.into() }).inc();
    }

    pub fn count_tenant_tokens(&self, tenant: &str, kind: &'static str, n: u64) {
        if n > 0 {
            self.tenant_tokens.get_or_create(&labels::TenantTokenLabels { tenant: tenant.into(), kind: kind.into() }).inc_by(n);
        }
    }

    pub fn count_degraded(&self, reason: DegradedReason) {
        self.degraded.get_or_create(&ReasonLabels { reason: Reason(reason) }).inc();
    }

    pub fn count_tokenization(&self, path: TokenizationPath) {
        self.tokenization.get_or_create(&TokenizationLabels { path: Path(path) }).inc();
    }

    pub fn observe_tokenize(&self, path: TokenizationPath, seconds: f64) {
        self.tokenize_latency.get_or_create(&TokenizationLabels { path: Path(path) }).observe(seconds);
    }
}
