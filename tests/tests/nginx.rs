//! The same kvroute_filter.wasm routing inside NGINX (Kong's ngx_wasm_module) instead of Envoy:
//! shared-prefix follow-ups land on the warm worker; a forged routing header steers nothing,
//! with the filter working or with the state service gone; with the state service killed every
//! request still succeeds (fail open to NGINX's own balancing); reports reach the state service.
//! Needs `KVROUTE_NGINX` (an NGINX built with ngx_wasm_module; none comes from a registry):
//! without it each test prints one "skipped" line and passes.

use anyhow::Result;
use kvroute_e2e::llm::{completion, concat, header, tokens};
use kvroute_e2e::nginx::{self, Nginx};
use kvroute_e2e::stack::{Stack, StackOptions, MODEL};
use serde_json::json;
use std::collections::BTreeSet;

async fn start(workers: usize) -> Result<Option<(Stack, Nginx)>> {
    let Some(bin) = nginx::binary() else {
        eprintln!("{}", nginx::SKIP);
        return Ok(None);
    };
    let s = Stack::start(StackOptions { workers, ..StackOptions::default() }).await?;
    let ports: Vec<u16> = (0..workers as u16).map(|i| s.http_base + i).collect();
    let n = Nginx::start(&bin, &ports, s.state_port, &json!({})).await?;
    Ok(Some((s, n)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_land_on_the_warm_worker_through_nginx() -> Result<()> {
    let Some((s, n)) = start(3).await? else { return Ok(()) };
    let client = reqwest::Client::new();
    let shared = tokens(91, 512);
    let r = client.post(n.url("/v1/completions")).json(&completion(MODEL, &concat(&shared, &tokens(1, 16)), 2, false)).send().await?;
    assert_eq!(r.status(), 200, "{}", n.log_tail());
    let first = header(&r, "x-sim-worker");
    let decision = header(&r, "x-kvroute-decision");
    assert_eq!(kvroute_e2e::llm::decision_field(&decision, "worker").as_deref(), Some(first.as_str()), "served where kvroute chose: {decision:?}\n{}", n.log_tail());
    r.bytes().await?;
    s.wait_idle().await?;
    s.wait_index(first.parse()?, 33).await?;
    for i in 2..5 {
        let r = client.post(n.url("/v1/completions")).json(&completion(MODEL, &concat(&shared, &tokens(i, 16)), 2, true)).send().await?;
        let decision = header(&r, "x-kvroute-decision");
        assert_eq!(header(&r, "x-sim-worker"), first, "follow-up {i}: {decision} (the first: {})", s.worker_view(first.parse()?).await?);
        let matched: u32 = kvroute_e2e::llm::decision_field(&decision, "matched").and_then(|m| m.parse().ok()).unwrap_or(0);
        assert!(matched >= 30, "the shared 32 blocks matched: {decision}");
        r.bytes().await?;
        s.wait_idle().await?;
    }
    // The filter's reports reached the state service (first token and completion of each).
    let metrics = s.client.get(s.state_url("/metrics")).send().await?.text().await?;
    let applied = |kind: &str| {
        metrics.lines().find(|l| l.starts_with(&format!("kvroute_reports_total{{kind=\"{kind}\",outcome=\"applied\"}}"))).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).unwrap_or(0.0)
    };
    assert!(applied("first_token") >= 4.0 && applied("complete") >= 4.0, "{metrics}");
    // NGINX names the upstream that answered as IP and port apart: still no failover seen.
    assert!(!metrics.contains("kvroute_upstream_failures_total{"), "no upstream failure reported: {metrics}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_headers_steer_nothing_and_a_dead_state_service_fails_open() -> Result<()> {
    let Some((mut s, n)) = start(2).await? else { return Ok(()) };
    let client = reqwest::Client::new();
    let victim = format!("127.0.0.1:{}", s.http_base + 1);
    let forge = |r: reqwest::RequestBuilder| r.header("x-gateway-destination-endpoint", &victim).header("x-kvroute-cluster", "worker_1");
    // Picks work: a forged header changes no decision (kvroute picks where the prompt is warm).
    let warm = tokens(17, 256);
    let r = client.post(s.worker_url(0, "/v1/completions")).json(&completion(MODEL, &warm, 1, false)).send().await?;
    r.bytes().await?;
    s.wait_idle().await?;
    for i in 0..3 {
        let body = completion(MODEL, &concat(&warm, &tokens(100 + i, 16)), 1, false);
        let r = forge(client.post(n.url("/v1/completions"))).json(&body).send().await?;
        assert_eq!(header(&r, "x-sim-worker"), "0", "forged toward worker 1, kvroute chose the warm worker 0");
        r.bytes().await?;
    }
    // State service gone: every request succeeds on NGINX's own balancing, and forged headers
    // still name nothing (requests spread over both workers).
    s.kill_state();
    let mut seen = BTreeSet::new();
    for i in 0..8 {
        let r = forge(client.post(n.url("/v1/completions"))).json(&completion(MODEL, &tokens(300 + i, 64), 1, false)).send().await?;
        assert_eq!(r.status(), 200, "fail open:\n{}", n.log_tail());
        seen.insert(header(&r, "x-sim-worker"));
        r.bytes().await?;
        // A non-LLM path too.
        let r = forge(client.get(n.url("/v1/models"))).send().await?;
        assert_eq!(r.status(), 200);
        seen.insert(header(&r, "x-sim-worker"));
    }
    assert_eq!(seen.len(), 2, "round robin, not the forged target: {seen:?}");
    Ok(())
}

/// `envoy/nginx-wasm.conf` is the tested template with example values (rewrite it with
/// `KVROUTE_BLESS=1`).
#[test]
fn the_nginx_example_is_the_tested_template() -> Result<()> {
    let path = kvroute_e2e::paths::repo_root().join("envoy/nginx-wasm.conf");
    let example = nginx::example()?;
    if std::env::var_os("KVROUTE_BLESS").is_some() {
        std::fs::write(&path, &example)?;
    }
    assert_eq!(std::fs::read_to_string(&path)?, example, "envoy/nginx-wasm.conf is stale: KVROUTE_BLESS=1 cargo test -p kvroute-e2e --test nginx");
    Ok(())
}
