//! Filter metrics, defined once per VM in the root context and handed to every HTTP context.
//! Envoy exposes them under the `wasmcustom.` stats prefix (e.g.
//! `wasmcustom.kvroute_fallback_state_unavailable`). A failed definition leaves the handle
//! `None`, which turns recording into a no-op rather than an error.

use crate::decision::FallbackReason;
use crate::host;
use kvroute_core::sensitive::{Findings, Kind};
use proxy_wasm::types::MetricType;

#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests on an LLM path (routed or not).
    pub llm_requests: Option<u32>,
    /// Pick calls dispatched to the state service.
    pub picks: Option<u32>,
    /// Requests sent to a worker the state service picked.
    pub routed: Option<u32>,
    /// Requests that fell back to the default route, one counter per reason.
    pub fallbacks: [Option<u32>; FallbackReason::ALL.len()],
    /// Pick round-trip time in microseconds (host clock), dispatch to response.
    pub pick_latency_us: Option<u32>,
    /// Reports handed to the state service in a batch that it accepted.
    pub reports_sent: Option<u32>,
    /// Report batches that failed (dispatch error, no response or non-2xx).
    pub report_failures: Option<u32>,
    /// Reports dropped because the pending queue was full.
    pub reports_dropped: Option<u32>,
    /// Requests answered 429/503 because their tenant's budget did not admit them.
    pub rejected: Option<u32>,
    /// Requests answered 401: identity required, none verified.
    pub unauthenticated: Option<u32>,
    /// Unreadable bodies refused (`admission.unread_body = "reject"`).
    pub unread_rejected: Option<u32>,
    /// Requests with a tenant answered 503: the state service did not answer and their
    /// route's budgets must admit them (`admission.state_unavailable = "reject"`).
    pub admission_unavailable: Option<u32>,
    /// `upstream.address` / `upstream.port` values that were not an address (ignored).
    pub host_facts_malformed: Option<u32>,
    /// Picks a replica refused, sent once more (to another replica, where the host balances).
    pub pick_retries: Option<u32>,
    /// Calls sent again for a pick the state service holds in its queue (every worker saturated).
    pub pick_waits: Option<u32>,
    /// Requests the sensitivity classifier sent to its pool (a configured kind found, or text
    /// it could not read).
    pub sensitive: Option<u32>,
    /// Requests whose prompt held each kind of finding, in `Kind::ALL` order.
    pub findings: [Option<u32>; Kind::ALL.len()],
    /// Requests of a pool answered 503: no worker of their pool could be picked.
    pub pool_unavailable: Option<u32>,
}

impl Metrics {
    pub fn define() -> Metrics {
        let counter = |name: &str| host::define_metric(MetricType::Counter, name);
        // In `ALL` order, which is what `FallbackReason::index` counts in.
        let fallbacks = FallbackReason::ALL.map(|reason| counter(&format!("kvroute_fallback_{}", reason.label())));
        Metrics {
            llm_requests: counter("kvroute_llm_requests"),
            picks: counter("kvroute_picks"),
            routed: counter("kvroute_routed"),
            fallbacks,
            pick_latency_us: host::define_metric(MetricType::Histogram, "kvroute_pick_latency_us"),
            reports_sent: counter("kvroute_reports_sent"),
            report_failures: counter("kvroute_report_failures"),
            reports_dropped: counter("kvroute_reports_dropped"),
            rejected: counter("kvroute_rejected"),
            unauthenticated: counter("kvroute_unauthenticated"),
            unread_rejected: counter("kvroute_unread_rejected"),
            admission_unavailable: counter("kvroute_admission_unavailable"),
            host_facts_malformed: counter("kvroute_host_facts_malformed"),
            pick_retries: counter("kvroute_pick_retries"),
            pick_waits: counter("kvroute_pick_waits"),
            sensitive: counter("kvroute_sensitive"),
            findings: Kind::ALL.map(|k| counter(&format!("kvroute_sensitive_{}", k.label()))),
            pool_unavailable: counter("kvroute_pool_unavailable"),
        }
    }

    /// Counts what a prompt held, by kind (never what it was).
    pub fn findings(&self, found: Findings) {
        for (kind, counter) in Kind::ALL.iter().zip(self.findings) {
            if found.has(*kind) {
                host::increment(counter);
            }
        }
    }

    pub fn fallback(&self, reason: FallbackReason) {
        host::increment(self.fallbacks.get(reason.index()).copied().flatten());
    }
}
