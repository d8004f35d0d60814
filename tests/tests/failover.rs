//! Must-show failure handling (issue 13) through real Envoy, the real state service and
//! simulated vLLM workers, one process each so a worker can die like a crashing vLLM server:
//!
//! - a worker killed under load costs at most the requests running on it: every request that
//!   started after its death is served (the pick names fallbacks, Envoy's retry policy moves
//!   down the override-host list, the filter reports the failure);
//! - a reported upstream failure stops picks to that worker at once (no scrape involved), and
//!   a `/health` probe brings it back when it answers again;
//! - a drained worker finishes its in-flight request and gets no new ones, then leaves.
//!
//! The first two are Envoy-only: they need the proxy to move down the pick's fallback list
//! (override-host with retries); NGINX's `proxy_pass` takes the one target of the variable
//! (`fallback_endpoints = 0`). The drain runs through NGINX too when `KVROUTE_NGINX` is set.

use anyhow::Result;
use kvroute_e2e::envoy::Mode;
use kvroute_e2e::host::{for_each_host, Host};
use kvroute_e2e::llm::{completion, concat, decision_field, header, tokens};
use kvroute_e2e::net::wait_for;
use kvroute_e2e::stack::{Stack, StackOptions, StateToml, MODEL};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ADMIN_TOKEN: &str = "failover-test-admin-token";

/// Puts `prompt` into worker `i`'s cache by asking it directly, then waits for its KV events.
async fn warm(s: &Stack, i: usize, prompt: &[u32]) -> Result<()> {
    let before = s.worker_view(i).await?["index_blocks"].as_u64().unwrap_or(0);
    let r = s.client.post(s.worker_url(i, "/v1/completions")).json(&completion(MODEL, prompt, 1, false)).send().await?;
    assert_eq!(r.status(), 200);
    r.bytes().await?;
    s.wait_index(i, before + (prompt.len() / 16) as u64).await
}

/// One request of the load: when it started, whether it was served completely, and by whom.
struct Outcome {
    started: Instant,
    served: bool,
    status: u16,
    worker: String,
}

async fn streamed(client: &reqwest::Client, url: &str, prompt: &[u32]) -> Outcome {
    let started = Instant::now();
    let sent = client.post(url).json(&completion(MODEL, prompt, 12, true)).send().await;
    let Ok(r) = sent else { return Outcome { started, served: false, status: 0, worker: String::new() } };
    let (status, worker) = (r.status().as_u16(), header(&r, "x-sim-worker"));
    let body = r.text().await.unwrap_or_default();
    Outcome { started, served: status == 200 && body.contains("[DONE]"), status, worker }
}

#[tokio::test]
async fn a_worker_killed_under_load_costs_only_the_requests_running_on_it_endpoint_mode() -> Result<()> {
    worker_killed_under_load(Mode::Endpoint).await
}

#[tokio::test]
async fn a_worker_killed_under_load_costs_only_the_requests_running_on_it_cluster_mode() -> Result<()> {
    worker_killed_under_load(Mode::Cluster).await
}

async fn worker_killed_under_load(mode: Mode) -> Result<()> {
    const TOTAL: usize = 96;
    const CONCURRENCY: usize = 8;
    const KILL_AFTER: usize = 24;
    let mut s = Stack::start(StackOptions { mode, workers: 3, ..StackOptions::default() }).await?;
    // Six shared prefixes, so the picks spread over all three workers by cache.
    let prefixes: Arc<Vec<Vec<u32>>> = Arc::new((0..6).map(|p| tokens(7000 + p, 128)).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let url = s.envoy().url("/v1/completions");
    let clients: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (client, url, prefixes, next, done) = (s.client.clone(), url.clone(), prefixes.clone(), next.clone(), done.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    if n >= TOTAL {
                        return out;
                    }
                    let prompt = concat(&prefixes[n % prefixes.len()], &tokens(9000 + n as u32, 16));
                    out.push(streamed(&client, &url, &prompt).await);
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    wait_for("the first requests served", Duration::from_secs(60), || async { (done.load(Ordering::SeqCst) >= KILL_AFTER).then_some(()) }).await?;
    s.kill_worker(1);
    let killed_at = Instant::now();
    let mut outcomes = Vec::new();
    for c in clients {
        outcomes.extend(c.await?);
    }
    let after: Vec<&Outcome> = outcomes.iter().filter(|o| o.started > killed_at).collect();
    let failed_after: Vec<(u16, &str)> = after.iter().filter(|o| !o.served).map(|o| (o.status, o.worker.as_str())).collect();
    let failed_before = outcomes.iter().filter(|o| o.started <= killed_at && !o.served).count();
    println!(
        "{mode:?} mode: killed worker 1 after {KILL_AFTER} of {TOTAL}: {} started after its death, {} of them failed; {failed_before} running at the kill failed",
        after.len(),
        failed_after.len()
    );
    assert!(after.len() >= TOTAL / 2, "most of the load came after the kill");
    assert!(failed_after.is_empty(), "requests started after the worker died must be served: {failed_after:?}\n{}", s.log_tails());
    assert!(failed_before <= CONCURRENCY, "at most the requests in flight at the kill");
    assert!(after.iter().all(|o| o.worker != "1"));
    // Which path saved the later requests is a race: Envoy retrying a pick that still named
    // the dead worker, or the failure reports of the requests running at the kill taking it
    // out before any pick named it (then no retry is needed; seen in CI). The retry path is
    // shown deterministically by `a_reported_failure_stops_picks_until_the_worker_answers_again`;
    // here either way the state service must have stopped picking it.
    let stats = s.envoy().stats("upstream_rq_retry$").await?;
    let retries: u64 = stats.iter().filter_map(|(_, v)| v.parse::<u64>().ok()).sum();
    println!("{mode:?} mode: {retries} Envoy retries");
    let w1 = s.worker_view(1).await?;
    assert_eq!(w1["takes_picks"], false, "{w1}");
    Ok(())
}

#[tokio::test]
async fn a_reported_failure_stops_picks_until_the_worker_answers_again() -> Result<()> {
    // No metrics scraping: only the proxy's report can take the worker out, and only the
    // `/health` probe can bring it back.
    let state = StateToml { scrape_metrics: false, ..StateToml::default() };
    let mut s = Stack::start(StackOptions { workers: 2, state, ..StackOptions::default() }).await?;
    let prefix = tokens(4100, 160);
    warm(&s, 0, &prefix).await?;
    s.kill_worker(0);
    let url = s.envoy().url("/v1/completions");
    let r = s.client.post(&url).json(&completion(MODEL, &concat(&prefix, &tokens(4101, 16)), 2, false)).send().await?;
    let decision = header(&r, "x-kvroute-decision");
    assert_eq!(r.status(), 200, "failed over: {decision}");
    assert_eq!(decision_field(&decision, "worker").as_deref(), Some("0"), "the pick still chose the warm worker");
    assert_eq!(header(&r, "x-sim-worker"), "1", "Envoy moved down the override list");
    r.bytes().await?;
    let w0 = wait_for("worker 0 suspect", Duration::from_secs(10), || async {
        let w = s.worker_view(0).await.ok()?;
        (w["takes_picks"] == false).then_some(w)
    })
    .await?;
    assert_eq!(w0["suspect"], "failed_over", "{w0}");
    assert_eq!(w0["healthy"], true, "no scrape took it out");
    for i in 0..3u32 {
        let r = s.client.post(&url).json(&completion(MODEL, &concat(&prefix, &tokens(4200 + i, 16)), 2, false)).send().await?;
        let decision = header(&r, "x-kvroute-decision");
        assert_eq!(decision_field(&decision, "worker").as_deref(), Some("1"), "no more picks to the dead worker: {decision}");
        r.bytes().await?;
    }
    s.restart_worker(0).await?;
    wait_for("worker 0 back after a good probe", Duration::from_secs(10), || async {
        (s.worker_view(0).await.ok()?["takes_picks"] == true).then_some(())
    })
    .await?;
    Ok(())
}

/// A worker frozen (SIGSTOP: it accepts connections, never answers): a stream picked for it
/// gets no response head and moves to the next endpoint of its list after
/// `first_byte_timeout_ms`, before anything reached the client; a stream it had already begun
/// is held, never sent twice, and finishes when the worker resumes.
#[tokio::test]
async fn a_frozen_worker_costs_a_new_stream_at_most_the_first_byte_bound() -> Result<()> {
    const BOUND_MS: u64 = 1500;
    let plugin = serde_json::json!({ "first_byte_timeout_ms": BOUND_MS });
    let s = Stack::start(StackOptions { workers: 3, plugin, ..StackOptions::default() }).await?;
    let prefix = tokens(5100, 256);
    warm(&s, 0, &prefix).await?;
    let url = s.envoy().url("/v1/completions");

    // A long stream begun on worker 0 before it freezes.
    let begun = s.client.post(&url).json(&completion(MODEL, &concat(&prefix, &tokens(5101, 16)), 300, true)).send().await?;
    assert_eq!(header(&begun, "x-sim-worker"), "0", "{}", header(&begun, "x-kvroute-decision"));
    let held = tokio::spawn(async move { begun.text().await.unwrap_or_default() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.freeze_worker(0, true)?;

    // A new stream for the warm (frozen) worker.
    let t = Instant::now();
    let r = s.client.post(&url).json(&completion(MODEL, &concat(&prefix, &tokens(5102, 16)), 8, true)).send().await?;
    let took = t.elapsed();
    let decision = header(&r, "x-kvroute-decision");
    let served_by = header(&r, "x-sim-worker");
    let body = r.text().await?;
    println!("new stream picked {:?}, served by {served_by} after {took:?} (bound {BOUND_MS} ms)", decision_field(&decision, "worker"));
    assert!(body.contains("[DONE]"), "served whole: {body}");
    assert_ne!(served_by, "0", "moved off the frozen worker");
    if decision_field(&decision, "worker").as_deref() == Some("0") {
        assert!(took >= Duration::from_millis(BOUND_MS) && took < Duration::from_millis(BOUND_MS + 3000), "moved after the bound: {took:?}");
    }

    // The begun stream was held, not retried elsewhere: it finishes on worker 0 once it resumes.
    assert!(!held.is_finished(), "a started stream waits for its worker");
    s.freeze_worker(0, false)?;
    let text = tokio::time::timeout(Duration::from_secs(60), held).await??;
    assert!(text.contains("[DONE]"), "the begun stream finished: {}", &text[text.len().saturating_sub(300)..]);
    let chunks = text.lines().filter(|l| l.starts_with("data: {")).count();
    assert!(chunks <= 302, "nothing sent twice: {chunks} data events for 300 tokens");
    Ok(())
}

#[tokio::test]
async fn a_drained_worker_finishes_its_requests_and_gets_no_new_ones() -> Result<()> {
    for_each_host(drain).await
}

async fn drain(host: Host) -> Result<()> {
    let state = StateToml { top: format!("admin_token = \"{ADMIN_TOKEN}\""), ..StateToml::default() };
    let s = Stack::start(StackOptions { host, mode: Mode::Endpoint, workers: 2, state, ..StackOptions::default() }).await?;
    let prefix = tokens(5100, 160);
    warm(&s, 0, &prefix).await?;
    s.wait_idle().await?;
    let url = s.url("/v1/completions");
    let mut long = s.client.post(&url).json(&completion(MODEL, &concat(&prefix, &tokens(5101, 16)), 400, true)).send().await?;
    assert_eq!(header(&long, "x-sim-worker"), "0");
    let first = long.chunk().await?.unwrap_or_default();
    assert!(!first.is_empty());
    let r = s.client.post(s.state_url("/admin/workers/0/drain")).bearer_auth(ADMIN_TOKEN).send().await?;
    assert_eq!(r.status(), 202);
    let body: serde_json::Value = r.json().await?;
    assert_eq!(body["in_flight"], 1, "{body}");
    for i in 0..4u32 {
        let r = s.client.post(&url).json(&completion(MODEL, &concat(&prefix, &tokens(5200 + i, 16)), 2, false)).send().await?;
        assert_eq!(header(&r, "x-sim-worker"), "1", "no new requests to a draining worker");
        r.bytes().await?;
    }
    let mut rest = String::from_utf8_lossy(&first).to_string();
    while let Some(chunk) = long.chunk().await? {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(rest.contains("[DONE]"), "the in-flight stream ran to its end");
    wait_for("drained worker removed", Duration::from_secs(20), || async {
        let v = s.workers_view().await.ok()?;
        (v["workers"].as_array()?.len() == 1).then_some(())
    })
    .await?;
    Ok(())
}
