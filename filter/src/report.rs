//! First-token / complete / cancel reports: a per-request tracker that turns response events
//! into reports, and a bounded queue that batches them for one `POST /v1/report` per flush.
//!
//! Reports never sit on a request's critical path: HTTP contexts only push into the queue
//! (shared through an `Rc` with the root context of the same VM; a VM is single-threaded). A
//! pick takes up to [`REPORTS_PER_PICK`] of them along (`PickRequest.reports`), and the root
//! context's tick sends whatever is still pending: under load the picks carry every report
//! and the proxy makes no report call of its own, which was most of what routing cost Envoy's
//! CPU per request (tests/LATENCY.md). When the state service is away the queue drops its
//! oldest entries past `max_pending` (the service frees unreported assignments by TTL).

use crate::usage::{parse_usage, Tail};
use kvroute_core::wire::{Report, ReportBatch, ReportKind, UpstreamFailure};
use prost::Message;
use std::collections::VecDeque;

/// Pending reports of one VM.
#[derive(Debug)]
pub struct ReportQueue {
    pending: VecDeque<Report>,
    max_pending: usize,
    max_batch: usize,
    dropped: u64,
}

impl ReportQueue {
    pub fn new(max_pending: usize, max_batch: usize) -> ReportQueue {
        ReportQueue { pending: VecDeque::new(), max_pending: max_pending.max(1), max_batch: max_batch.max(1), dropped: 0 }
    }

    /// Queues a report; returns false when an older one had to be dropped to make room.
    pub fn push(&mut self, report: Report) -> bool {
        let mut kept_all = true;
        while self.pending.len() >= self.max_pending {
            self.pending.pop_front();
            self.dropped += 1;
            kept_all = false;
        }
        self.pending.push_back(report);
        kept_all
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Removes up to `max_batch` reports and encodes them as one ReportBatch.
    pub fn take_batch(&mut self) -> Option<(usize, Vec<u8>)> {
        let reports = self.take(self.max_batch);
        if reports.is_empty() {
            return None;
        }
        Some((reports.len(), ReportBatch { reports }.encode_to_vec()))
    }

    /// Removes up to `max` of the oldest reports (for a pick to carry).
    pub fn take(&mut self, max: usize) -> Vec<Report> {
        let n = self.pending.len().min(max);
        self.pending.drain(..n).collect()
    }

    /// Puts back reports whose delivery is not confirmed, ahead of newer ones (reports are
    /// idempotent at the state service, so one that did arrive is only counted a duplicate).
    /// Past `max_pending` the oldest are dropped, as in [`ReportQueue::push`]; returns how many.
    pub fn requeue(&mut self, reports: Vec<Report>) -> u64 {
        for r in reports.into_iter().rev() {
            self.pending.push_front(r);
        }
        let mut dropped = 0;
        while self.pending.len() > self.max_pending {
            self.pending.pop_front();
            dropped += 1;
        }
        self.dropped += dropped;
        dropped
    }
}

/// How many pending reports a pick carries at most: enough for the two reports per request a
/// busy proxy produces between its picks, few enough not to slow the pick itself.
pub const REPORTS_PER_PICK: usize = 32;

/// The response side of one routed request: decides which reports it produces.
#[derive(Debug)]
pub struct ResponseTracker {
    assignment_id: u64,
    /// Host time (ms) when the request was resumed toward the worker.
    started_ms: f64,
    status: u32,
    /// The request asked for a stream (see [`ResponseTracker::on_body`]).
    streaming: bool,
    first_token: bool,
    done: bool,
    tail: Tail,
    /// What happened to the chosen worker, told once: on the first report after the headers.
    upstream: Option<(UpstreamFailure, String)>,
    /// The request's tenant, in every report (budgets settle by it).
    tenant: String,
    /// Responses API: the response's id, read from the body's first bytes (a JSON body's
    /// top-level `id`, a stream's `response.created` event); in every report once known.
    capture_id: bool,
    response_id: String,
    /// Whether body bytes are read at all: a non-streamed body (usage at its end), a stream
    /// that ends with a usage event, or a Responses API body (its id in its first bytes).
    /// Reading a chunk costs the proxy a host call per SSE event; a stream without usage is
    /// only counted.
    reads_body: bool,
    /// Token deltas seen in a streamed body (`"delta"` keys: one per OpenAI chunk, one per
    /// Anthropic content delta): what a stream cancelled before its usage cost, and the
    /// completion count of a stream that never sent usage.
    streamed: u32,
}

impl ResponseTracker {
    pub fn new(assignment_id: u64, started_ms: f64, tail_bytes: usize, streaming: bool) -> ResponseTracker {
        ResponseTracker {
            assignment_id,
            started_ms,
            status: 0,
            streaming,
            first_token: false,
            done: false,
            tail: Tail::new(tail_bytes),
            upstream: None,
            tenant: String::new(),
            capture_id: false,
            response_id: String::new(),
            streamed: 0,
            reads_body: true,
        }
    }

    /// A stream that carries no usage (see `kvroute_core::request::PromptRequest::stream_usage`):
    /// its chunks are counted (one per token as vLLM streams), never read.
    pub fn without_stream_usage(self, stream_usage: bool) -> ResponseTracker {
        let reads_body = !self.streaming || stream_usage || self.capture_id;
        ResponseTracker { reads_body, ..self }
    }

    /// Whether the next body chunk's bytes should be read (`on_body` gets them); when not,
    /// `on_body` gets an empty slice and the chunk's length.
    pub fn reads_body(&self) -> bool {
        self.reads_body && !self.done
    }

    /// Read the response id from the body's first bytes (a Responses API request).
    pub fn capturing_response_id(self, capture: bool) -> ResponseTracker {
        ResponseTracker { capture_id: capture, ..self }
    }

    /// Whether the next body callback should hand [`ResponseTracker::on_head`] the body's first
    /// bytes ([`HEAD_BYTES`] at most).
    pub fn wants_head(&self) -> bool {
        self.capture_id && self.response_id.is_empty() && !self.done && !self.first_token
    }

    /// The body's first bytes (before the chunk they begin is passed to `on_body`).
    pub fn on_head(&mut self, head: &[u8]) {
        if let Some(id) = response_id(head) {
            self.response_id = id;
        }
    }

    pub fn with_tenant(self, tenant: &str) -> ResponseTracker {
        ResponseTracker { tenant: tenant.to_string(), ..self }
    }

    fn report(&mut self, kind: ReportKind, now_ms: f64) -> Report {
        let (failure, served_by) = self.upstream.take().unwrap_or((UpstreamFailure::UpstreamOk, String::new()));
        Report {
            assignment_id: self.assignment_id,
            kind: kind as i32,
            elapsed_ms: (now_ms - self.started_ms).max(0.0),
            status: self.status,
            upstream_failure: failure as i32,
            served_by,
            tenant: self.tenant.clone(),
            response_id: self.response_id.clone(),
            streaming: self.streaming,
            ..Report::default()
        }
    }

    /// Response headers arrived (`upstream`: what happened to the chosen worker, from
    /// [`crate::decision::upstream_failure`]); a header-only response is complete at once.
    pub fn on_headers(&mut self, status: Option<u32>, end_of_stream: bool, now_ms: f64, upstream: (UpstreamFailure, String)) -> Vec<Report> {
        self.status = status.unwrap_or(0);
        if upstream.0 != UpstreamFailure::UpstreamOk || !upstream.1.is_empty() {
            self.upstream = Some(upstream);
        }
        if end_of_stream {
            return self.finish(now_ms);
        }
        Vec::new()
    }

    /// A body chunk (`chunk` holds at most its last tail-size bytes; `len` is its full size).
    ///
    /// The first non-empty chunk is the first token, for every API and framing vLLM 0.33
    /// streams. Its API server sends response headers at once but no body byte before the
    /// engine's first `RequestOutput`, and the V1 scheduler emits an output for a request only
    /// with new token ids (or when it stops), i.e. after prefill sampled the first token:
    /// - OpenAI chat (`chat_completion/serving.py`): the `role` chunk (`content: ""`) is written
    ///   inside `async for res in result_generator`, on the first output, together with that
    ///   output's content chunk;
    /// - Anthropic `/v1/messages` (`anthropic/serving.py`): `event: message_start` is written
    ///   when the first OpenAI chunk (that role chunk) arrives, so on the same output; there
    ///   are no `ping` events;
    /// - completions: the first chunk carries the first token's text.
    ///
    /// Waiting for the first `content_block_delta` or non-empty `delta.content` instead would
    /// be late whenever a reasoning or tool parser holds tokens back (`<think>`, a tool-call
    /// prefix): the engine's first token, which is what the state service's TTFT model
    /// predicts, is the first byte. The one stream whose first bytes are not a token is an
    /// error before any output (`event: error` / `data: {"error": ...}`); its complete report
    /// carries the outcome.
    ///
    /// A non-streamed response's first byte is sent when generation is over, so its time is
    /// not a TTFT: the first-token report then carries `elapsed_ms = 0` ("unknown", which the
    /// state service does not feed to its TTFT calibration) and still tells it prefill is
    /// done. Reporting the completion time would teach the calibration that a worker answering
    /// long non-streamed requests is slow to first token.
    ///
    /// `clock` gives the host time (ms); it is asked only when a report is made, so the chunks
    /// between the first and the last cost no host call for it.
    pub fn on_body(&mut self, len: usize, chunk: &[u8], end_of_stream: bool, clock: impl FnOnce() -> f64) -> Vec<Report> {
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        self.tail.push(chunk);
        if self.streaming {
            let deltas = if self.reads_body { count(chunk, b"\"delta\"") } else { u32::from(len > 0) };
            self.streamed = self.streamed.saturating_add(deltas);
        }
        let first = len > 0 && !self.first_token;
        if !first && !end_of_stream {
            return out;
        }
        let now_ms = clock();
        if first {
            self.first_token = true;
            let mut r = self.report(ReportKind::ReportFirstToken, now_ms);
            if !self.streaming {
                r.elapsed_ms = 0.0;
            }
            out.push(r);
        }
        if end_of_stream {
            out.extend(self.finish(now_ms));
        }
        out
    }

    fn finish(&mut self, now_ms: f64) -> Vec<Report> {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        let mut r = self.report(ReportKind::ReportComplete, now_ms);
        if let Some(u) = parse_usage(&self.tail.to_vec()) {
            r.prompt_tokens = u.prompt_tokens;
            r.completion_tokens = u.completion_tokens;
            r.cached_tokens = u.cached_tokens;
        }
        if r.completion_tokens == 0 {
            r.completion_tokens = self.streamed;
        }
        vec![r]
    }

    /// The stream is over (access-log time): anything not completed was cancelled.
    pub fn on_log(&mut self, now_ms: f64) -> Option<Report> {
        if self.done {
            return None;
        }
        self.done = true;
        let mut r = self.report(ReportKind::ReportCancel, now_ms);
        r.completion_tokens = self.streamed;
        // The request reached a worker (a tracker exists only once it was forwarded): the
        // engine may have done its work.
        r.forwarded = true;
        Some(r)
    }
}

/// How much of a body's beginning is searched for a response id.
pub const HEAD_BYTES: usize = 4096;

/// The first `"id": "..."` of a body's first bytes: a Responses API JSON body's top-level
/// `id` (vLLM dumps it first), or the `response.id` of a stream's first event
/// (`response.created`, whose `response` object starts with its id).
pub fn response_id(head: &[u8]) -> Option<String> {
    let head = head.get(..head.len().min(HEAD_BYTES))?;
    let at = head.windows(4).position(|w| w == b"\"id\"")?;
    let rest = head.get(at + 4..)?;
    let rest = rest.get(rest.iter().position(|b| !b.is_ascii_whitespace())?..)?;
    let rest = rest.strip_prefix(b":")?;
    let rest = rest.get(rest.iter().position(|b| !b.is_ascii_whitespace())?..)?;
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest.iter().position(|b| *b == b'"')?;
    let id = std::str::from_utf8(rest.get(..end)?).ok()?;
    let ok = !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    ok.then(|| id.to_string())
}

/// Occurrences of `needle` in `hay` (non-overlapping).
fn count(hay: &[u8], needle: &[u8]) -> u32 {
    if needle.is_empty() {
        return 0;
    }
    let mut n = 0u32;
    let mut rest = hay;
    while let Some(at) = rest.windows(needle.len()).position(|w| w == needle) {
        n = n.saturating_add(1);
        rest = rest.get(at + needle.len()..).unwrap_or_default();
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(rs: &[Report]) -> Vec<i32> {
        rs.iter().map(|r| r.kind).collect()
    }

    fn ok() -> (UpstreamFailure, String) {
        (UpstreamFailure::UpstreamOk, String::new())
    }

    #[test]
    fn a_failover_is_told_once_with_who_answered() {
        let mut t = ResponseTracker::new(5, 0.0, 64, true);
        t.on_headers(Some(200), false, 1.0, (UpstreamFailure::UpstreamFailedOver, "127.0.0.1:2".into()));
        let first = t.on_body(4, b"data", false, || 2.0);
        assert_eq!((first[0].upstream_failure, first[0].served_by.as_str()), (UpstreamFailure::UpstreamFailedOver as i32, "127.0.0.1:2"));
        let done = t.on_body(4, b"data", true, || 3.0);
        assert_eq!((done[0].upstream_failure, done[0].served_by.as_str()), (0, ""));
        let mut refused = ResponseTracker::new(6, 0.0, 64, false);
        let r = refused.on_headers(Some(503), true, 1.0, (UpstreamFailure::UpstreamConnectFailure, String::new()));
        assert_eq!(r[0].upstream_failure, UpstreamFailure::UpstreamConnectFailure as i32);
    }

    #[test]
    fn streaming_response_reports_first_token_then_complete_with_usage() {
        let mut t = ResponseTracker::new(9, 100.0, 1024, true);
        assert!(t.on_headers(Some(200), false, 101.0, ok()).is_empty());
        let r = t.on_body(0, b"", false, || 102.0);
        assert!(r.is_empty(), "an empty chunk is not a token");
        let r = t.on_body(10, b"data: {}\n\n", false, || 130.0);
        assert_eq!(kinds(&r), vec![ReportKind::ReportFirstToken as i32]);
        assert_eq!((r[0].assignment_id, r[0].elapsed_ms, r[0].status), (9, 30.0, 200));
        let last = b"data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
        let r = t.on_body(last.len(), last, true, || 150.0);
        assert_eq!(kinds(&r), vec![ReportKind::ReportComplete as i32]);
        assert_eq!((r[0].prompt_tokens, r[0].completion_tokens, r[0].elapsed_ms), (5, 2, 50.0));
        assert_eq!(t.on_log(160.0), None);
    }

    #[test]
    fn single_chunk_body_reports_both_and_header_only_completes() {
        let mut t = ResponseTracker::new(1, 0.0, 64, false);
        t.on_headers(Some(200), false, 1.0, ok());
        let r = t.on_body(3, b"abc", true, || 5.0);
        assert_eq!(kinds(&r), vec![1, 2]);
        assert_eq!((r[0].elapsed_ms, r[1].elapsed_ms), (0.0, 5.0), "a non-streamed body's first byte is no TTFT");
        let mut h = ResponseTracker::new(2, 0.0, 64, false);
        assert_eq!(kinds(&h.on_headers(Some(500), true, 1.0, ok())), vec![ReportKind::ReportComplete as i32]);
    }

    #[test]
    fn a_cancelled_stream_reports_what_it_streamed_and_its_tenant() {
        let mut t = ResponseTracker::new(7, 0.0, 1024, true).with_tenant("team");
        t.on_headers(Some(200), false, 1.0, ok());
        let chunk = br#"data: {"choices":[{"delta":{"content":"a"}}]}

data: {"choices":[{"delta":{"content":"b"}}]}

"#;
        let first = t.on_body(chunk.len(), chunk, false, || 2.0);
        assert_eq!(first[0].tenant, "team");
        t.on_body(chunk.len(), chunk, false, || 3.0);
        let cancel = t.on_log(4.0).unwrap();
        assert_eq!((cancel.kind, cancel.completion_tokens, cancel.tenant.as_str()), (ReportKind::ReportCancel as i32, 4, "team"));
    }

    #[test]
    fn a_stream_without_usage_is_counted_not_read() {
        let mut t = ResponseTracker::new(5, 0.0, 1024, true).without_stream_usage(false);
        assert!(!t.reads_body());
        t.on_headers(Some(200), false, 1.0, ok());
        assert_eq!(kinds(&t.on_body(120, &[], false, || 2.0)), vec![ReportKind::ReportFirstToken as i32]);
        // A chunk between the first and the last makes no report: it asks no time of the host.
        t.on_body(118, &[], false, || panic!("the clock is read only for a report"));
        let done = t.on_body(0, &[], true, || 4.0);
        assert_eq!((done[0].kind, done[0].completion_tokens), (ReportKind::ReportComplete as i32, 2), "two chunks, two tokens");
        assert!(ResponseTracker::new(5, 0.0, 1024, false).without_stream_usage(false).reads_body(), "a JSON body ends with its usage");
        assert!(ResponseTracker::new(5, 0.0, 1024, true).without_stream_usage(true).reads_body());
    }

    #[test]
    fn response_ids_come_from_the_first_bytes_and_ride_on_every_report() {
        assert_eq!(response_id(br#"{"id":"resp_abc123","created_at":1,"object":"response"}"#).as_deref(), Some("resp_abc123"));
        let stream = b"event: response.created\ndata: {\"response\": {\"id\": \"resp_9\", \"output\": []}, \"type\": \"response.created\"}\n\n";
        assert_eq!(response_id(stream).as_deref(), Some("resp_9"));
        assert_eq!(response_id(br#"{"error":{"message":"x"}}"#), None);
        assert_eq!(response_id(br#"{"id":"has space"}"#), None);
        let mut t = ResponseTracker::new(3, 0.0, 1024, true).capturing_response_id(true);
        assert!(t.wants_head());
        t.on_head(stream);
        assert!(!t.wants_head());
        let first = t.on_body(stream.len(), stream, false, || 1.0);
        assert_eq!(first[0].response_id, "resp_9");
        assert_eq!(t.on_body(0, b"", true, || 2.0)[0].response_id, "resp_9", "the complete report too");
    }

    #[test]
    fn abort_before_completion_is_a_cancel() {
        let mut t = ResponseTracker::new(3, 0.0, 64, true);
        t.on_headers(Some(200), false, 1.0, ok());
        t.on_body(4, b"data", false, || 2.0);
        let c = t.on_log(9.0).unwrap();
        assert_eq!((c.kind, c.elapsed_ms), (ReportKind::ReportCancel as i32, 9.0));
        assert_eq!(t.on_log(10.0), None);
        let mut never = ResponseTracker::new(4, 0.0, 64, true);
        assert_eq!(never.on_log(1.0).map(|r| r.status), Some(0));
    }

    #[test]
    fn queue_batches_and_bounds() {
        let mut q = ReportQueue::new(3, 2);
        for id in 1..=4 {
            q.push(Report { assignment_id: id, ..Report::default() });
        }
        assert_eq!((q.len(), q.dropped()), (3, 1));
        let (n, bytes) = q.take_batch().unwrap();
        let batch = ReportBatch::decode(bytes.as_slice()).unwrap();
        assert_eq!(n, 2);
        assert_eq!(batch.reports.iter().map(|r| r.assignment_id).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(q.take_batch().map(|(n, _)| n), Some(1));
        assert!(q.take_batch().is_none() && q.is_empty());
    }

    #[test]
    fn a_pick_carries_the_oldest_and_gives_back_what_was_not_confirmed() {
        let ids = |rs: &[Report]| rs.iter().map(|r| r.assignment_id).collect::<Vec<_>>();
        let mut q = ReportQueue::new(4, 8);
        for id in 1..=3 {
            q.push(Report { assignment_id: id, ..Report::default() });
        }
        let carried = q.take(2);
        assert_eq!(ids(&carried), vec![1, 2]);
        q.push(Report { assignment_id: 4, ..Report::default() });
        q.push(Report { assignment_id: 5, ..Report::default() });
        // Back ahead of the newer ones; over max_pending the oldest go.
        assert_eq!(q.requeue(carried), 1);
        assert_eq!((q.len(), q.dropped()), (4, 1));
        let (_, bytes) = q.take_batch().unwrap();
        assert_eq!(ids(&ReportBatch::decode(bytes.as_slice()).unwrap().reports), vec![2, 3, 4, 5]);
        assert!(q.take(REPORTS_PER_PICK).is_empty());
    }
}
