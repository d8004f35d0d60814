//! The pick's metric families, registered once by [`super::Picker::new`].

use crate::metrics::{AffinityLabels, Path, PickLabels, PickOutcome, PolicyLabel, Reason, ReasonLabels, Registry, TokenizationLabels};
use kvroute_core::wire::{DegradedReason, PickResponse};
use kvroute_score::Policy;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::time::Duration;

pub struct PickMetrics {
    /// Pick decisions by policy and outcome.
    picks: Family<PickLabels, Counter>,
    /// Degraded decisions by reason; every fallback is counted here.
    degraded: Family<ReasonLabels, Counter>,
    /// Time spent deciding a pick, seconds (tokenizing has its own histogram).
    latency: Histogram,
    /// Time from a pick's start to its answer: tokenizing, a stored response's owner, the
    /// decision, admission; seconds.
    pub(super) answer: Histogram,
    /// matched blocks / prompt blocks of the chosen worker.
    pub(super) matched_prefix_ratio: Histogram,
    /// Picks by how their prompt became keys (the response's `tokenization`).
    tokenization: Family<TokenizationLabels, Counter>,
    /// Picks the proxy had given up on before they were decided (cancelled first, or decided
    /// past the proxy's timeout): not recorded, so they leave no load behind.
    pub(super) picks_abandoned: Counter,
    /// Requests naming a stored response (`pick`: previous_response_id; `locate`: GET, DELETE,
    /// cancel), by outcome: `routed` to its worker, `unknown` id, its worker `gone`.
    affinity: Family<AffinityLabels, Counter>,
    /// Picks naming a pool, by pool (configured names) and whether it had a worker to offer.
    pools: Family<PoolPickLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct PoolPickLabels {
    pool: String,
    outcome: &'static str,
}

impl PickMetrics {
    pub fn register(registry: &mut Registry) -> PickMetrics {
        let m = PickMetrics {
            picks: Family::default(),
            degraded: Family::default(),
            latency: Histogram::new(exponential_buckets(0.000_01, 2.0, 16)),
            answer: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            matched_prefix_ratio: Histogram::new([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),
            tokenization: Family::default(),
            picks_abandoned: Counter::default(),
            affinity: Family::default(),
            pools: Family::default(),
        };
        registry.register("pool_picks", "Picks naming a pool, by pool and outcome (eligible: it had a worker taking picks; no_worker)", m.pools.clone());
        registry.register("picks", "Pick decisions by policy and outcome", m.picks.clone());
        registry.register("degraded_decisions", "Degraded pick decisions by reason", m.degraded.clone());
        registry.register("pick_latency_seconds", "Time to decide a pick", m.latency.clone());
        registry.register("pick_answer_seconds", "Time from a pick's start to its answer (tokenizing, affinity, decision, admission)", m.answer.clone());
        registry.register("matched_prefix_ratio", "Matched over total prompt blocks of the chosen worker", m.matched_prefix_ratio.clone());
        registry.register("tokenization", "Picks by how the prompt became keys", m.tokenization.clone());
        registry.register("picks_abandoned", "Picks the proxy gave up on before they were decided (not recorded)", m.picks_abandoned.clone());
        registry.register(
            "response_affinity",
            "Requests naming a stored Responses API response, by path (pick, locate) and outcome (routed, unknown, gone)",
            m.affinity.clone(),
        );
        m
    }

    /// A decided pick: its outcome, how its prompt was keyed, how long the decision took.
    pub(super) fn count_pick(&self, policy: Policy, response: &PickResponse, took: Duration) {
        let outcome = match (response.worker_id.is_empty(), response.degraded_reason() == DegradedReason::DegradedNone) {
            _ if response.rejection.is_some() => PickOutcome::Rejected,
            (true, _) => PickOutcome::Fallback,
            (false, true) => PickOutcome::Routed,
            (false, false) => PickOutcome::Degraded,
        };
        self.picks.get_or_create(&PickLabels { policy: PolicyLabel(policy), outcome }).inc();
        self.tokenization.get_or_create(&TokenizationLabels { path: Path(response.tokenization()) }).inc();
        self.latency.observe(took.as_secs_f64());
    }

    pub(super) fn count_degraded(&self, reason: DegradedReason) {
        self.degraded.get_or_create(&ReasonLabels { reason: Reason(reason) }).inc();
    }

    pub(super) fn count_pool(&self, pool: String, eligible: bool) {
        self.pools.get_or_create(&PoolPickLabels { pool, outcome: if eligible { "eligible" } else { "no_worker" } }).inc();
    }

    pub(super) fn count_affinity(&self, path: &'static str, outcome: &'static str) {
        self.affinity.get_or_create(&AffinityLabels { path: path.into(), outcome: outcome.into() }).inc();
    }
}
