//! Tenants and budgets through the HTTP API, in-process: admission before any worker is
//! chosen, cache-aware charges, settlement from the reports, runtime overrides, the views.

mod common;

use axum::body::{to_bytes, Body};
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use common::TOKEN;
use kvroute_core::wire::{BudgetLimit, PickRequest, PickResponse, Report, ReportBatch, ReportKind};
use kvroute_state::config::Config;
use kvroute_state::app::App;
use kvroute_state::tenancy::{Budget, Limits};
use kvroute_kv::types::EngineSlot;
use prost::Message;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

const API: &str = "api-token-for-tenant-tests-0123456789";

fn budgeted(budgets: &[(&str, Budget)]) -> Config {
    let mut config = common::config(&["a"]);
    config.api_token = Some(API.into());
    config.tenancy.budgets = budgets.iter().map(|(t, b)| (t.to_string(), b.clone())).collect();
    config.tenancy.metrics_tenants = vec!["warm".into()];
    config.validate().expect("valid config");
    config
}

fn tokens(n: u64) -> Budget {
    Budget { tokens_per_minute: Some(n), ..Budget::default() }
}

fn build(config: Config) -> (Router, Arc<common::TestIndex>) {
    let index = Arc::new(common::TestIndex::default());
    let state = App::new(config, index.clone()).expect("valid state");
    (state.router(), index)
}

async fn send(app: &Router, req: axum::http::request::Builder, body: Body) -> (StatusCode, Vec<u8>) {
    let req = req.header(header::AUTHORIZATION, format!("Bearer {API}")).body(body).unwrap();
    let resp = app.clone().oneshot(req).await.expect("router is infallible");
    let status = resp.status();
    (status, to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec())
}

async fn pick(app: &Router, tenant: &str, keys: &[u64], max_tokens: u32) -> PickResponse {
    let req = PickRequest {
        model: "m".into(),
        token_keys: keys.to_vec(),
        block_size: 16,
        prompt_tokens: keys.len() as u32 * 16 + 5,
        max_tokens,
        tenant: tenant.into(),
        ..Default::default()
    };
    let (status, body) = send(app, Request::post("/v1/pick").header(header::CONTENT_TYPE, "application/x-protobuf"), req.encode_to_vec().into()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    PickResponse::decode(&body[..]).unwrap()
}

async fn report(app: &Router, reports: Vec<Report>) {
    let batch = ReportBatch { reports };
    let (status, _) = send(app, Request::post("/v1/report").header(header::CONTENT_TYPE, "application/x-protobuf"), batch.encode_to_vec().into()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

fn complete(id: u64, prompt: u32, cached: u32, completion: u32) -> Vec<Report> {
    vec![
        Report { assignment_id: id, kind: ReportKind::ReportFirstToken as i32, elapsed_ms: 5.0, ..Default::default() },
        Report {
            assignment_id: id,
            kind: ReportKind::ReportComplete as i32,
            elapsed_ms: 9.0,
            prompt_tokens: prompt,
            cached_tokens: Some(cached),
            completion_tokens: completion,
            status: 200,
            ..Default::default()
        },
    ]
}

async fn get(app: &Router, path: &str) -> Value {
    let (status, body) = send(app, Request::get(path), Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    serde_json::from_slice(&body).unwrap()
}

/// The tenant's own budget (no model) in `GET /v1/tenants`.
async fn used(app: &Router, tenant: &str) -> Value {
    let view = get(app, "/v1/tenants").await;
    let t = view["tenants"].as_array().unwrap().iter().find(|t| t["tenant"] == tenant).cloned().unwrap_or_else(|| panic!("{tenant} in {view}"));
    t["budgets"][0].clone()
}

async fn assignments(app: &Router) -> u64 {
    get(app, "/v1/assignments").await["count"].as_u64().unwrap()
}

#[tokio::test]
async fn a_request_that_does_not_fit_is_rejected_before_any_worker_and_settles_free_room() {
    let (app, _) = build(budgeted(&[("team", tokens(2000))]));
    // 2 blocks + 5 = 37 prompt tokens, nothing cached, 900 output reserved: 937 each.
    let first = pick(&app, "team", &[1, 2], 900).await;
    let second = pick(&app, "team", &[3, 4], 900).await;
    assert!(first.rejection.is_none() && second.rejection.is_none() && !first.worker_id.is_empty());
    assert_eq!(used(&app, "team").await["used"]["tokens"], 1874);
    let third = pick(&app, "team", &[5, 6], 900).await;
    let rejection = third.rejection.expect("over budget");
    assert_eq!(rejection.limit(), BudgetLimit::BudgetTokens);
    assert!((1..=60_000).contains(&rejection.retry_after_ms), "{}", rejection.retry_after_ms);
    assert!(rejection.message.contains("2000 tokens per minute"), "{}", rejection.message);
    assert!(third.worker_id.is_empty() && third.assignment_id == 0, "no worker for a rejected request");
    assert_eq!(assignments(&app).await, 2, "nothing recorded for it");

    // The first really cost 37 prompt + 3 completion tokens: the room it frees admits the third.
    report(&app, complete(first.assignment_id, 37, 0, 3)).await;
    assert_eq!(used(&app, "team").await["used"]["tokens"], 40 + 937);
    let third = pick(&app, "team", &[5, 6], 900).await;
    assert!(third.rejection.is_none(), "settled room admits it");
    // A cancel before the first token gives the whole reservation back.
    report(&app, vec![Report { assignment_id: second.assignment_id, kind: ReportKind::ReportCancel as i32, ..Default::default() }]).await;
    let view = used(&app, "team").await;
    assert_eq!(view["used"]["tokens"], 40 + 937);
    assert_eq!(view["used"]["concurrent"], 1, "only the third still runs");
    assert_eq!(view["remaining"]["tokens"], 2000 - 977);

    let metrics = String::from_utf8(send(&app, Request::get("/metrics"), Body::empty()).await.1).unwrap();
    assert!(metrics.contains(r#"kvroute_tenant_requests_total{tenant="other",outcome="rejected_tokens"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"kvroute_picks_total{policy="kvroute",outcome="rejected"} 1"#));
}

#[tokio::test]
async fn tenants_are_charged_their_uncached_tokens() {
    let (app, index) = build(budgeted(&[("warm", tokens(1_000_000)), ("cold", tokens(1_000_000))]));
    // Worker a holds a 60-block shared prefix.
    let shared: Vec<u64> = (1..=60).collect();
    index.hold(EngineSlot(0), &shared);
    let (mut warm_ids, mut cold_ids) = (Vec::new(), Vec::new());
    for i in 0..5u64 {
        // 64 blocks each (1029 prompt tokens): warm's begin with the cached 60.
        let warm: Vec<u64> = shared.iter().copied().chain((0..4).map(|j| 1000 + i * 10 + j)).collect();
        let cold: Vec<u64> = (0..64).map(|j| 10_000 + i * 100 + j).collect();
        warm_ids.push(pick(&app, "warm", &warm, 10).await.assignment_id);
        cold_ids.push(pick(&app, "cold", &cold, 10).await.assignment_id);
    }
    // Reserved: warm (1029 - 960 + 10) x 5, cold (1029 + 10) x 5.
    let (warm, cold) = (used(&app, "warm").await["used"]["tokens"].as_u64().unwrap(), used(&app, "cold").await["used"]["tokens"].as_u64().unwrap());
    assert_eq!((warm, cold), (79 * 5, 1039 * 5));
    // Settled from usage: what the engine served from cache is what it did not charge.
    for id in warm_ids {
        report(&app, complete(id, 1029, 960, 10)).await;
    }
    for id in cold_ids {
        report(&app, complete(id, 1029, 0, 10)).await;
    }
    let (warm, cold) = (used(&app, "warm").await["used"]["tokens"].as_u64().unwrap(), used(&app, "cold").await["used"]["tokens"].as_u64().unwrap());
    assert_eq!((warm, cold), (79 * 5, 1039 * 5), "same prompt tokens, charged in proportion to the uncached ones");
    let metrics = String::from_utf8(send(&app, Request::get("/metrics"), Body::empty()).await.1).unwrap();
    assert!(metrics.contains(r#"kvroute_tenant_tokens_total{tenant="warm",kind="cached"} 4800"#), "allowlisted tenant has its series");
    assert!(metrics.contains(r#"kvroute_tenant_tokens_total{tenant="other",kind="charged"} 5195"#), "cold is `other`");
}

#[tokio::test]
async fn requests_and_concurrency_limits_and_per_model_budgets() {
    let budget = Budget {
        requests_per_minute: Some(2),
        models: [("m".to_string(), Limits { concurrent_requests: Some(1), ..Limits::default() })].into(),
        ..Budget::default()
    };
    let (app, _) = build(budgeted(&[("*", budget)]));
    // Model m has its own budget (1 at a time); the tenant's rpm does not apply to it.
    let a = pick(&app, "anyone", &[1], 1).await;
    let b = pick(&app, "anyone", &[2], 1).await;
    assert!(a.rejection.is_none());
    assert_eq!(b.rejection.as_ref().map(|r| r.limit()), Some(BudgetLimit::BudgetConcurrency));
    report(&app, complete(a.assignment_id, 21, 0, 1)).await;
    assert!(pick(&app, "anyone", &[2], 1).await.rejection.is_none(), "the completion freed the slot");
    // "*" gives every tenant its own copy.
    assert!(pick(&app, "someone-else", &[3], 1).await.rejection.is_none());
}

#[tokio::test]
async fn budgets_change_at_runtime_through_the_admin_api() {
    let (app, _) = build(budgeted(&[("team", tokens(1_000_000))]));
    let admin = |method: Method, path: &str, body: Value| {
        let req = Request::builder().method(method).uri(path).header(header::AUTHORIZATION, format!("Bearer {TOKEN}")).header(header::CONTENT_TYPE, "application/json");
        let app = app.clone();
        async move {
            let resp = app.oneshot(req.body(Body::from(body.to_string())).unwrap()).await.unwrap();
            resp.status()
        }
    };
    // A tenant nobody configured gets a budget at runtime.
    assert_eq!(admin(Method::PUT, "/admin/tenants/newcomer/budget", json!({"requests_per_minute": 1})).await, StatusCode::OK);
    assert!(pick(&app, "newcomer", &[1], 1).await.rejection.is_none());
    assert_eq!(pick(&app, "newcomer", &[2], 1).await.rejection.map(|r| r.limit()), Some(BudgetLimit::BudgetRequests));
    let view = get(&app, "/v1/tenants").await;
    let newcomer = view["tenants"].as_array().unwrap().iter().find(|t| t["tenant"] == "newcomer").unwrap().clone();
    assert_eq!(newcomer["budgets"][0]["overridden"], true);
    assert_eq!(newcomer["budgets"][0]["limits"]["requests_per_minute"], 1);
    assert_eq!(admin(Method::DELETE, "/admin/tenants/newcomer/budget", json!({})).await, StatusCode::NO_CONTENT);
    assert!(pick(&app, "newcomer", &[2], 1).await.rejection.is_none(), "unbudgeted again");
    // Bad input says why; the admin token is needed.
    assert_eq!(admin(Method::PUT, "/admin/tenants/team/budget", json!({"tokens_per_minute": 0})).await, StatusCode::BAD_REQUEST);
    assert_eq!(admin(Method::PUT, "/admin/tenants/team/budget", json!({"tokens": 5})).await, StatusCode::BAD_REQUEST);
    let (status, _) = send(&app, Request::put("/admin/tenants/team/budget").header(header::CONTENT_TYPE, "application/json"), Body::from("{}")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the API token is not the admin token");
}

#[tokio::test]
async fn tenants_must_be_names_and_budgets_need_an_authenticated_proxy() {
    let (app, _) = build(budgeted(&[("team", tokens(10))]));
    let req = PickRequest { model: "m".into(), tenant: "has space".into(), ..Default::default() };
    let (status, body) = send(&app, Request::post("/v1/pick").header(header::CONTENT_TYPE, "application/x-protobuf"), req.encode_to_vec().into()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&body));
    // An untenanted request is not budgeted.
    assert!(pick(&app, "", &[1, 2, 3], 100).await.rejection.is_none());

    let mut open = common::config(&["a"]);
    open.tenancy.budgets.insert("team".into(), tokens(10));
    let err = open.validate().unwrap_err().to_string();
    assert!(err.contains("api_token"), "{err}");
    let mut zero = budgeted(&[]);
    zero.tenancy.budgets.insert("team".into(), tokens(0));
    assert!(zero.validate().unwrap_err().to_string().contains("admits nothing"));
}
