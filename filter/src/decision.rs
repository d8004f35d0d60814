//! The request-path decisions, as pure functions: which client headers to strip, what to ask
//! the state service, and what its answer means for this request (a route, or a fallback with a
//! reason). The proxy-wasm glue in `http.rs` only moves bytes between Envoy and these.

use crate::config::{Cidr, Config, RoutingMode, OWN_HEADER_PREFIX};
use kvroute_core::keys::{text_chunk_keys, token_block_keys, KeyRoot};
use kvroute_core::request::{Prompt, PromptRequest};
use kvroute_core::wire::{DegradedReason, PickRequest, PickResponse, TokenizationPath};
use std::time::Duration;

/// Why a request went to the route's default upstream instead of a picked worker. Every
/// variant has a counter (`kvroute_fallback_<label>`) and is named in `x-kvroute-fallback`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FallbackReason {
    /// The LLM request had no body.
    NoBody,
    /// The body was larger than `max_body_bytes`; it was not inspected.
    BodyTooLarge,
    /// The body was not a request kvroute understands (bad JSON, missing model, ...).
    Unparsable,
    /// `dispatch_http_call` to the state service failed (unknown cluster, no host).
    DispatchFailed,
    /// The state service could not be reached (Envoy answered 502/503: no host, connection
    /// refused, reset).
    PickUnavailable,
    /// The pick took longer than `pick_timeout_ms` (Envoy answered 504).
    PickTimeout,
    /// The state service answered 429: it is shedding picks it cannot decide in time.
    PickOverloaded,
    /// The state service answered with a non-2xx status.
    PickStatus,
    /// The state service answered 2xx with a body that is not a PickResponse.
    PickDecode,
    /// The state service does not serve this model (`DEGRADED_UNKNOWN_MODEL`).
    UnknownModel,
    /// The state service had no healthy worker for the request (`DEGRADED_NO_HEALTHY_WORKER`).
    NoHealthyWorker,
    /// The state service chose no worker for another reason, or one this filter does not
    /// know (a newer state service).
    Degraded,
    /// A worker was picked but it has no address for this routing mode.
    NoTarget,
    /// The pick named an endpoint or cluster outside the configured `allowed_targets`.
    TargetNotAllowed,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 14] = [
        FallbackReason::NoBody,
        FallbackReason::BodyTooLarge,
        FallbackReason::Unparsable,
        FallbackReason::DispatchFailed,
        FallbackReason::PickUnavailable,
        FallbackReason::PickTimeout,
        FallbackReason::PickOverloaded,
        FallbackReason::PickStatus,
        FallbackReason::PickDecode,
        FallbackReason::UnknownModel,
        FallbackReason::NoHealthyWorker,
        FallbackReason::Degraded,
        FallbackReason::NoTarget,
        FallbackReason::TargetNotAllowed,
    ];

    /// Stable label used in the header and the metric name. The two reasons the state service
    /// names are spelled by core, as its own metrics spell them.
    pub fn label(self) -> &'static str {
        match self {
            FallbackReason::NoBody => "no_body",
            FallbackReason::BodyTooLarge => "body_too_large",
            FallbackReason::Unparsable => "unparsable_body",
            FallbackReason::DispatchFailed => "state_unavailable",
            FallbackReason::PickUnavailable => "pick_unavailable",
            FallbackReason::PickTimeout => "pick_timeout",
            FallbackReason::PickOverloaded => "pick_overloaded",
            FallbackReason::PickStatus => "pick_status",
            FallbackReason::PickDecode => "pick_decode",
            FallbackReason::UnknownModel => DegradedReason::DegradedUnknownModel.label(),
            FallbackReason::NoHealthyWorker => DegradedReason::DegradedNoHealthyWorker.label(),
            FallbackReason::Degraded => "degraded",
            FallbackReason::NoTarget => "no_target",
            FallbackReason::TargetNotAllowed => "target_not_allowed",
        }
    }

    /// The fallback for a pick that chose no worker, from the state service's `degraded_reason`.
    pub fn from_degraded(degraded: i32) -> FallbackReason {
        match DegradedReason::try_from(degraded) {
            Ok(DegradedReason::DegradedUnknownModel) => FallbackReason::UnknownModel,
            Ok(DegradedReason::DegradedNoHealthyWorker) => FallbackReason::NoHealthyWorker,
            // Including "none" and values added after this filter was built: no worker is no
            // worker, whatever the reason; the generic label still counts it.
            Ok(_) | Err(_) => FallbackReason::Degraded,
        }
    }

    /// Whether the state service may hold an assignment for this request that nobody will
    /// report: the pick was answered (or may yet be) but its answer is not used.
    pub fn leaves_assignment(self) -> bool {
        matches!(
            self,
            FallbackReason::PickUnavailable
                | FallbackReason::PickTimeout
                | FallbackReason::PickStatus
                | FallbackReason::PickDecode
                | FallbackReason::NoTarget
                | FallbackReason::TargetNotAllowed
        )
    }

    /// Index into [`FallbackReason::ALL`] (for metric handle arrays).
    pub fn index(self) -> usize {
        FallbackReason::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// Request headers to remove before anything else sees the request: kvroute's own, the
/// routing header, configured extras, and each tenant header of an `identity` header source
/// unless `trusted_hop(its ranges)` (the downstream peer is one of them).
pub fn headers_to_strip<'a>(config: &Config, names: impl IntoIterator<Item = &'a str>, trusted_hop: impl Fn(&[Cidr]) -> bool) -> Vec<String> {
    let hops = config.identity.header_sources().chain(config.pools.sources.header_sources());
    let untrusted: Vec<&str> = hops.filter(|(_, ranges)| !trusted_hop(ranges)).map(|(name, _)| name).collect();
    names
        .into_iter()
        .map(str::to_ascii_lowercase)
        .filter(|n| {
            n.starts_with(OWN_HEADER_PREFIX)
                || *n == config.route_header
                || config.strip_headers.iter().any(|s| s == n)
                || untrusted.contains(&n.as_str())
        })
        .collect()
}

/// Per-request facts that are not in the body.
#[derive(Clone, Debug, Default)]
pub struct RequestMeta {
    pub request_id: String,
    pub tenant: String,
    /// The assignment id this filter names for the pick (never 0), so it can cancel the
    /// assignment on every path where the answer is not used.
    pub assignment_id: u64,
    /// The downstream peer may see the decision's details (`trusted_sources`).
    pub trusted: bool,
    /// The route's service class (`admission.service_class`), for the state service's queue.
    pub service_class: String,
    /// The pool it must be placed in (the route's, or the sensitivity classifier's).
    pub pool: String,
}

/// The pick request for a parsed LLM request.
pub fn build_pick(config: &Config, req: &PromptRequest, meta: &RequestMeta) -> PickRequest {
    let block_size = config.block_size_for(&req.model);
    let root = KeyRoot::new(&req.model, &req.cache_salt);
    let mut pick = PickRequest {
        request_id: meta.request_id.clone(),
        model: req.model.clone(),
        cache_salt: req.cache_salt.clone(),
        endpoint: req.api.wire() as i32,
        block_size,
        max_tokens: req.work.max_tokens.unwrap_or(0),
        n: req.work.n,
        prompts: req.work.prompts,
        extra_prompt_tokens: req.work.extra_prompt_tokens,
        background: req.work.background,
        stream: req.stream,
        tenant: meta.tenant.clone(),
        assignment_id: meta.assignment_id,
        previous_response_id: req.previous_response_id.clone().unwrap_or_default(),
        service_class: meta.service_class.clone(),
        pool: meta.pool.clone(),
        ..PickRequest::default()
    };
    match &req.prompt {
        Prompt::Tokens(tokens) => {
            pick.token_keys = token_block_keys(&root, tokens, block_size as usize).into_iter().map(|k| k.0).collect();
            pick.prompt_tokens = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        }
        Prompt::Text(text) => pick.prompt_text = text.clone(),
        Prompt::Chat { template_input, .. } => pick.chat_json = template_input.clone(),
    }
    let canonical = req.canonical_text();
    if !canonical.is_empty() {
        pick.text_chunk_keys =
            text_chunk_keys(&root, canonical, config.text_chunk_bytes).into_iter().map(|k| k.0).collect();
        pick.prompt_bytes = u32::try_from(canonical.len()).unwrap_or(u32::MAX);
    }
    pick
}

/// A routing decision to apply: set `header` to `value` on the request.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub header: String,
    /// The chosen target, then (endpoint mode) its fallbacks: `IP:Port,IP:Port,...`, the
    /// override-host list Envoy's retry moves down.
    pub value: String,
    /// The chosen worker's `host:port` (either mode; may be empty in cluster mode), to tell
    /// later whether it is what answered.
    pub address: String,
    pub assignment_id: u64,
    /// The `x-kvroute-decision` value describing the decision.
    pub decision: String,
}

/// Interprets a decoded PickResponse under the configured routing mode; `trusted`: the
/// decision header may carry the details.
pub fn route_from_pick(config: &Config, resp: &PickResponse, trusted: bool) -> Result<Route, FallbackReason> {
    if resp.worker_id.is_empty() {
        return Err(FallbackReason::from_degraded(resp.degraded_reason));
    }
    let target = match config.routing_mode {
        RoutingMode::Endpoint => &resp.endpoint,
        RoutingMode::Cluster => &resp.cluster,
    };
    if target.is_empty() || !is_header_value(target) {
        return Err(FallbackReason::NoTarget);
    }
    if !config.allows(target) {
        return Err(FallbackReason::TargetNotAllowed);
    }
    let mut value = target.clone();
    if config.routing_mode == RoutingMode::Endpoint {
        let usable = |e: &&String| !e.is_empty() && *e != target && is_header_value(e) && !e.contains(',') && config.allows(e);
        for fallback in resp.fallback_endpoints.iter().filter(usable).take(config.fallback_endpoints) {
            value.push(',');
            value.push_str(fallback);
        }
    }
    Ok(Route {
        header: config.route_header.clone(),
        value,
        address: resp.endpoint.clone(),
        assignment_id: resp.assignment_id,
        decision: decision_value(resp, trusted),
    })
}

/// For a trusted caller `worker=..;matched=..;total=..;ttft_ms=..;policy=..;tokenization=..;degraded=..`;
/// for anyone else only `policy=..;tokenization=..;degraded=..`: which worker holds which
/// prefix, block by block, is another tenant's secret (a probe for a guessed prompt).
pub fn decision_value(resp: &PickResponse, trusted: bool) -> String {
    if !trusted {
        return format!(
            "policy={};tokenization={};degraded={}",
            sanitize(&resp.policy),
            tokenization_label(resp.tokenization),
            degraded_label(resp.degraded_reason)
        );
    }
    format!(
        "worker={};matched={};total={};ttft_ms={:.1};policy={};tokenization={};degraded={}",
        sanitize(&resp.worker_id),
        resp.matched_blocks,
        resp.total_blocks,
        resp.predicted_ttft_ms,
        sanitize(&resp.policy),
        tokenization_label(resp.tokenization),
        degraded_label(resp.degraded_reason),
    )
}

/// How the state service turned the prompt into keys, as core spells it (the state service's
/// `path` label too). A value from a newer state service reads as `none`: the header must
/// never claim more than was done.
fn tokenization_label(path: i32) -> &'static str {
    TokenizationPath::try_from(path).unwrap_or(TokenizationPath::TokenizationNone).label()
}

/// Why the decision was degraded, as core spells it (`none` when it was not). A value from a
/// newer state service is still a degraded decision: it reads as the generic `degraded`, never
/// as `none`.
pub fn degraded_label(degraded: i32) -> &'static str {
    DegradedReason::try_from(degraded).map_or(FallbackReason::Degraded.label(), DegradedReason::label)
}

/// The fallback for a pick that did not answer 2xx. Envoy's async client turns connection
/// failures into a local 503 and its timeout into a 504, so those mean "unavailable" / "slow"
/// whoever produced them; 429 is the state service shedding load; anything else is its own
/// error status. Without a status, ngx_wasm_module says why in its `:dispatch_status`
/// pseudo-header (`timeout`, `broken connection`, ...; Envoy has none): a timeout there is slow
/// too.
pub fn classify_pick_status(status: Option<&str>, dispatch_status: Option<&str>) -> FallbackReason {
    match status.and_then(|s| s.parse::<u16>().ok()) {
        None if dispatch_status == Some("timeout") => FallbackReason::PickTimeout,
        None | Some(502) | Some(503) => FallbackReason::PickUnavailable,
        Some(504) => FallbackReason::PickTimeout,
        Some(429) => FallbackReason::PickOverloaded,
        Some(_) => FallbackReason::PickStatus,
    }
}

/// The longest a request waits in the state service's queue, whatever it answers: a guard
/// against a service that keeps answering `queued` (its classes' deadlines shed long before).
pub const MAX_QUEUE_WAIT_MS: f64 = 600_000.0;
/// Allowed on top of the service's hold and the pick timeout for a queued pick's call.
pub const QUEUE_CALL_MARGIN: Duration = Duration::from_millis(100);

/// The timeout of the next call for a pick the state service holds in its queue, after
/// `waited_ms` in it: the service's hold plus the pick timeout plus a margin, so a replica
/// that dies or freezes meanwhile costs the request one call (about a second), not its whole
/// wait. `None` past [`MAX_QUEUE_WAIT_MS`].
pub fn queue_call_timeout(queued: &kvroute_core::wire::QueuedPick, waited_ms: f64, pick_timeout: Duration) -> Option<Duration> {
    (waited_ms <= MAX_QUEUE_WAIT_MS).then(|| Duration::from_millis(u64::from(queued.wait_ms)) + pick_timeout + QUEUE_CALL_MARGIN)
}

/// The least pick time left for which a refused pick is sent again.
pub const MIN_RETRY: Duration = Duration::from_millis(5);

/// How many times a refused pick is sent again. Twice: the balancer's round robin is shared
/// with the filter's other calls (reports, other requests' picks), so one resend can land on
/// the replica that refused; a second reaches another one far more surely.
pub const MAX_RESENDS: u8 = 2;

/// A pick the replica that got it refused (it is dead, not ready, or shedding load: no
/// connection, 502/503, 429) goes again to the state cluster, whose balancer gives it to
/// another replica, up to [`MAX_RESENDS`] times while at least [`MIN_RETRY`] of the pick's
/// time is left: how long it may wait. A slow answer (a timeout) is not sent again: its time
/// is spent.
pub fn pick_retry(reason: FallbackReason, left: Duration) -> Option<Duration> {
    let refused = matches!(reason, FallbackReason::PickUnavailable | FallbackReason::PickOverloaded);
    (refused && left >= MIN_RETRY).then_some(left)
}

/// Whether the pick's HTTP status is a success.
pub fn is_success(status: Option<&str>) -> bool {
    status.and_then(|s| s.parse::<u16>().ok()).is_some_and(|s| (200..300).contains(&s))
}

fn is_header_value(v: &str) -> bool {
    v.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// Keeps a value safe inside a `;`/`=`-separated header.
fn sanitize(v: &str) -> String {
    v.chars().map(|c| if c.is_ascii_graphic() && c != ';' && c != '=' { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queued_pick_is_asked_for_with_the_hold_plus_the_pick_timeout_until_it_waited_too_long() {
        let q = kvroute_core::wire::QueuedPick { ticket: 7, wait_ms: 500, ahead: 3 };
        let pick = Duration::from_millis(50);
        assert_eq!(queue_call_timeout(&q, 0.0, pick), Some(Duration::from_millis(650)));
        assert_eq!(queue_call_timeout(&q, MAX_QUEUE_WAIT_MS, pick), Some(Duration::from_millis(650)));
        assert_eq!(queue_call_timeout(&q, MAX_QUEUE_WAIT_MS + 1.0, pick), None);
    }
    use kvroute_core::request::{parse, Api};

    fn config(extra: &str) -> Config {
        Config::parse(format!(r#"{{"state_cluster":"s"{extra}}}"#).as_bytes()).unwrap()
    }

    #[test]
    fn only_a_refused_pick_with_time_left_goes_again() {
        let ms = Duration::from_millis;
        assert_eq!(pick_retry(FallbackReason::PickUnavailable, ms(40)), Some(ms(40)));
        assert_eq!(pick_retry(FallbackReason::PickOverloaded, ms(5)), Some(ms(5)));
        assert_eq!(pick_retry(FallbackReason::PickUnavailable, ms(4)), None, "no time left");
        for slow_or_answered in [FallbackReason::PickTimeout, FallbackReason::PickStatus, FallbackReason::PickDecode, FallbackReason::DispatchFailed] {
            assert_eq!(pick_retry(slow_or_answered, ms(40)), None, "{}", slow_or_answered.label());
        }
    }

    #[test]
    fn strips_own_routing_and_untrusted_tenant_headers() {
        let c = config(r#","identity":{"sources":[{"header":{"name":"X-Tenant","trusted_sources":["10.0.0.0/8"]}}]},"strip_headers":["x-evil"]"#);
        let names = ["X-KVRoute-Fallback", "x-gateway-destination-endpoint", "x-tenant", "x-evil", "content-type"];
        assert_eq!(
            headers_to_strip(&c, names, |_| false),
            vec!["x-kvroute-fallback", "x-gateway-destination-endpoint", "x-tenant", "x-evil"]
        );
        assert_eq!(headers_to_strip(&c, ["x-tenant"], |_| true), Vec::<String>::new(), "a trusted hop's header stays");
    }

    #[test]
    fn a_responses_follow_up_names_its_stored_response() {
        let c = config("");
        let req = kvroute_core::request::parse(Api::Responses, br#"{"model":"m","input":"next","previous_response_id":"resp_1"}"#).unwrap();
        let pick = build_pick(&c, &req, &RequestMeta::default());
        assert_eq!((pick.previous_response_id.as_str(), pick.endpoint), ("resp_1", kvroute_core::wire::Endpoint::Responses as i32));
        assert!(!pick.chat_json.is_empty());
    }

    #[test]
    fn token_prompts_get_exact_keys_text_prompts_get_chunks() {
        let c = config(r#","model_block_sizes":{"m":4}"#);
        let req = parse(Api::Completions, br#"{"model":"m","prompt":[1,2,3,4,5,6,7,8,9],"max_tokens":3}"#).unwrap();
        let pick = build_pick(&c, &req, &RequestMeta::default());
        let want = token_block_keys(&KeyRoot::new("m", ""), &[1, 2, 3, 4, 5, 6, 7, 8, 9], 4);
        assert_eq!(pick.token_keys, want.iter().map(|k| k.0).collect::<Vec<_>>());
        assert_eq!((pick.block_size, pick.prompt_tokens, pick.max_tokens), (4, 9, 3));
        assert!(pick.prompt_text.is_empty() && pick.text_chunk_keys.is_empty());

        let text = "x".repeat(600);
        let body = serde_json::json!({"model":"m","messages":[{"role":"user","content":text}]}).to_string();
        let req = parse(Api::ChatCompletions, body.as_bytes()).unwrap();
        let pick = build_pick(&c, &req, &RequestMeta { request_id: "r1".into(), assignment_id: 9, ..RequestMeta::default() });
        assert_eq!(pick.assignment_id, 9);
        assert!(pick.token_keys.is_empty());
        assert!(pick.chat_json.contains("messages"));
        assert_eq!(pick.text_chunk_keys.len(), req.canonical_text().len() / 256);
        assert_eq!(pick.request_id, "r1");
    }

    #[test]
    fn pick_responses_map_to_routes_or_reasons() {
        let resp = PickResponse {
            assignment_id: 7,
            worker_id: "w1".into(),
            endpoint: "127.0.0.1:8101".into(),
            cluster: "worker_w1".into(),
            matched_blocks: 3,
            total_blocks: 4,
            predicted_ttft_ms: 12.345,
            policy: "ttft".into(),
            ..PickResponse::default()
        };
        let r = route_from_pick(&config(""), &resp, true).unwrap();
        assert_eq!((r.header.as_str(), r.value.as_str(), r.assignment_id), ("x-gateway-destination-endpoint", "127.0.0.1:8101", 7));
        assert_eq!(r.decision, "worker=w1;matched=3;total=4;ttft_ms=12.3;policy=ttft;tokenization=none;degraded=none");
        let r = route_from_pick(&config(r#","routing_mode":"cluster""#), &resp, true).unwrap();
        assert_eq!((r.header.as_str(), r.value.as_str()), ("x-kvroute-cluster", "worker_w1"));

        let no_worker = |degraded: i32| route_from_pick(&config(""), &PickResponse { degraded_reason: degraded, ..PickResponse::default() }, true);
        assert_eq!(no_worker(DegradedReason::DegradedUnknownModel as i32), Err(FallbackReason::UnknownModel));
        assert_eq!(no_worker(DegradedReason::DegradedNoHealthyWorker as i32), Err(FallbackReason::NoHealthyWorker));
        assert_eq!(no_worker(DegradedReason::DegradedStateUnavailable as i32), Err(FallbackReason::Degraded));
        assert_eq!(no_worker(DegradedReason::DegradedNone as i32), Err(FallbackReason::Degraded));
        assert_eq!(no_worker(99), Err(FallbackReason::Degraded), "a reason from a newer state service");
        let with_fallbacks = PickResponse {
            fallback_endpoints: vec!["127.0.0.1:8102".into(), "127.0.0.1:8101".into(), "".into(), "a,b".into(), "127.0.0.1:8103".into(), "127.0.0.1:8104".into()],
            ..resp.clone()
        };
        let r = route_from_pick(&config(""), &with_fallbacks, true).unwrap();
        assert_eq!(r.value, "127.0.0.1:8101,127.0.0.1:8102,127.0.0.1:8103", "the target first, unusable entries skipped, 2 at most");
        assert_eq!(r.address, "127.0.0.1:8101");
        let r = route_from_pick(&config(r#","fallback_endpoints":0"#), &with_fallbacks, true).unwrap();
        assert_eq!(r.value, "127.0.0.1:8101", "one host (ORIGINAL_DST takes no list)");
        let r = route_from_pick(&config(r#","routing_mode":"cluster""#), &with_fallbacks, true).unwrap();
        assert_eq!(r.value, "worker_w1", "a cluster header names one cluster");
        let allowed = config(r#","allowed_targets":["127.0.0.1:810*"]"#);
        let r = route_from_pick(&allowed, &PickResponse { fallback_endpoints: vec!["10.9.9.9:1".into(), "127.0.0.1:8103".into()], ..resp.clone() }, true).unwrap();
        assert_eq!(r.value, "127.0.0.1:8101,127.0.0.1:8103", "fallbacks outside the allowlist are dropped");
        let outside = PickResponse { endpoint: "169.254.169.254:80".into(), ..resp.clone() };
        assert_eq!(route_from_pick(&allowed, &outside, true), Err(FallbackReason::TargetNotAllowed));
        let r = route_from_pick(&config(""), &resp, false).unwrap();
        assert_eq!(r.decision, "policy=ttft;tokenization=none;degraded=none", "no match information for untrusted callers");
        let no_addr = PickResponse { worker_id: "w".into(), ..PickResponse::default() };
        assert_eq!(route_from_pick(&config(""), &no_addr, true), Err(FallbackReason::NoTarget));
    }

    #[test]
    fn decision_names_the_tokenization_path() {
        let cases = [
            (TokenizationPath::TokenizationExactTokenIds, "exact_token_ids"),
            (TokenizationPath::TokenizationLocal, "local"),
            (TokenizationPath::TokenizationWorker, "worker"),
            (TokenizationPath::TokenizationTextChunks, "text_chunks"),
            (TokenizationPath::TokenizationNone, "none"),
            (TokenizationPath::TokenizationUnspecified, "none"),
        ];
        for (path, label) in cases {
            let resp = PickResponse {
                worker_id: "w".into(),
                policy: "kvroute".into(),
                tokenization: path as i32,
                degraded_reason: DegradedReason::DegradedTokenizerUnavailable as i32,
                ..PickResponse::default()
            };
            assert_eq!(
                decision_value(&resp, true),
                format!("worker=w;matched=0;total=0;ttft_ms=0.0;policy=kvroute;tokenization={label};degraded=tokenizer_unavailable")
            );
        }
        assert_eq!(tokenization_label(99), "none", "a value from a newer state service");
    }

    #[test]
    fn decision_names_the_degraded_reason() {
        let cases = [
            (DegradedReason::DegradedNone as i32, "none"),
            (DegradedReason::DegradedTokenizerUnavailable as i32, "tokenizer_unavailable"),
            (DegradedReason::DegradedUnknownModel as i32, "unknown_model"),
            (DegradedReason::DegradedNoHealthyWorker as i32, "no_healthy_worker"),
            (DegradedReason::DegradedBlockSizeMismatch as i32, "block_size_mismatch"),
            (DegradedReason::DegradedStateUnavailable as i32, "state_unavailable"),
            (99, "degraded"),
            (-1, "degraded"),
        ];
        for (degraded, label) in cases {
            let resp = PickResponse { worker_id: "w".into(), degraded_reason: degraded, ..PickResponse::default() };
            assert!(decision_value(&resp, true).ends_with(&format!(";degraded={label}")), "{degraded}");
        }
    }

    #[test]
    fn status_and_labels() {
        assert!(is_success(Some("200")) && is_success(Some("204")));
        assert!(!is_success(Some("503")) && !is_success(None) && !is_success(Some("x")));
        assert_eq!(classify_pick_status(None, None), FallbackReason::PickUnavailable);
        assert_eq!(classify_pick_status(Some("503"), None), FallbackReason::PickUnavailable);
        assert_eq!(classify_pick_status(Some("504"), None), FallbackReason::PickTimeout);
        assert_eq!(classify_pick_status(Some("429"), None), FallbackReason::PickOverloaded);
        assert_eq!(classify_pick_status(Some("400"), None), FallbackReason::PickStatus);
        // ngx_wasm_module: no status, the reason in `:dispatch_status`.
        assert_eq!(classify_pick_status(None, Some("timeout")), FallbackReason::PickTimeout);
        assert_eq!(classify_pick_status(None, Some("broken connection")), FallbackReason::PickUnavailable);
        // Host-visible (x-kvroute-fallback, kvroute_fallback_<label> counters): pinned.
        let labels: Vec<&str> = FallbackReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(
            labels,
            [
                "no_body",
                "body_too_large",
                "unparsable_body",
                "state_unavailable",
                "pick_unavailable",
                "pick_timeout",
                "pick_overloaded",
                "pick_status",
                "pick_decode",
                "unknown_model",
                "no_healthy_worker",
                "degraded",
                "no_target",
                "target_not_allowed",
            ]
        );
        for (i, r) in FallbackReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }
}
