//! The state service's answers for one request: the pick (or, for a stored response, the
//! locate) call sent with the reports riding along, and what comes back applied: a route
//! written where the host routes on it, a wait in the router's queue, a budget's rejection,
//! vLLM's 404 for a conversation that is gone, or a fallback with its reason; an assignment
//! that will not be used is cancelled by its id.

use super::*;

impl HttpFilter {
    /// Sends `pick` (with reports riding along) and waits for its answer.
    pub(super) fn dispatch_pick(&mut self, mut pick: PickRequest, timeout: Duration) -> Action {
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
    pub(super) fn refuse_unanswered(&mut self, reason: FallbackReason) {
        self.phase = Phase::Idle;
        self.cancel_assignment();
        host::increment(self.shared.metrics.admission_unavailable);
        host::log(LogLevel::Info, &format!("kvroute: request {} of tenant {} not admitted: {}", self.meta.request_id, self.meta.tenant, reason.label()));
        host::send_reply(&reply::admission_unavailable(self.api));
    }

    /// Tracks the response of a request the state service recorded (`assignment_id`), so its
    /// outcome is reported: a routed one, or one admitted for the default route.
    pub(super) fn track(&mut self, assignment_id: u64) {
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
    pub(super) fn apply_pick(&mut self, body_size: usize) -> Result<Applied, (FallbackReason, String)> {
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
    pub(super) fn wait_in_queue(&mut self, mut pick: PickRequest, queued: QueuedPick) -> Option<(FallbackReason, String)> {
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
    pub(super) fn start_locate(&mut self, response_id: &str) -> Action {
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
    pub(super) fn apply_locate(&mut self, body_size: usize, response_id: &str) -> Result<Option<Reply>, (FallbackReason, String)> {
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
    pub(super) fn apply_route(&self, route: &crate::decision::Route) {
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
    pub(super) fn cancel_assignment(&self) {
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
    pub(super) fn return_carried(&mut self) {
        if self.carried.is_empty() {
            return;
        }
        let carried = std::mem::take(&mut self.carried);
        let Ok(mut q) = self.shared.reports.try_borrow_mut() else { return };
        host::add(self.shared.metrics.reports_dropped, q.requeue(carried));
    }

    pub(super) fn queue(&self, reports: impl IntoIterator<Item = Report>) {
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
        if let (Err((reason, detail)), Some((pick, deadline_ms)), true) = (&applied, in_flight, self.resent < MAX_RESENDS) {
            let left = Duration::from_secs_f64(((deadline_ms - host::now_ms()) / 1000.0).max(0.0));
            if let Some(timeout) = pick_retry(*reason, left) {
                host::increment(self.shared.metrics.pick_retries);
                host::log(LogLevel::Debug, &format!("kvroute: request {}: pick refused{detail}, sent once more", self.meta.request_id));
                self.resent += 1;
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
