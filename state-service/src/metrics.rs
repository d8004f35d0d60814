//! Prometheus metrics: one registry, filled once while the service is built.
//!
//! Each component registers its own families when it is constructed and keeps the handles
//! (`PickMetrics` in `pick`, `ReportMetrics` in `reporter`, `TenantMetrics` in `tenancy`,
//! `TokenizeMetrics` in `tokenization`, the fleet's gauge and expiry counter in `fleet`, the
//! API's in `api`): nothing passes a metrics struct around per call. Families that describe
//! a component's current state (the fleet's load, health, index size and event feeds; the
//! store; the tokenizers) are read at scrape time by collectors those components provide, so
//! a removed worker's series disappear with it. This module depends on no component.

mod labels;

pub use labels::{
    AffinityLabels, ExpiryKind, ExpiryLabels, Failure, FailureLabels, Path, PickLabels, PickOutcome, PolicyLabel, Reason, ReasonLabels, ReportKindLabel,
    ReportLabels, ReportOutcomeLabel, TenantLabels, TenantTokenLabels, TokenizationLabels, TokenizeFailure, TokenizeFailureLabels,
};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::{Metric, Registry as PromRegistry};

/// The service's metric families, every name under `kvroute_`.
pub struct Registry(PromRegistry);

impl Default for Registry {
    fn default() -> Self {
        Registry(PromRegistry::with_prefix("kvroute"))
    }
}

impl Registry {
    /// Registers one family; the caller keeps the handle (`metric` is a cheap clone of it).
    pub fn register(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.0.register(name, help, metric);
    }

    /// Adds a component's scrape-time collector.
    pub fn register_collector(&mut self, collector: Box<dyn Collector>) {
        self.0.register_collector(collector);
    }

    /// OpenMetrics text of every family.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.0);
        out
    }
}
