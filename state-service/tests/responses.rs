//! Responses API affinity through the HTTP API, in-process: the owner learned from a report,
//! follow-ups and locates routed to it whatever the load says, unknown ids left to the
//! default route, a gone owner answered as such.

mod common;

use axum::body::{to_bytes, Body};
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use common::{state, TOKEN};
use kvroute_core::wire::{DegradedReason, LocateRequest, PickRequest, PickResponse, Report, ReportBatch, ReportKind};
use prost::Message;
use tower::ServiceExt;

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.expect("router is infallible");
    let status = resp.status();
    (status, to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec())
}

async fn pick(app: &Router, previous: &str, keys: &[u64]) -> PickResponse {
    let req = PickRequest {
        model: "m".into(),
        token_keys: keys.to_vec(),
        block_size: 16,
        prompt_tokens: keys.len() as u32 * 16,
        previous_response_id: previous.into(),
        ..Default::default()
    };
    let (status, body) = send(app, Request::post("/v1/pick").header(header::CONTENT_TYPE, "application/x-protobuf").body(req.encode_to_vec().into()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    PickResponse::decode(&body[..]).unwrap()
}

async fn locate(app: &Router, id: &str) -> (StatusCode, Option<PickResponse>) {
    let req = LocateRequest { response_id: id.into(), request_id: "r".into(), ..Default::default() };
    let (status, body) = send(app, Request::post("/v1/locate").header(header::CONTENT_TYPE, "application/x-protobuf").body(req.encode_to_vec().into()).unwrap()).await;
    (status, (status == StatusCode::OK).then(|| PickResponse::decode(&body[..]).unwrap()))
}

async fn report(app: &Router, reports: Vec<Report>) {
    let body = ReportBatch { reports }.encode_to_vec();
    let (status, _) = send(app, Request::post("/v1/report").header(header::CONTENT_TYPE, "application/x-protobuf").body(body.into()).unwrap()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn follow_ups_and_locates_go_to_the_worker_that_stored_the_response() {
    let (state, index) = state(&["a", "b"]);
    let app = state.router();
    let first = pick(&app, "", &[1, 2, 3]).await;
    let owner = first.worker_id.clone();
    let other = if owner == "a" { "b" } else { "a" };
    let id = first.assignment_id;
    report(&app, vec![Report { assignment_id: id, kind: ReportKind::ReportFirstToken as i32, elapsed_ms: 5.0, response_id: "resp_abc".into(), ..Default::default() }]).await;
    report(&app, vec![Report {
        assignment_id: id,
        kind: ReportKind::ReportComplete as i32,
        prompt_tokens: 48,
        completion_tokens: 20,
        response_id: "resp_abc".into(),
        ..Default::default()
    }])
    .await;
    // The other worker holds the follow-up's blocks: a free pick of them goes there.
    let held: Vec<u64> = (500..756).collect();
    index.hold(kvroute_kv::types::EngineSlot(if other == "a" { 0 } else { 1 }), &held);
    let free = pick(&app, "", &held).await;
    assert_eq!(free.worker_id, other);
    let follow = pick(&app, "resp_abc", &held[..2]).await;
    assert_eq!(follow.worker_id, owner, "the follow-up goes where its conversation is stored");
    assert_eq!(follow.degraded_reason(), DegradedReason::DegradedNone);
    let view: serde_json::Value = serde_json::from_slice(&send(&app, Request::get("/v1/assignments").body(Body::empty()).unwrap()).await.1).unwrap();
    let a = view["assignments"].as_array().unwrap().iter().find(|a| a["assignment_id"] == follow.assignment_id).unwrap().clone();
    assert_eq!((a["prompt_tokens"].as_u64(), a["uncached_tokens"].as_u64()), (Some(68 + 32), Some(32)), "the stored 68 tokens count as cached");

    // A suspect owner (the proxy saw it fail) takes no new picks, but still gets its own
    // conversations: no other worker could serve them.
    let failed = pick(&app, "", &[900]).await;
    let mark = if failed.worker_id == owner { failed.assignment_id } else { follow.assignment_id };
    report(&app, vec![Report { assignment_id: mark, kind: ReportKind::ReportCancel as i32, upstream_failure: 3, ..Default::default() }]).await;
    assert_ne!(pick(&app, "", &held).await.worker_id, owner, "suspect: no new picks");
    assert_eq!(pick(&app, "resp_abc", &[7]).await.worker_id, owner, "but its stored conversation still goes there");

    let (status, located) = locate(&app, "resp_abc").await;
    assert_eq!((status, located.as_ref().map(|l| l.worker_id.as_str())), (StatusCode::OK, Some(owner.as_str())));
    assert_eq!(located.unwrap().assignment_id, 0, "a locate records nothing");
    let (_, unknown) = locate(&app, "resp_never").await;
    let unknown = unknown.unwrap();
    assert!(unknown.worker_id.is_empty() && unknown.degraded_reason() == DegradedReason::DegradedNone, "unknown: the default route answers");
    assert_eq!(pick(&app, "resp_never", &[9]).await.degraded_reason(), DegradedReason::DegradedNone, "an unknown id is picked as usual");
    assert_eq!(locate(&app, "bad id").await.0, StatusCode::BAD_REQUEST);

    // The owner leaves: its stored responses are gone with it.
    let remove = Request::builder().method(Method::DELETE).uri(format!("/admin/workers/{owner}?force=true")).header(header::AUTHORIZATION, format!("Bearer {TOKEN}")).body(Body::empty()).unwrap();
    assert!(send(&app, remove).await.0.is_success());
    let (_, gone) = locate(&app, "resp_abc").await;
    assert_eq!(gone.unwrap().degraded_reason(), DegradedReason::DegradedResponseOwnerGone);
    let gone = pick(&app, "resp_abc", &[7]).await;
    assert_eq!((gone.degraded_reason(), gone.worker_id.as_str()), (DegradedReason::DegradedResponseOwnerGone, ""));
    assert_ne!(pick(&app, "", &[7]).await.worker_id, "", "others still pick: {other} serves");
    let metrics = String::from_utf8(send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await.1).unwrap();
    for line in [
        r#"kvroute_response_affinity_total{path="pick",outcome="routed"} 2"#,
        r#"kvroute_response_affinity_total{path="pick",outcome="gone"} 1"#,
        r#"kvroute_response_affinity_total{path="locate",outcome="unknown"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}
