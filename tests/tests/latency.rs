//! Added latency of the filter, measured (not asserted: these machines are noisy). Run with
//! `cargo test -p kvroute-e2e --test latency -- --ignored --nocapture`. Compares, on loopback,
//! sequential small requests: straight to a fake worker, through Envoy on a pass-through path,
//! and through Envoy on an LLM path (body buffering + parse + pick round trip to a fake state
//! service that answers at once) in both routing modes.

use anyhow::Result;
use kvroute_e2e::envoy::{worker_cluster, Envoy, EnvoyOptions, Mode};
use kvroute_e2e::fake::{FakeState, FakeWorker, PickBehavior};
use serde_json::json;
use std::time::Instant;

const N: usize = 400;

async fn measure(client: &reqwest::Client, url: &str, body: &serde_json::Value) -> Result<(f64, f64)> {
    let mut ms = Vec::with_capacity(N);
    for i in 0..N + 20 {
        let t = Instant::now();
        client.post(url).json(body).send().await?.bytes().await?;
        if i >= 20 {
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    Ok((ms[N / 2], ms[N * 99 / 100]))
}

#[tokio::test]
#[ignore = "benchmark: prints figures"]
async fn added_latency() -> Result<()> {
    let workers = vec![FakeWorker::start("A").await?, FakeWorker::start("B").await?];
    let client = reqwest::Client::new();
    let body = json!({"model": "m", "prompt": "You are a helpful assistant. ".repeat(60), "max_tokens": 4});
    let (p50, p99) = measure(&client, &format!("http://{}/v1/completions", workers[1].addr()), &body).await?;
    println!("direct to worker                 p50 {p50:.3} ms  p99 {p99:.3} ms");
    for mode in [Mode::Endpoint, Mode::Cluster] {
        let state = FakeState::start(PickBehavior::Route { worker: "B".into(), endpoint: workers[1].addr(), cluster: worker_cluster(1) }).await?;
        let envoy = Envoy::start(EnvoyOptions { mode, worker_ports: workers.iter().map(|w| w.port).collect(), state_port: state.port, plugin: json!({}) }).await?;
        let (p50, p99) = measure(&client, &envoy.url("/other"), &body).await?;
        println!("{mode:?}: envoy, pass-through path   p50 {p50:.3} ms  p99 {p99:.3} ms");
        let (p50, p99) = measure(&client, &envoy.url("/v1/completions"), &body).await?;
        println!("{mode:?}: envoy + kvroute pick       p50 {p50:.3} ms  p99 {p99:.3} ms");
    }
    Ok(())
}

/// Pick round trip to the real state service (token-id prompts, 4 workers), as the filter
/// measured it (`kvroute_pick_latency_us`, Envoy's histogram quantiles).
#[tokio::test]
#[ignore = "benchmark: prints figures"]
async fn real_state_service_pick_latency() -> Result<()> {
    use kvroute_e2e::llm::{completion, tokens};
    use kvroute_e2e::stack::{Stack, StackOptions, MODEL};
    let s = Stack::start(StackOptions { mode: Mode::Endpoint, workers: 4, plugin: json!({}), time_scale: 0.05 }).await?;
    for i in 0..300u32 {
        let body = completion(MODEL, &tokens(i % 20, 512), 1, false);
        s.client.post(s.envoy.url("/v1/completions")).json(&body).send().await?.bytes().await?;
    }
    let url = format!("http://127.0.0.1:{}/stats?filter=kvroute_pick_latency_us", s.envoy.admin_port);
    // Envoy publishes histogram quantiles at its stats flush (every 5 s by default).
    let text = kvroute_e2e::net::wait_for("histogram flush", std::time::Duration::from_secs(20), || async {
        let t = reqwest::get(&url).await.ok()?.text().await.ok()?;
        (!t.contains("No recorded values")).then_some(t)
    })
    .await?;
    println!("{text}");
    Ok(())
}
