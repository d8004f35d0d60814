//! The filter's protocol handling through real Envoy, against in-process fixtures: a fake
//! state service that answers as told and fake workers that record what reached them. These
//! pin the filter's side of the contract (headers, fallbacks, reports, both routing modes)
//! independently of the real state service's policy.

use anyhow::Result;
use kvroute_core::wire::{DegradedReason, Endpoint, ReportKind};
use kvroute_e2e::envoy::{worker_cluster, Envoy, EnvoyOptions, Mode};
use kvroute_e2e::fake::{json_body, stream_chunks, FakeState, FakeWorker, PickBehavior};
use kvroute_e2e::net::wait_for;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

struct Rig {
    workers: Vec<FakeWorker>,
    state: FakeState,
    envoy: Envoy,
    client: reqwest::Client,
}

async fn rig(mode: Mode, plugin: Value) -> Result<Rig> {
    let workers = vec![FakeWorker::start("A").await?, FakeWorker::start("B").await?];
    let state = FakeState::start(route_to(&workers, 1)).await?;
    let envoy = Envoy::start(EnvoyOptions {
        mode,
        worker_ports: workers.iter().map(|w| w.port).collect(),
        state_port: state.port,
        plugin,
    })
    .await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build()?;
    Ok(Rig { workers, state, envoy, client })
}

fn route_to(workers: &[FakeWorker], i: usize) -> PickBehavior {
    PickBehavior::Route { worker: workers[i].name.clone(), endpoint: workers[i].addr(), cluster: worker_cluster(i) }
}

fn completion(stream: bool) -> Value {
    json!({"model": "m", "prompt": "Once upon a time ".repeat(40), "max_tokens": 4, "stream": stream})
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

#[tokio::test]
async fn endpoint_mode_routes_to_the_pick_and_reports() -> Result<()> {
    let rig = rig(Mode::Endpoint, json!({})).await?;
    for _ in 0..4 {
        let r = rig.client.post(rig.envoy.url("/v1/completions")).json(&completion(false)).send().await?;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-sim-worker"), "B");
        assert!(header(&r, "x-kvroute-decision").starts_with("worker=B;"), "{:?}", r.headers());
        assert_eq!(header(&r, "x-kvroute-fallback"), "");
        assert_eq!(r.text().await?, json_body("B"));
    }
    let picks = rig.state.picks();
    assert_eq!(picks.len(), 4);
    assert_eq!(picks[0].model, "m");
    assert_eq!(picks[0].endpoint, Endpoint::Completions as i32);
    assert!(picks[0].prompt_text.starts_with("Once upon"));
    assert_eq!(picks[0].text_chunk_keys.len(), "Once upon a time ".len() * 40 / 256);
    // Every assignment gets a first token and a completion with the body's usage.
    let reports = wait_for("8 reports", Duration::from_secs(10), || async {
        let r = rig.state.reports();
        (r.len() >= 8).then_some(r)
    })
    .await?;
    for id in 1..=4u64 {
        let kinds: Vec<i32> = reports.iter().filter(|r| r.assignment_id == id).map(|r| r.kind).collect();
        assert_eq!(kinds, vec![ReportKind::ReportFirstToken as i32, ReportKind::ReportComplete as i32]);
    }
    let complete = reports.iter().find(|r| r.kind == ReportKind::ReportComplete as i32).unwrap();
    assert_eq!((complete.prompt_tokens, complete.completion_tokens, complete.status), (21, 3, 200));
    assert_eq!(rig.envoy.counter("kvroute_routed").await?, 4);
    assert_eq!(rig.envoy.counter("kvroute_picks").await?, 4);
    assert_eq!(rig.envoy.counter("kvroute_llm_requests").await?, 4);
    Ok(())
}

#[tokio::test]
async fn token_prompts_carry_exact_keys_and_streams_pass_byte_for_byte() -> Result<()> {
    let rig = rig(Mode::Endpoint, json!({})).await?;
    let tokens: Vec<u32> = (0..40).collect();
    let body = json!({"model": "m", "prompt": tokens, "stream": true, "stream_options": {"include_usage": true}});
    let r = rig.client.post(rig.envoy.url("/v1/completions")).json(&body).send().await?;
    assert_eq!(header(&r, "x-sim-worker"), "B");
    assert_eq!(r.bytes().await?, stream_chunks("B").concat().as_bytes());
    let pick = &rig.state.picks()[0];
    assert_eq!((pick.token_keys.len(), pick.block_size, pick.prompt_tokens), (2, 16, 40));
    assert!(pick.prompt_text.is_empty() && pick.stream);
    let reports = wait_for("complete report", Duration::from_secs(10), || async {
        let r = rig.state.reports();
        r.iter().any(|r| r.kind == ReportKind::ReportComplete as i32).then_some(r)
    })
    .await?;
    let complete = reports.iter().find(|r| r.kind == ReportKind::ReportComplete as i32).unwrap();
    assert_eq!((complete.prompt_tokens, complete.completion_tokens), (21, 5));

    // Without include_usage the stream is not read (vLLM sends no usage then): its chunks are
    // counted; the bytes still pass unchanged.
    let body = json!({"model": "m", "prompt": tokens, "stream": true});
    let r = rig.client.post(rig.envoy.url("/v1/completions")).json(&body).send().await?;
    assert_eq!(r.bytes().await?, stream_chunks("B").concat().as_bytes());
    let reports = wait_for("second complete report", Duration::from_secs(10), || async {
        let r = rig.state.reports();
        (r.iter().filter(|r| r.kind == ReportKind::ReportComplete as i32).count() == 2).then_some(r)
    })
    .await?;
    let second = reports.iter().filter(|r| r.kind == ReportKind::ReportComplete as i32).nth(1).unwrap();
    assert_eq!(second.prompt_tokens, 0, "usage not read");
    assert!(second.completion_tokens >= 1, "chunks counted: {second:?}");
    Ok(())
}

#[tokio::test]
async fn cluster_mode_routes_by_cluster_header() -> Result<()> {
    let rig = rig(Mode::Cluster, json!({})).await?;
    for i in [0usize, 1, 0] {
        rig.state.set_behavior(route_to(&rig.workers, i));
        let r = rig.client.post(rig.envoy.url("/v1/chat/completions"))
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await?;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-sim-worker"), rig.workers[i].name);
    }
    // Fallback in cluster mode: the default route still answers.
    rig.state.set_behavior(PickBehavior::Status(500));
    let r = rig.client.post(rig.envoy.url("/v1/completions")).json(&completion(false)).send().await?;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-kvroute-fallback"), "pick_status");
    Ok(())
}

#[tokio::test]
async fn clients_cannot_choose_their_worker() -> Result<()> {
    let rig = rig(Mode::Endpoint, json!({})).await?;
    let a = rig.workers[0].addr();
    for _ in 0..3 {
        let r = rig.client.post(rig.envoy.url("/v1/completions"))
            .header("x-gateway-destination-endpoint", &a)
            .header("x-kvroute-cluster", worker_cluster(0))
            .header("x-kvroute-decision", "worker=A")
            .json(&completion(false))
            .send()
            .await?;
        assert_eq!(header(&r, "x-sim-worker"), "B");
    }
    let seen = rig.workers[1].seen();
    assert!(seen.iter().all(|s| s.headers.get("x-kvroute-cluster").is_none() && s.headers.get("x-kvroute-decision").is_none()));
    assert!(seen.iter().all(|s| s.headers.get("x-gateway-destination-endpoint").map(|v| v.as_bytes()) == Some(rig.workers[1].addr().as_bytes())));
    // Non-LLM paths: the override header is removed too, so round robin decides.
    let mut names = Vec::new();
    for _ in 0..4 {
        let r = rig.client.get(rig.envoy.url("/health")).header("x-gateway-destination-endpoint", &a).send().await?;
        names.push(header(&r, "x-sim-worker"));
    }
    assert!(names.contains(&"B".to_string()), "{names:?}");
    Ok(())
}

#[tokio::test]
async fn failures_fall_back_and_are_counted() -> Result<()> {
    let mut rig = rig(Mode::Endpoint, json!({"max_body_bytes": 4096, "pick_timeout_ms": 1000})).await?;
    let post = |body: Vec<u8>| rig.client.post(rig.envoy.url("/v1/completions")).header("content-type", "application/json").body(body).send();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "unparsable_body"),
        (serde_json::to_vec(&json!({"model": "m", "prompt": "x".repeat(10_000)}))?, "body_too_large"),
    ];
    for (body, reason) in cases {
        let sent = body.clone();
        let r = post(body).await?;
        assert_eq!(r.status(), 200, "{reason}");
        assert_eq!(header(&r, "x-kvroute-fallback"), reason);
        let arrived = rig.workers.iter().flat_map(|w| w.seen()).any(|s| s.body == sent);
        assert!(arrived, "{reason}: body must reach a worker unchanged");
        assert_eq!(rig.envoy.counter(&format!("kvroute_fallback_{reason}")).await?, 1);
    }
    let mut counted: HashMap<&str, u64> = HashMap::new();
    for (behavior, reason) in [
        (PickBehavior::Status(500), "pick_status"),
        (PickBehavior::Status(503), "pick_unavailable"),
        (PickBehavior::Garbage, "pick_decode"),
        (PickBehavior::Degraded(DegradedReason::DegradedUnknownModel), "unknown_model"),
        (PickBehavior::Degraded(DegradedReason::DegradedNoHealthyWorker), "no_healthy_worker"),
        // Any other reason, or one this filter does not know yet, is the generic fallback.
        (PickBehavior::Degraded(DegradedReason::DegradedStateUnavailable), "degraded"),
        (PickBehavior::DegradedRaw(99), "degraded"),
    ] {
        rig.state.set_behavior(behavior);
        let r = post(serde_json::to_vec(&completion(false))?).await?;
        assert_eq!((r.status().as_u16(), header(&r, "x-kvroute-fallback")), (200, reason.to_string()));
        let want = counted.entry(reason).or_insert(0);
        *want += 1;
        assert_eq!(rig.envoy.counter(&format!("kvroute_fallback_{reason}")).await?, *want, "{reason}");
    }
    // Slower than pick_timeout_ms: Envoy's 504, counted as a timeout.
    rig.state.set_behavior(PickBehavior::Slow { millis: 2500, then: Box::new(route_to(&rig.workers, 0)) });
    let r = post(serde_json::to_vec(&completion(false))?).await?;
    assert_eq!((r.status().as_u16(), header(&r, "x-kvroute-fallback")), (200, "pick_timeout".to_string()));
    assert_eq!(rig.envoy.counter("kvroute_fallback_pick_timeout").await?, 1);
    // Killed: Envoy's pooled connection to it is gone too, so this is a connect failure.
    rig.state.set_behavior(route_to(&rig.workers, 0));
    rig.state.stop().await;
    let r = post(serde_json::to_vec(&completion(true))?).await?;
    assert_eq!((r.status().as_u16(), header(&r, "x-kvroute-fallback")), (200, "pick_unavailable".to_string()));
    let worker = header(&r, "x-sim-worker");
    assert_eq!(r.bytes().await?, stream_chunks(&worker).concat().as_bytes());
    rig.state.restart().await?;
    let r = post(serde_json::to_vec(&completion(false))?).await?;
    assert_eq!((header(&r, "x-sim-worker"), header(&r, "x-kvroute-fallback")), ("A".to_string(), String::new()));
    Ok(())
}

#[tokio::test]
async fn models_and_other_paths_pass_through_untouched() -> Result<()> {
    let rig = rig(Mode::Endpoint, json!({})).await?;
    let r = rig.client.get(rig.envoy.url("/v1/models")).send().await?;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "x-kvroute-decision").is_empty() && header(&r, "x-kvroute-fallback").is_empty());
    let w = header(&r, "x-sim-worker");
    assert!(r.text().await?.contains(&format!("\"owned_by\":\"{w}\"")));
    let r = rig.client.post(rig.envoy.url("/tokenize")).body("abc").send().await?;
    assert!(r.text().await?.starts_with("other /tokenize on "));
    assert!(rig.state.picks().is_empty());
    Ok(())
}

#[tokio::test]
async fn a_bad_plugin_config_is_rejected_with_a_clear_log_line() -> Result<()> {
    let state = FakeState::start(PickBehavior::Status(500)).await?;
    let worker = FakeWorker::start("A").await?;
    let started = Envoy::start(EnvoyOptions {
        mode: Mode::Endpoint,
        worker_ports: vec![worker.port],
        state_port: state.port,
        plugin: json!({"block_size": 0}),
    })
    .await;
    let err = format!("{:#}", started.err().expect("envoy must refuse the filter config"));
    assert!(err.contains("kvroute: rejecting plugin configuration: `block_size` must be greater than zero"), "{err}");
    Ok(())
}
