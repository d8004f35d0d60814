//! The HTTP API, driven in-process with `oneshot`.

mod common;

use axum::body::{to_bytes, Body};
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use common::{state, TOKEN};
use kvroute_core::wire::{DegradedReason, PickRequest, PickResponse, Report, ReportBatch, ReportKind, TokenizationPath, UpstreamFailure};
use kvroute_kv::types::EngineSlot;
use prost::Message;
use serde_json::{json, Value};
use std::time::Duration;
use tower::ServiceExt;

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.expect("router is infallible");
    let status = resp.status();
    (status, to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec())
}

fn post(path: &str, content_type: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path).header(header::CONTENT_TYPE, content_type).body(body.into()).unwrap()
}

fn admin(method: Method, path: &str, token: Option<&str>, body: Value) -> Request<Body> {
    let mut req = Request::builder().method(method).uri(path).header(header::CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    req.body(Body::from(body.to_string())).unwrap()
}

async fn pick_pb(app: &Router, req: &PickRequest) -> PickResponse {
    let (status, body) = send(app, post("/v1/pick", "application/x-protobuf", req.encode_to_vec())).await;
    assert_eq!(status, StatusCode::OK);
    PickResponse::decode(&body[..]).expect("protobuf PickResponse")
}

async fn report_pb(app: &Router, reports: Vec<Report>) {
    let batch = ReportBatch { reports };
    let (status, _) = send(app, post("/v1/report", "application/x-protobuf", batch.encode_to_vec())).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

async fn get_json(app: &Router, path: &str) -> Value {
    let (status, body) = send(app, Request::get(path).body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    serde_json::from_slice(&body).unwrap()
}

async fn assignment_count(app: &Router) -> u64 {
    get_json(app, "/v1/assignments").await["count"].as_u64().unwrap()
}

fn token_pick(keys: &[u64]) -> PickRequest {
    PickRequest {
        model: "m".into(),
        token_keys: keys.to_vec(),
        block_size: 16,
        prompt_tokens: keys.len() as u32 * 16 + 5,
        ..Default::default()
    }
}

fn report(id: u64, kind: ReportKind, elapsed_ms: f64) -> Report {
    Report { assignment_id: id, kind: kind as i32, elapsed_ms, ..Default::default() }
}

#[tokio::test]
async fn protobuf_pick_and_report_round_trip() {
    let (state, index) = state(&["a", "b"]);
    index.hold(EngineSlot(1), &[1, 2, 3, 4]);
    let app = state.router();
    let resp = pick_pb(&app, &token_pick(&[1, 2, 3, 4, 5, 6])).await;
    assert_ne!(resp.assignment_id, 0);
    assert_eq!((resp.worker_id.as_str(), resp.endpoint.as_str(), resp.cluster.as_str()), ("b", "127.0.0.1:8001", "c_b"));
    assert_eq!((resp.matched_blocks, resp.total_blocks), (4, 6));
    assert_eq!(resp.tokenization, TokenizationPath::TokenizationExactTokenIds as i32);
    assert!(resp.degraded_reason() == DegradedReason::DegradedNone && resp.predicted_ttft_ms > 0.0);
    assert_eq!(assignment_count(&app).await, 1);

    report_pb(&app, vec![report(resp.assignment_id, ReportKind::ReportFirstToken, 42.0)]).await;
    let workers = get_json(&app, "/v1/workers").await;
    let b = &workers["workers"][1];
    assert_eq!((b["id"].as_str(), b["calibration"]["samples"].as_u64()), (Some("b"), Some(1)));
    assert_eq!(b["load"]["own_in_flight"], 1);
    report_pb(&app, vec![report(resp.assignment_id, ReportKind::ReportComplete, 900.0)]).await;
    assert_eq!(assignment_count(&app).await, 0);
}

#[tokio::test]
async fn json_pick_and_report_round_trip() {
    let (state, _) = state(&["a", "b"]);
    let app = state.router();
    let body = json!({ "model": "m", "token_keys": [11, 12], "block_size": 16, "prompt_tokens": 40 });
    let (status, bytes) = send(&app, post("/v1/pick", "application/json", body.to_string())).await;
    assert_eq!(status, StatusCode::OK);
    let resp: Value = serde_json::from_slice(&bytes).expect("JSON answer to a JSON pick");
    let id = resp["assignment_id"].as_u64().unwrap();
    assert!(id != 0 && resp["worker_id"].as_str().is_some_and(|w| !w.is_empty()));
    assert_eq!(resp["policy"], "kvroute");
    let reports = json!({ "reports": [{ "assignment_id": id, "kind": 3 }] });
    let (status, _) = send(&app, post("/v1/report", "application/json; charset=utf-8", reports.to_string())).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(assignment_count(&app).await, 0);
}

#[tokio::test]
async fn malformed_bodies_get_400_with_a_message() {
    let (state, _) = state(&["a"]);
    let app = state.router();
    let cases = [
        ("/v1/pick", "application/x-protobuf", b"\xff\xff\xff\xff".to_vec(), "invalid protobuf PickRequest"),
        ("/v1/pick", "application/json", br#"{"model": 5}"#.to_vec(), "invalid JSON PickRequest"),
        ("/v1/report", "application/json", b"{not json".to_vec(), "invalid JSON ReportBatch"),
        ("/v1/report", "application/x-protobuf", b"\x0a\x05\x08".to_vec(), "invalid protobuf ReportBatch"),
    ];
    for (path, ct, body, want) in cases {
        let (status, bytes) = send(&app, post(path, ct, body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {ct}");
        let err: Value = serde_json::from_slice(&bytes).unwrap();
        assert!(err["error"].as_str().unwrap().contains(want), "{err}");
    }
    let (status, bytes) = send(&app, post("/v1/pick", "text/plain", "hello")).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(String::from_utf8_lossy(&bytes).contains("application/x-protobuf"));
}

#[tokio::test]
async fn unknown_model_and_text_prompts_are_degraded_not_errors() {
    let (state, _) = state(&["a", "b"]);
    let app = state.router();
    let resp = pick_pb(&app, &PickRequest { model: "nope".into(), ..token_pick(&[1]) }).await;
    assert_eq!((resp.worker_id.as_str(), resp.assignment_id, resp.degraded_reason().label()), ("", 0, "unknown_model"));

    let text = PickRequest { model: "m".into(), prompt_text: "x".repeat(600), text_chunk_keys: vec![9, 10], prompt_bytes: 600, ..Default::default() };
    let first = pick_pb(&app, &text).await;
    assert_eq!(first.degraded_reason().label(), "tokenizer_unavailable");
    assert_eq!(first.tokenization, TokenizationPath::TokenizationTextChunks as i32);
    // Learned from the first pick: once its queue is gone, the same prefix follows it.
    report_pb(&app, vec![report(first.assignment_id, ReportKind::ReportFirstToken, 30.0)]).await;
    let second = pick_pb(&app, &text).await;
    assert_eq!((second.worker_id.as_str(), second.matched_blocks), (first.worker_id.as_str(), 2));
    let metrics = String::from_utf8(send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await.1).unwrap();
    assert!(metrics.contains(r#"kvroute_degraded_decisions_total{reason="tokenizer_unavailable"} 2"#), "{metrics}");
    assert!(metrics.contains(r#"kvroute_degraded_decisions_total{reason="unknown_model"} 1"#));
}

#[tokio::test]
async fn a_burst_on_a_new_prefix_follows_the_first_pick() {
    // The index knows nothing (no events yet): speculative credit alone keeps the burst on
    // the first worker. Each request is reported started, so no queue competes with the
    // cache: while a request waits for its first token its worker's queue is real cost.
    let (state, _) = state(&["a", "b", "c"]);
    let app = state.router();
    let keys: Vec<u64> = (100..164).collect();
    let first = pick_pb(&app, &token_pick(&keys)).await;
    assert_eq!(first.matched_blocks, 0);
    let mut last = first.assignment_id;
    for _ in 0..3 {
        report_pb(&app, vec![report(last, ReportKind::ReportFirstToken, 50.0)]).await;
        let next = pick_pb(&app, &token_pick(&keys)).await;
        assert_eq!((next.worker_id.as_str(), next.matched_blocks), (first.worker_id.as_str(), 64));
        last = next.assignment_id;
    }
}

#[tokio::test(start_paused = true)]
async fn ttl_frees_unreported_assignments() {
    let (state, _) = state(&["a"]);
    let app = state.router();
    let first = pick_pb(&app, &token_pick(&[1])).await;
    let second = pick_pb(&app, &token_pick(&[2])).await;
    report_pb(&app, vec![report(second.assignment_id, ReportKind::ReportFirstToken, 10.0)]).await;
    assert_eq!(assignment_count(&app).await, 2);
    tokio::time::advance(Duration::from_secs(120)).await;
    assert_eq!(assignment_count(&app).await, 1, "no first token within the first-token TTL");
    tokio::time::advance(Duration::from_secs(480)).await;
    assert_eq!(assignment_count(&app).await, 0, "no completion within the assignment TTL");
    // Late reports about expired assignments are harmless.
    report_pb(&app, vec![report(first.assignment_id, ReportKind::ReportComplete, 1.0)]).await;
    let metrics = String::from_utf8(send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await.1).unwrap();
    assert!(metrics.contains(r#"kvroute_assignments_expired_total{ttl="first_token"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"kvroute_reports_total{kind="complete",outcome="unknown"} 1"#));
}

#[tokio::test]
async fn admin_endpoints_need_the_token() {
    let (state, _) = state(&["a"]);
    let app = state.router();
    let policy = json!({ "policy": "round_robin" });
    let worker = json!({ "id": "z", "model": "m", "endpoint": "127.0.0.1:9999" });
    for token in [None, Some("wrong")] {
        let reqs = [
            admin(Method::POST, "/admin/policy", token, policy.clone()),
            admin(Method::POST, "/admin/workers", token, worker.clone()),
            admin(Method::DELETE, "/admin/workers/a", token, json!({})),
            admin(Method::POST, "/admin/reset", token, json!({})),
        ];
        for req in reqs {
            let path = req.uri().to_string();
            assert_eq!(send(&app, req).await.0, StatusCode::UNAUTHORIZED, "{path}");
        }
    }
    let (status, body) = send(&app, admin(Method::POST, "/admin/policy", Some(TOKEN), policy)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(pick_pb(&app, &token_pick(&[1])).await.policy, "round_robin");
    let bad = admin(Method::POST, "/admin/policy", Some(TOKEN), json!({ "policy": "fastest" }));
    assert_eq!(send(&app, bad).await.0, StatusCode::BAD_REQUEST);

    assert_eq!(send(&app, admin(Method::POST, "/admin/workers", Some(TOKEN), worker.clone())).await.0, StatusCode::CREATED);
    assert_eq!(send(&app, admin(Method::POST, "/admin/workers", Some(TOKEN), worker)).await.0, StatusCode::CONFLICT);
    let bad_worker = json!({ "id": "y", "model": "m", "endpoint": "no-port" });
    assert_eq!(send(&app, admin(Method::POST, "/admin/workers", Some(TOKEN), bad_worker)).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(get_json(&app, "/v1/workers").await["workers"].as_array().unwrap().len(), 2);
    assert_eq!(send(&app, admin(Method::DELETE, "/admin/workers/z", Some(TOKEN), json!({}))).await.0, StatusCode::NO_CONTENT);
    assert_eq!(send(&app, admin(Method::DELETE, "/admin/workers/z", Some(TOKEN), json!({}))).await.0, StatusCode::NOT_FOUND);
    assert_eq!(send(&app, admin(Method::POST, "/admin/reset", Some(TOKEN), json!({}))).await.0, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn metrics_health_and_readiness() {
    let (state, index) = state(&["a"]);
    index.hold(EngineSlot(0), &[1, 2]);
    let app = state.router();
    pick_pb(&app, &token_pick(&[1, 2])).await;
    let (status, body) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    for family in [
        "kvroute_picks_total{policy=\"kvroute\",outcome=\"routed\"} 1",
        "kvroute_degraded_decisions",
        "kvroute_pick_latency_seconds",
        "kvroute_ttft_predicted_seconds",
        "kvroute_ttft_actual_seconds",
        "kvroute_ttft_error_ratio",
        "kvroute_matched_prefix_ratio",
        "kvroute_assignments_in_flight 1",
        "kvroute_worker_running{worker=\"a\"}",
        "kvroute_worker_assignments_in_flight{worker=\"a\"} 1",
        "kvroute_index_blocks{worker=\"a\",rank=\"0\"} 2",
        "kvroute_events_applied",
        "kvroute_event_sequence_gaps",
        "kvroute_event_replays",
    ] {
        assert!(text.contains(family), "missing {family} in\n{text}");
    }
    assert_eq!(send(&app, Request::get("/healthz").body(Body::empty()).unwrap()).await.0, StatusCode::OK);
    assert_eq!(send(&app, Request::get("/readyz").body(Body::empty()).unwrap()).await.0, StatusCode::OK);
    let (empty, _) = common::state(&[]);
    assert_eq!(send(&empty.router(), Request::get("/readyz").body(Body::empty()).unwrap()).await.0, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn picks_name_fallbacks_and_a_reported_failure_stops_picks_at_once() {
    let (state, index) = state(&["a", "b", "c"]);
    index.hold(EngineSlot(1), &[1, 2, 3, 4]);
    let app = state.router();
    let first = pick_pb(&app, &token_pick(&[1, 2, 3, 4])).await;
    assert_eq!(first.worker_id, "b");
    let mut fallbacks = first.fallback_endpoints.clone();
    fallbacks.sort();
    assert_eq!(fallbacks, ["127.0.0.1:8000", "127.0.0.1:8002"], "the others, never the chosen one");

    // The proxy failed over: b refused the connection and c answered.
    let failed = Report {
        upstream_failure: UpstreamFailure::UpstreamFailedOver as i32,
        served_by: "127.0.0.1:8002".into(),
        ..report(first.assignment_id, ReportKind::ReportFirstToken, 30.0)
    };
    report_pb(&app, vec![failed]).await;
    let b = get_json(&app, "/v1/workers").await["workers"][1].clone();
    assert_eq!((b["id"].as_str(), b["suspect"].as_str(), b["takes_picks"].as_bool()), (Some("b"), Some("failed_over"), Some(false)), "{b}");
    for _ in 0..5 {
        let next = pick_pb(&app, &token_pick(&[1, 2, 3, 4])).await;
        assert_ne!(next.worker_id, "b", "b holds the prefix but is suspect");
        assert!(!next.fallback_endpoints.contains(&"127.0.0.1:8001".to_string()), "a suspect is no fallback either");
    }
    let (_, metrics) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(metrics.contains(r#"kvroute_upstream_failures_total{reason="failed_over"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"kvroute_worker_takes_picks{worker="b"} 0"#), "{metrics}");
}

#[tokio::test]
async fn a_drained_worker_gets_no_new_picks_and_leaves_when_its_requests_end() {
    let (state, index) = state(&["a", "b"]);
    index.hold(EngineSlot(1), &[1, 2, 3, 4]);
    let app = state.router();
    let running = pick_pb(&app, &token_pick(&[1, 2, 3, 4])).await;
    assert_eq!(running.worker_id, "b");
    let (status, body) = send(&app, admin(Method::POST, "/admin/workers/b/drain", Some(TOKEN), json!({}))).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["in_flight"], 1);
    let next = pick_pb(&app, &token_pick(&[1, 2, 3, 4])).await;
    assert_eq!(next.worker_id, "a", "draining: no new picks");
    // Still there while its request runs; removing it again only drains (202).
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(get_json(&app, "/v1/workers").await["workers"][1]["draining"], true);
    assert_eq!(send(&app, admin(Method::DELETE, "/admin/workers/b", Some(TOKEN), json!({}))).await.0, StatusCode::ACCEPTED);
    report_pb(&app, vec![report(running.assignment_id, ReportKind::ReportComplete, 90.0)]).await;
    for _ in 0..40 {
        if get_json(&app, "/v1/workers").await["workers"].as_array().unwrap().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let workers = get_json(&app, "/v1/workers").await;
    assert_eq!(workers["workers"].as_array().unwrap().len(), 1, "drained and removed: {workers}");
    assert_eq!(send(&app, admin(Method::POST, "/admin/workers/b/drain", Some(TOKEN), json!({}))).await.0, StatusCode::NOT_FOUND);
    assert_eq!(send(&app, admin(Method::POST, "/admin/workers/a/drain", None, json!({}))).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn an_overloaded_service_refuses_picks_at_once() {
    let mut config = common::config(&["a"]);
    config.resilience.max_concurrent_picks = 1;
    config.resilience.pick_queue_ms = 5;
    // A pick continuing a response nobody knows waits this long for its owner: it holds the
    // only slot meanwhile.
    config.responses.unknown_wait_ms = 2_000;
    let state = kvroute_state::app::App::new(config, std::sync::Arc::new(common::TestIndex::default())).unwrap();
    let app = state.router();
    let waiting = PickRequest { previous_response_id: "resp_unknown".into(), ..token_pick(&[1]) };
    let holder = tokio::spawn({
        let app = app.clone();
        async move { pick_pb(&app, &waiting).await }
    });
    // Probes until the holder has the slot (a probe that gets it first just decides).
    let mut shed = None;
    for _ in 0..500 {
        let started = std::time::Instant::now();
        let (status, body) = send(&app, post("/v1/pick", "application/x-protobuf", token_pick(&[1]).encode_to_vec())).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            shed = Some((started.elapsed(), body));
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (took, body) = shed.expect("a pick is shed while the only slot is held");
    assert!(String::from_utf8_lossy(&body).contains("overloaded"));
    assert!(took < Duration::from_secs(1), "refused within the queue bound, not after a timeout");
    assert_eq!(holder.await.unwrap().worker_id, "a", "the waiting pick still decides");
    assert_eq!(pick_pb(&app, &token_pick(&[1])).await.worker_id, "a", "a free slot again");
    let (_, metrics) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert!(String::from_utf8(metrics).unwrap().contains("kvroute_picks_shed_total"));
}

#[tokio::test]
async fn the_proxy_api_needs_its_token_and_forged_reports_change_nothing() {
    const API: &str = "api-token-for-tests-0123456789abcdef";
    let mut config = common::config(&["a"]);
    config.api_token = Some(API.into());
    let index = std::sync::Arc::new(common::TestIndex::default());
    let state = kvroute_state::app::App::new(config, index).unwrap();
    let app = state.router();
    let pick = token_pick(&[1, 2]).encode_to_vec();
    let with = |req: axum::http::request::Builder, token: Option<&str>| match token {
        Some(t) => req.header(header::AUTHORIZATION, format!("Bearer {t}")),
        None => req,
    };
    for token in [None, Some("wrong"), Some(TOKEN)] {
        let req = with(Request::post("/v1/pick").header(header::CONTENT_TYPE, "application/x-protobuf"), token);
        assert_eq!(send(&app, req.body(Body::from(pick.clone())).unwrap()).await.0, StatusCode::UNAUTHORIZED, "{token:?}");
        for path in ["/v1/workers", "/v1/assignments", "/v1/models"] {
            assert_eq!(send(&app, with(Request::get(path), token).body(Body::empty()).unwrap()).await.0, StatusCode::UNAUTHORIZED, "{path}");
        }
        // A forged report: a huge first-token time for whatever assignment, then a cancel.
        let forged = ReportBatch { reports: vec![report(1, ReportKind::ReportFirstToken, 1e9), report(1, ReportKind::ReportCancel, 1.0)] };
        let req = with(Request::post("/v1/report").header(header::CONTENT_TYPE, "application/x-protobuf"), token);
        assert_eq!(send(&app, req.body(Body::from(forged.encode_to_vec())).unwrap()).await.0, StatusCode::UNAUTHORIZED);
    }
    let authed = |req: axum::http::request::Builder| req.header(header::AUTHORIZATION, format!("Bearer {API}"));
    let req = authed(Request::post("/v1/pick").header(header::CONTENT_TYPE, "application/x-protobuf")).body(Body::from(pick)).unwrap();
    let (status, body) = send(&app, req).await;
    assert_eq!(status, StatusCode::OK);
    let resp = PickResponse::decode(&body[..]).unwrap();
    let (_, view) = send(&app, authed(Request::get("/v1/workers")).body(Body::empty()).unwrap()).await;
    let view: Value = serde_json::from_slice(&view).unwrap();
    assert_eq!(view["workers"][0]["calibration"]["samples"], 0, "no forged report reached calibration");
    assert_eq!(view["assignments"], 1, "no forged cancel freed the real assignment {}", resp.assignment_id);
    // Health, readiness and metrics stay open; the admin API has its own token.
    assert_eq!(send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await.0, StatusCode::OK);
    assert_eq!(send(&app, admin(Method::POST, "/admin/reset", Some(API), json!({}))).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_cancel_before_its_pick_discards_the_pick() {
    let (state, _) = state(&["a"]);
    let app = state.router();
    report_pb(&app, vec![report(77, ReportKind::ReportCancel, 0.0)]).await;
    let resp = pick_pb(&app, &PickRequest { assignment_id: 77, ..token_pick(&[1]) }).await;
    assert_eq!(resp.assignment_id, 77, "the proxy's id is used");
    assert_eq!(assignment_count(&app).await, 0, "cancelled before it was decided: nothing recorded");
    let kept = pick_pb(&app, &PickRequest { assignment_id: 78, ..token_pick(&[1]) }).await;
    assert_eq!((kept.assignment_id, assignment_count(&app).await), (78, 1));
    report_pb(&app, vec![report(78, ReportKind::ReportCancel, 0.0)]).await;
    assert_eq!(assignment_count(&app).await, 0);
    let (_, metrics) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert!(String::from_utf8(metrics).unwrap().contains("kvroute_picks_abandoned_total 1"));
}
