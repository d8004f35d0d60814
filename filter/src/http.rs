//! The per-request HTTP context: strip client routing headers, hold LLM requests until their
//! body is in, ask the state service for a worker, apply the answer (or fall back), and report
//! the response's first token / completion / cancellation. Decisions are made by the pure
//! functions in `decision.rs` and `report.rs`; this file only talks to the host.
//!
//! Invariant: every path out of a paused state resumes the request exactly once, and any
//! failure resumes it toward the route's default upstream with a counted reason.

use crate::decision::{
    build_pick, classify_pick_status, degraded_label, headers_to_strip, is_success, route_from_pick, pick_retry, FallbackReason,
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
    /// The pick in flight is the second try.
    resent: bool,
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
            resent: false,
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

    /// Sends `pick` (with reports riding along) and waits for its answer.
    fn dispatch_pick(&mut self, mut pick: PickRequest, timeout: Duration) -> Action {
        let c = &self.shared.config;
        pick.reports = self.shared.reports.try_borrow_mut().map(|mut q| q.take(REPORTS_PER_PICK)).unwrap_or_default();
        let encoded = pick.encode_to_vec();
        self.carried = std::mem::take(&mut pick.reports);
        let deadline = timeout.as_millis().to_string();
        let mut extra: Vec<(&str, &str)> = vec![("x-kvroute-deadline-ms", deadline.as_str())];
        if !self.meta.request_id.is_empty() {
            extra.push(("x-request-id", self.meta.request_id.as_str()));
        }
        match host::post(c, &c.pick_path, &encoded, timeout, &extra) {
            Ok(token) => {
                host::increment(self.shared.metrics.picks);
                let now = host::now_ms();
                self.phase = Phase::Picking { token, sent_ms: now };
                self.resend = Some((pick, now + timeout.as_secs_f64() * 1000.0));
                Action::Pause
            }
            Err(status) => {
                self.return_carried();
                if self.admission.refuses_unanswered(&self.meta) {
                    self.refuse_unanswered(FallbackReason::DispatchFailed);
                    return Action::Pause;
                }
                self.fall_back(FallbackReason::DispatchFailed, &format!(": {status:?}"))
            }
        }
    }

    /// The state service gave no answer for a request its route's budgets must admit: 503.
    fn refuse_unanswered(&mut self, reason: FallbackReason) {
        self.phase = Phase::Idle;
        self.cancel_assignment();
        host::increment(self.shared.metrics.admission_unavailable);
        host::log(LogLevel::Info, &format!("kvroute: request {} of tenant {} not admitted: {}", self.meta.request_id, self.meta.tenant, reason.label()));
        host::send_reply(&reply::admission_unavailable(self.api));
    }

    /// Tracks the response of a request the state service recorded (`assignment_id`), so its
    /// outcome is reported: a routed one, or one admitted for the default route.
    fn track(&mut self, assignment_id: u64) {
        let tail = self.shared.config.response_tail_bytes;
        let responses = self.api == Some(Api::Responses);
        self.tracker = Some(
            ResponseTracker::new(assignment_id, host::now_ms(), tail, self.streaming)
                .with_tenant(&self.meta.tenant)
                .capturing_response_id(responses)
                .without_stream_usage(self.stream_usage),
        );
    }

    /// Applies a pick response: `Ok(Some(reply))` when the tenant's budget rejected the
    /// request (the filter answers it), the fallback reason when it cannot be used.
    fn apply_pick(&mut self, body_size: usize) -> Result<Applied, (FallbackReason, String)> {
        let status = host::header(MapType::HttpCallResponseHeaders, ":status");
        // A non-2xx answer is never read for a reason: the state service says "unknown model"
        // (and every other why) in a 200's `degraded_reason`, so the status alone classifies.
        if !is_success(status.as_deref()) {
            return Err(pick_failure(status.as_deref()));
        }
        let body = host::buffer(BufferType::HttpCallResponseBody, 0, body_size).unwrap_or_default();
        let resp = PickResponse::decode(body.as_slice()).map_err(|e| (FallbackReason::PickDecode, format!(": {e}")))?;
        // A service from before `PickRequest.reports` answers 0: they go again in a batch.
        if resp.reports_applied as usize >= self.carried.len() {
            host::add(self.shared.metrics.reports_sent, self.carried.len() as u64);
            self.carried.clear();
        }
        if let Some(queued) = resp.queued {
            return Ok(Applied::Queued(queued));
        }
        if let Some(rejection) = &resp.rejection {
            host::increment(self.shared.metrics.rejected);
            host::log(LogLevel::Info, &format!("kvroute: request {} of tenant {} rejected: {}", self.meta.request_id, self.meta.tenant, rejection.message));
            return Ok(Applied::Answered(reply::rejected(self.api, rejection)));
        }
        if matches!(resp.degraded_reason(), DegradedReason::DegradedResponseOwnerGone | DegradedReason::DegradedResponseNotFound) {
            // The conversation it continues was stored by a worker that is gone, or is another
            // tenant's: vLLM's 404, as if it did not exist.
            return Ok(Applied::Answered(reply::response_not_found(&self.previous_response_id)));
        }
        if self.unread != UnreadBody::UnreadNone || resp.worker_id.is_empty() {
            // The default route takes it; admitted under a budget, its outcome is reported.
            if resp.assignment_id != 0 {
                self.track(resp.assignment_id);
            }
            let reason = match self.unread {
                UnreadBody::UnreadNone => FallbackReason::from_degraded(resp.degraded_reason),
                unread => crate::admission::fallback_reason(unread),
            };
            return Err((reason, format!(": {}", degraded_label(resp.degraded_reason))));
        }
        let route =
            route_from_pick(&self.shared.config, &resp, self.meta.trusted).map_err(|r| (r, format!(": {}", degraded_label(resp.degraded_reason))))?;
        self.apply_route(&route);
        if route.assignment_id != 0 {
            self.track(route.assignment_id);
        }
        self.decision = Some(route.decision);
        self.address = route.address;
        Ok(Applied::Routed)
    }

    /// The state service holds the pick in its queue: asks again with its ticket (see
    /// [`queue_call_timeout`]). `Some(why)` when the request has waited too long: it is then
    /// an unanswered pick like any other (admission decides whether it may fall back).
    fn wait_in_queue(&mut self, mut pick: PickRequest, queued: QueuedPick) -> Option<(FallbackReason, String)> {
        let now = host::now_ms();
        let waited = (now - *self.queued_since_ms.get_or_insert(now)).max(0.0);
        let Some(timeout) = queue_call_timeout(&queued, waited, self.shared.config.pick_timeout) else {
            return Some((FallbackReason::PickTimeout, format!(": queued {waited:.0} ms")));
        };
        host::increment(self.shared.metrics.pick_waits);
        host::log(LogLevel::Debug, &format!("kvroute: request {} waits in the queue ({} ahead)", self.meta.request_id, queued.ahead));
        pick.ticket = queued.ticket;
        pick.queued_ms = waited as u32;
        if self.dispatch_pick(pick, timeout) == Action::Continue {
            host::resume_request();
        }
        None
    }

    /// A stored response's `GET` / `DELETE` / cancel: asks the state service where it lives.
    fn start_locate(&mut self, response_id: &str) -> Action {
        let c = &self.shared.config;
        let body = LocateRequest { response_id: response_id.to_string(), request_id: self.meta.request_id.clone(), tenant: self.meta.tenant.clone() }
            .encode_to_vec();
        let deadline = c.affinity_timeout.as_millis().to_string();
        match host::post(c, &c.locate_path, &body, c.affinity_timeout, &[("x-kvroute-deadline-ms", deadline.as_str())]) {
            Ok(token) => {
                self.phase = Phase::Locating { token, response_id: response_id.to_string() };
                Action::Pause
            }
            Err(status) => {
                self.fall_back(FallbackReason::DispatchFailed, &format!(": {status:?}"))
            }
        }
    }

    /// Routes a located response's request to its worker (`Ok(None)`), answers vLLM's 404 when
    /// its worker is gone, or leaves an unknown one to the default route (whose worker answers
    /// the same 404 itself).
    fn apply_locate(&mut self, body_size: usize, response_id: &str) -> Result<Option<Reply>, (FallbackReason, String)> {
        let status = host::header(MapType::HttpCallResponseHeaders, ":status");
        if !is_success(status.as_deref()) {
            return Err(pick_failure(status.as_deref()));
        }
        let body = host::buffer(BufferType::HttpCallResponseBody, 0, body_size).unwrap_or_default();
        let resp = PickResponse::decode(body.as_slice()).map_err(|e| (FallbackReason::PickDecode, format!(": {e}")))?;
        if matches!(resp.degraded_reason(), DegradedReason::DegradedResponseOwnerGone | DegradedReason::DegradedResponseNotFound) {
            return Ok(Some(reply::response_not_found(response_id)));
        }
        if resp.worker_id.is_empty() {
            return Ok(None);
        }
        let route = route_from_pick(&self.shared.config, &resp, false).map_err(|r| (r, String::new()))?;
        self.apply_route(&route);
        Ok(None)
    }

    /// Writes the decision where the host routes on it: the route header (Envoy: then the
    /// route is selected again), or the configured NGINX variable (the chosen target alone:
    /// `proxy_pass` takes one).
    fn apply_route(&self, route: &crate::decision::Route) {
        match &self.shared.config.route_variable {
            Some(var) => {
                let target = route.value.split(',').next().unwrap_or_default();
                host::set_property(&["ngx", var], target);
            }
            None => {
                host::set_header(MapType::HttpRequestHeaders, &route.header, Some(&route.value));
                if !self.meta.pool.is_empty() {
                    // A retry moves down the override list, then to the cluster's fallback
                    // policy, which may pick any worker: a pool's request retries only within
                    // its list (the state service lists its pool's workers alone).
                    let retries = route.value.split(',').count().saturating_sub(1).to_string();
                    host::set_header(MapType::HttpRequestHeaders, "x-envoy-max-retries", Some(&retries));
                }
                if let Some(bound) = self.shared.config.first_byte_timeout.filter(|_| self.streaming) {
                    // Ends when the response head arrives: moves a stream off a frozen worker
                    // before anything reached the client, never one that has started.
                    host::set_header(MapType::HttpRequestHeaders, PER_TRY_TIMEOUT_HEADER, Some(&bound.as_millis().to_string()));
                }
                host::clear_route_cache();
            }
        }
        host::increment(self.shared.metrics.routed);
    }

    /// The state service may hold (or be about to record) an assignment for this request that
    /// will never be used: cancel it by the id this filter named.
    fn cancel_assignment(&self) {
        if self.meta.assignment_id != 0 {
            self.queue([Report {
                assignment_id: self.meta.assignment_id,
                kind: ReportKind::ReportCancel as i32,
                tenant: self.meta.tenant.clone(),
                ..Report::default()
            }]);
        }
    }

    /// The carried reports whose delivery the pick's answer did not confirm go back in the queue.
    fn return_carried(&mut self) {
        if self.carried.is_empty() {
            return;
        }
        let carried = std::mem::take(&mut self.carried);
        let Ok(mut q) = self.shared.reports.try_borrow_mut() else { return };
        host::add(self.shared.metrics.reports_dropped, q.requeue(carried));
    }

    fn queue(&self, reports: impl IntoIterator<Item = Report>) {
        let Ok(mut q) = self.shared.reports.try_borrow_mut() else { return };
        for r in reports {
            if !q.push(r) {
                host::increment(self.shared.metrics.reports_dropped);
            }
        }
    }
}

impl Context for HttpFilter {
    fn on_http_call_response(&mut self, token: u32, _headers: usize, body_size: usize, _trailers: usize) {
        if let Phase::Locating { token: expected, response_id } = &self.phase {
            if token != *expected {
                return;
            }
            let response_id = response_id.clone();
            self.phase = Phase::Idle;
            match self.apply_locate(body_size, &response_id) {
                Ok(Some(reply)) => return host::send_reply(&reply),
                Ok(None) => {}
                Err((reason, detail)) => {
                    if self.fall_back(reason, &detail) == Action::Pause {
                        return;
                    }
                }
            }
            return host::resume_request();
        }
        let Phase::Picking { token: expected, sent_ms } = self.phase else { return };
        if token != expected {
            return;
        }
        self.phase = Phase::Idle;
        let elapsed = (host::now_ms() - sent_ms).max(0.0);
        host::record(self.shared.metrics.pick_latency_us, (elapsed * 1000.0).round() as u64);
        let applied = self.apply_pick(body_size);
        self.return_carried();
        let (applied, in_flight) = match (applied, self.resend.take()) {
            (Ok(Applied::Queued(queued)), Some((pick, _))) => match self.wait_in_queue(pick, queued) {
                None => return,
                Some(gave_up) => (Err(gave_up), None),
            },
            // Every call keeps its pick, so this cannot happen; if it did, it is unanswered.
            (Ok(Applied::Queued(_)), None) => (Err((FallbackReason::PickDecode, ": queued pick lost".to_string())), None),
            other => other,
        };
        if let (Err((reason, detail)), Some((pick, deadline_ms)), false) = (&applied, in_flight, self.resent) {
            let left = Duration::from_secs_f64(((deadline_ms - host::now_ms()) / 1000.0).max(0.0));
            if let Some(timeout) = pick_retry(*reason, left) {
                host::increment(self.shared.metrics.pick_retries);
                host::log(LogLevel::Debug, &format!("kvroute: request {}: pick refused{detail}, sent once more", self.meta.request_id));
                self.resent = true;
                if self.dispatch_pick(pick, timeout) == Action::Continue {
                    host::resume_request();
                }
                return;
            }
        }
        match applied {
            // Answered here: the request goes nowhere.
            Ok(Applied::Answered(reply)) => return host::send_reply(&reply),
            // (A queued answer was sent again or turned into an error above.)
            Ok(Applied::Routed | Applied::Queued(_)) => {}
            Err((reason, _)) if crate::admission::unanswered(reason) && self.admission.refuses_unanswered(&self.meta) => {
                return self.refuse_unanswered(reason);
            }
            Err((reason, detail)) => {
                if self.fall_back(reason, &detail) == Action::Pause {
                    return;
                }
            }
        }
        host::resume_request();
    }
}

/// Why a pick or locate call did not answer 2xx, and the detail to log.
fn pick_failure(status: Option<&str>) -> (FallbackReason, String) {
    let dispatch = if status.is_none() { host::header(MapType::HttpCallResponseHeaders, ":dispatch_status") } else { None };
    let detail = match (status, &dispatch) {
        (Some(s), _) => format!(": status {s}"),
        (None, Some(d)) => format!(": status none ({d})"),
        (None, None) => ": status none".to_string(),
    };
    (classify_pick_status(status, dispatch.as_deref()), detail)
}

/// Envoy's per-try timeout for this request (ms), in effect until the response head arrives.
const PER_TRY_TIMEOUT_HEADER: &str = "x-envoy-upstream-rq-per-try-timeout-ms";

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
