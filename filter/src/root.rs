//! The root context: parses the configuration once (`on_configure` returns false on a bad one,
//! which makes Envoy reject the filter config with our log line), defines the metrics, owns the
//! VM's report queue and flushes it on every tick with one `POST /v1/report`.

use crate::config::Config;
use crate::decision::is_success;
use crate::host;
use crate::http::{HttpFilter, PassThrough};
use crate::metrics::Metrics;
use crate::report::ReportQueue;
use crate::shared::{AssignmentIds, Shared};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel, MapType};
use std::cell::RefCell;
use std::rc::Rc;

#[derive(Default)]
pub struct Root {
    shared: Option<Rc<Shared>>,
    /// Token of the report batch in flight (one at a time).
    in_flight: Option<u32>,
    /// The batch being delivered: sent again on the next tick until the state service takes
    /// it (reports are idempotent there), so a cancel survives a frozen or restarting service.
    batch: Option<(usize, Vec<u8>)>,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, _headers: usize, _body: usize, _trailers: usize) {
        if self.in_flight != Some(token) {
            return;
        }
        self.in_flight = None;
        let Some(shared) = &self.shared else { return };
        let count = self.batch.as_ref().map_or(0, |(n, _)| *n);
        let status = host::header(MapType::HttpCallResponseHeaders, ":status");
        if is_success(status.as_deref()) {
            self.batch = None;
            host::add(shared.metrics.reports_sent, count as u64);
        } else {
            host::increment(shared.metrics.report_failures);
            host::log(LogLevel::Debug, &format!("kvroute: report batch of {count} failed, status {status:?}"));
            // Kept only while the service is away (no answer, 5xx): a batch it refused (4xx)
            // would be refused again and hold every later report back.
            if status.as_deref().and_then(|s| s.parse::<u16>().ok()).is_some_and(|s| s < 500) {
                self.batch = None;
            }
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let bytes = host::buffer(BufferType::PluginConfiguration, 0, size).unwrap_or_default();
        let config = match Config::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                host::log(LogLevel::Error, &format!("kvroute: rejecting plugin configuration: {e}"));
                return false;
            }
        };
        if let Err(status) = hostcalls::set_tick_period(config.report_flush) {
            host::log(LogLevel::Error, &format!("kvroute: cannot set tick period: {status:?}"));
            return false;
        }
        let reports = RefCell::new(ReportQueue::new(config.report_max_pending, config.report_max_batch));
        host::log(
            LogLevel::Info,
            &format!("kvroute: configured, mode {:?}, header {}, state cluster {}", config.routing_mode, config.route_header, config.state_cluster),
        );
        if config.allowed_targets.is_empty() {
            host::log(LogLevel::Warn, "kvroute: no allowed_targets: the filter routes to any endpoint or cluster the state service names");
        }
        if config.state_token.is_none() {
            host::log(LogLevel::Warn, "kvroute: no state_token: pick and report calls carry no credential");
        }
        // Per-VM seed from the host's randomness (WASI random_get, which Envoy and
        // ngx_wasm_module provide), mixed with the clock.
        let seed = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), host::now_ms().to_bits());
        let ids = AssignmentIds::seeded(seed);
        self.shared = Some(Rc::new(Shared { config, metrics: Metrics::define(), reports, ids }));
        true
    }

    fn on_tick(&mut self) {
        if self.in_flight.is_some() {
            return;
        }
        let Some(shared) = &self.shared else { return };
        if self.batch.is_none() {
            let Ok(mut queue) = shared.reports.try_borrow_mut() else { return };
            self.batch = queue.take_batch();
        }
        let Some((_, body)) = &self.batch else { return };
        let c = &shared.config;
        match host::post(c, &c.report_path, body, c.report_timeout, &[]) {
            Ok(token) => self.in_flight = Some(token),
            Err(status) => {
                host::increment(shared.metrics.report_failures);
                host::log(LogLevel::Debug, &format!("kvroute: report dispatch failed: {status:?}"));
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        match &self.shared {
            Some(shared) => Some(Box::new(HttpFilter::new(shared.clone()))),
            None => Some(Box::new(PassThrough)),
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
