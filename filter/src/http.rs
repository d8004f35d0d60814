//! The per-request HTTP context: strip client routing headers, hold LLM requests until their
//! body is in, ask the state service for a worker, apply the answer (or fall back), and report
//! the response's first token / completion / cancellation. Decisions are made by the pure
//! functions in `decision.rs` and `report.rs`; this file only talks to the host: the request's
//! and response's callbacks here, the state service's answers in `http/answer.rs`.
//!
//! Invariant: every path out of a paused state resumes the request exactly once, and any
//! failure resumes it toward the route's default upstream with a counted reason.

use crate::decision::{
    build_pick, classify_pick_status, degraded_label, headers_to_strip, is_success, route_from_pick, pick_retry, FallbackReason, MAX_RESENDS,
    RequestMeta, queue_call_timeout};
use crate::admission::{OnUnread, Policy};
use crate::config::Cidr;
use crate::host;
use crate::identity::{resolve, Facts};
use crate::reply::{self, Reply};
use crate::report::{ResponseTracker, REPORTS_PER_PICK};
use crate::shared::Shared;
use crate::upstream::{for_log, served_by, upstream_failure, ServedBy};
use kvroute_core::request::{parse, Api};
use kvroute_core::wire::{DegradedReason, LocateRequest, PickRequest, PickResponse, QueuedPick, Report, ReportKind, UnreadBody};
use prost::Message;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, LogLevel, MapType};
use std::rc::Rc;
use std::time::Duration;

mod answer;

pub const DECISION_HEADER: &str = "x-kvroute-decision";
pub const FALLBACK_HEADER: &str = "x-kvroute-fallback";

/// Used only when the plugin has no valid configuration (Envoy normally refuses to start it).
pub struct PassThrough;
impl Context for PassThrough {}
impl HttpContext for PassThrough {}

#[derive(Debug, PartialEq)]
enum Phase {
    /// Not an LLM request, or already decided.
    Idle,
    /// Headers held, body accumulating.
    Buffering,
    /// Pick call in flight.
    Picking { token: u32, sent_ms: f64 },
    /// Locate call in flight (a stored response's `GET` / `DELETE` / cancel).
    Locating { token: u32, response_id: String },
}

pub struct HttpFilter {
    shared: Rc<Shared>,
    phase: Phase,
    meta: RequestMeta,
    fallback: Option<FallbackReason>,
    decision: Option<String>,
    tracker: Option<ResponseTracker>,
    /// The chosen worker's `host:port` (what `upstream_failure` compares against).
    address: String,
    /// The request asked for a stream: only then is the response's first byte its first token.
    streaming: bool,
    /// The API of an LLM request (the shape of the filter's own error replies).
    api: Option<Api>,
    /// Responses API: the stored response the request continues.
    previous_response_id: String,
    /// The stream ends with a usage event (else its body is never read).
    stream_usage: bool,
    /// Reports of earlier requests riding along with the pick in flight: put back in the
    /// queue unless its answer confirms them (`PickResponse.reports_applied`).
    carried: Vec<Report>,
    /// This request's route's admission policy.
    admission: Policy,
    /// Why the body could not be read, when the pick in flight is one for an unread body.
    unread: UnreadBody,
    /// Request body bytes seen so far.
    body_bytes: usize,
    /// The pick in flight and when its time runs out (host ms), kept to send it once more if
    /// the replica that got it refuses it, or again while the state service queues it.
    resend: Option<(PickRequest, f64)>,
    /// How many times the pick in flight was sent again after a refusal.
    resent: u8,
    /// When the state service first answered that the pick waits in its queue (host ms).
    queued_since_ms: Option<f64>,
}

/// What a pick's answer means for the request.
enum Applied {
    /// Routed to the chosen worker (or the default route, with the decision applied).
    Routed,
    /// Answered here (a rejection, vLLM's 404 for a stored response): the request goes nowhere.
    Answered(Reply),
    /// Every worker is saturated: the pick waits in the state service's queue.
    Queued(QueuedPick),
}


/// Identity's view of the host, for one request's headers.
struct HostFacts<F: Fn(&[Cidr]) -> bool> {
    trusted_hop: F,
}

impl<F: Fn(&[Cidr]) -> bool> Facts for HostFacts<F> {
    fn property(&self, path: &[&str]) -> Option<String> {
        host::property(path)
    }
    fn header(&self, name: &str) -> Option<String> {
        host::header(MapType::HttpRequestHeaders, name)
    }
    fn peer_in(&self, ranges: &[Cidr]) -> bool {
        (self.trusted_hop)(ranges)
    }
}

impl HttpFilter {
    pub fn new(shared: Rc<Shared>) -> HttpFilter {
        HttpFilter {
            shared,
            phase: Phase::Idle,
            meta: RequestMeta::default(),
            fallback: None,
            decision: None,
            tracker: None,
            address: String::new(),
            streaming: false,
            api: None,
            previous_response_id: String::new(),
            stream_usage: false,
            carried: Vec::new(),
            admission: Policy::default(),
            unread: UnreadBody::UnreadNone,
            body_bytes: 0,
            resend: None,
            resent: 0,
            queued_since_ms: None,
        }
    }

    /// Sends the request by the route's default upstream: `Continue`. A request of a pool is
    /// answered 503 instead (`Pause`): the default upstream is not its pool's.
    #[must_use]
    fn fall_back(&mut self, reason: FallbackReason, detail: &str) -> Action {
        if !self.meta.pool.is_empty() {
            self.phase = Phase::Idle;
            self.tracker = None;
            self.cancel_assignment();
            host::increment(self.shared.metrics.pool_unavailable);
            host::log(LogLevel::Info, &format!("kvroute: request {} of pool {} refused ({}){detail}", self.meta.request_id, self.meta.pool, reason.label()));
            host::send_reply(&reply::pool_unavailable(self.api, &self.meta.pool));
            return Action::Pause;
        }
        self.phase = Phase::Idle;
        self.fallback = Some(reason);
        self.shared.metrics.fallback(reason);
        if reason.leaves_assignment() {
            self.cancel_assignment();
        }
        host::log(
            LogLevel::Info,
            &format!("kvroute: request {} -> default route ({}){detail}", self.meta.request_id, reason.label()),
        );
        if self.shared.config.fallback_header {
            host::set_header(MapType::HttpRequestHeaders, FALLBACK_HEADER, Some(reason.label()));
        }
        Action::Continue
    }

    /// Places the request in `pool` (verified sources only), named to the upstream too.
    fn place_in(&mut self, pool: &str) {
        self.meta.pool = pool.to_string();
        if !pool.is_empty() {
            host::set_header(MapType::HttpRequestHeaders, crate::pool::POOL_HEADER, Some(pool));
        }
    }

    /// The sensitivity classifier on what the request's text holds (`None`: unreadable): a
    /// sensitive request moves to the classifier's pool.
    fn classify(&mut self, found: Option<kvroute_core::sensitive::Findings>) {
        let Some(s) = &self.shared.config.sensitivity else { return };
        self.shared.metrics.findings(found.unwrap_or_default());
        if s.sensitive(found) {
            let pool = s.pool.clone();
            host::increment(self.shared.metrics.sensitive);
            self.place_in(&pool);
        }
    }

    /// Body complete: parse it and dispatch the pick. Returns the action for the body callback.
    fn start_pick(&mut self, api: Api, body_size: usize) -> Action {
        let shared = Rc::clone(&self.shared);
        let c = &shared.config;
        let body = host::buffer(BufferType::HttpRequestBody, 0, body_size).unwrap_or_default();
        let req = match parse(api, &body) {
            Ok(r) => r,
            Err(e) => return self.unreadable(api, UnreadBody::UnreadUnparsable, body_size, &e.to_string()),
        };
        if c.sensitivity.is_some() {
            // Every string of the body, not only the prompt: tools, instructions and metadata
            // reach the worker too. Token ids cannot be read: sensitive.
            let tokens = matches!(req.prompt, kvroute_core::request::Prompt::Tokens(_));
            self.classify(if tokens { None } else { kvroute_core::sensitive::scan_json(&body) });
        }
        self.streaming = req.stream;
        self.previous_response_id = req.previous_response_id.clone().unwrap_or_default();
        self.stream_usage = req.stream_usage || c.stream_usage == crate::config::StreamUsage::Always;
        self.meta.assignment_id = self.shared.ids.next();
        let pick = build_pick(c, &req, &self.meta);
        let timeout = if self.previous_response_id.is_empty() { c.pick_timeout } else { c.affinity_timeout };
        self.dispatch_pick(pick, timeout)
    }

    /// A body the filter cannot read: refused here (`admission.unread_body = "reject"`), or
    /// admitted by the state service like any pick and routed by the default upstream. A
    /// request without a tenant has no budget to protect: it falls back as it always did.
    fn unreadable(&mut self, api: Api, unread: UnreadBody, body_bytes: usize, detail: &str) -> Action {
        let reason = crate::admission::fallback_reason(unread);
        self.classify(None);
        if self.admission.unread_body == OnUnread::Reject {
            host::increment(self.shared.metrics.unread_rejected);
            host::log(LogLevel::Info, &format!("kvroute: request {} refused: {}: {detail}", self.meta.request_id, reason.label()));
            self.phase = Phase::Idle;
            host::send_reply(&reply::unreadable(Some(api), unread, detail));
            return Action::Pause;
        }
        if self.meta.tenant.is_empty() {
            return self.fall_back(reason, &format!(": {detail}"));
        }
        self.unread = unread;
        self.meta.assignment_id = self.shared.ids.next();
        let pick = crate::admission::unread_pick(&self.meta, api, unread, body_bytes);
        self.dispatch_pick(pick, self.shared.config.pick_timeout)
    }
}

impl HttpContext for HttpFilter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let shared = Rc::clone(&self.shared);
        let c = &shared.config;
        let peer = (c.identity.needs_peer() || c.pools.sources.needs_peer() || c.decision_header).then(|| host::property(&["source", "address"])).flatten();
        let peer_ip = peer.as_deref().and_then(crate::config::peer_ip);
        let trusted_hop = |ranges: &[Cidr]| peer_ip.is_some_and(|ip| ranges.iter().any(|r| r.contains(ip)));
        let forged = headers_to_strip(c, host::header_names(MapType::HttpRequestHeaders).iter().map(String::as_str), trusted_hop);
        for name in &forged {
            host::remove_header(MapType::HttpRequestHeaders, name);
        }
        if !forged.is_empty() && c.route_variable.is_none() {
            // A route chosen while a forged header was present must not stand.
            host::clear_route_cache();
        }
        let path = host::header(MapType::HttpRequestHeaders, ":path").unwrap_or_default();
        if let Some(id) = c.response_id_for_path(&path) {
            let id = id.to_string();
            self.meta.request_id = host::header(MapType::HttpRequestHeaders, "x-request-id").unwrap_or_default();
            // A stored response is as private as the conversation that made it: only its
            // tenant reaches it.
            match resolve(&c.identity, &HostFacts { trusted_hop }) {
                Some((tenant, _source)) => self.meta.tenant = tenant,
                None if c.identity.required => {
                    host::increment(self.shared.metrics.unauthenticated);
                    host::send_reply(&reply::unauthenticated(Some(Api::Responses)));
                    return Action::Pause;
                }
                None => self.meta.tenant = c.identity.default_tenant.clone().unwrap_or_default(),
            }
            return self.start_locate(&id);
        }
        let Some(api) = c.api_for_path(&path) else {
            return Action::Continue;
        };
        self.api = Some(api);
        let route = if c.route_variable.is_none() { host::property(&["xds", "route_name"]) } else { None };
        self.admission = c.admission.policy(route.as_deref());
        self.meta.service_class = self.admission.service_class.clone();
        host::increment(self.shared.metrics.llm_requests);
        self.meta.request_id = host::header(MapType::HttpRequestHeaders, "x-request-id").unwrap_or_default();
        self.meta.trusted = c.decision_header && c.trusts(peer.as_deref());
        match resolve(&c.identity, &HostFacts { trusted_hop }) {
            Some((tenant, _source)) => self.meta.tenant = tenant,
            None if c.identity.required => {
                host::increment(self.shared.metrics.unauthenticated);
                host::log(LogLevel::Info, &format!("kvroute: request {} has no verified identity: 401", self.meta.request_id));
                host::send_reply(&reply::unauthenticated(Some(api)));
                return Action::Pause;
            }
            None => self.meta.tenant = c.identity.default_tenant.clone().unwrap_or_default(),
        }
        let pool = c.pools.pool_of(&self.admission.pool, &HostFacts { trusted_hop }, &self.meta.tenant);
        self.place_in(&pool);
        if end_of_stream {
            return self.fall_back(FallbackReason::NoBody, "");
        }
        self.phase = Phase::Buffering;
        if c.route_variable.is_some() {
            // NGINX: the host reads the whole body before on_request_body and proxy_pass reads
            // the variable after it; held headers would wait for a body never read.
            return Action::Continue;
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if matches!(self.phase, Phase::Locating { .. } | Phase::Picking { .. }) {
            // Held with the headers until the answer (Continue would send them on): a body
            // too large to read is not forwarded before it is admitted.
            return Action::Pause;
        }
        if self.phase != Phase::Buffering {
            return Action::Continue;
        }
        self.body_bytes = body_size;
        let Some(api) = self.api else { return Action::Continue };
        if body_size > self.shared.config.max_body_bytes {
            // Not read; the client's Content-Length says how much more is coming.
            let declared = host::header(MapType::HttpRequestHeaders, "content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
            self.phase = Phase::Idle;
            return self.unreadable(api, UnreadBody::UnreadTooLarge, body_size.max(declared), &format!("{body_size} bytes or more"));
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.start_pick(api, body_size)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // A body ending in trailers (HTTP/2) never had end_of_stream on a data frame: it is
        // complete now, and read like any other.
        match (&self.phase, self.api) {
            (Phase::Buffering, Some(api)) => self.start_pick(api, self.body_bytes),
            (Phase::Picking { .. } | Phase::Locating { .. }, _) => Action::Pause,
            _ => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let c = &self.shared.config;
        if c.decision_header {
            if let Some(d) = &self.decision {
                host::set_header(MapType::HttpResponseHeaders, DECISION_HEADER, Some(d));
            }
        }
        if c.fallback_header {
            if let Some(r) = self.fallback {
                host::set_header(MapType::HttpResponseHeaders, FALLBACK_HEADER, Some(r.label()));
            }
        }
        if let Some(t) = self.tracker.as_mut() {
            let status = host::header(MapType::HttpResponseHeaders, ":status").and_then(|s| s.parse().ok());
            let address = host::property(&["upstream", "address"]);
            let port = host::property(&["upstream", "port"]);
            let served = served_by(address.as_deref(), port.as_deref());
            if served == ServedBy::Malformed {
                host::increment(self.shared.metrics.host_facts_malformed);
                let (address, port) = (for_log(address.as_deref()), for_log(port.as_deref()));
                host::log(LogLevel::Info, &format!("kvroute: upstream.address {address:?} port {port:?} is not an address; ignored"));
            }
            // Envoy's; ngx_wasm_module logs an error for it on every response.
            let details = if c.route_variable.is_none() { host::property(&["response", "code_details"]) } else { None };
            let upstream = upstream_failure(&self.address, served, status, details.as_deref());
            let reports = t.on_headers(status, end_of_stream, host::now_ms(), upstream);
            self.queue(reports);
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let tail = self.shared.config.response_tail_bytes;
        if let Some(t) = self.tracker.as_mut() {
            if t.wants_head() && body_size > 0 {
                let head = host::buffer(BufferType::HttpResponseBody, 0, body_size.min(crate::report::HEAD_BYTES)).unwrap_or_default();
                t.on_head(&head);
            }
            let start = body_size.saturating_sub(tail);
            let chunk = if body_size > 0 && t.reads_body() {
                host::buffer(BufferType::HttpResponseBody, start, body_size - start).unwrap_or_default()
            } else {
                Vec::new()
            };
            let reports = t.on_body(body_size, &chunk, end_of_stream, host::now_ms);
            self.queue(reports);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if matches!(self.phase, Phase::Picking { .. }) {
            // The client went away while the pick was in flight: its answer will never be used.
            self.phase = Phase::Idle;
            self.return_carried();
            self.cancel_assignment();
        }
        if let Some(t) = self.tracker.as_mut() {
            if let Some(r) = t.on_log(host::now_ms()) {
                self.queue([r]);
            }
        }
    }
}
