//! The state service's queue, through Envoy and the filter, in front of a simulated worker:
//! at saturation picks wait in the router and leave it by class (interactive before batch,
//! whatever arrived first), a class that never waits is shed at once, and one whose queue
//! deadline passes is shed then: 503 with `Retry-After` in the called API's shape. Tenants
//! (and so classes) come from a header only a trusted hop may set.

use anyhow::Result;
use kvroute_e2e::llm::{completion, header, tokens};
use kvroute_e2e::net::wait_for;
use kvroute_e2e::stack::{Stack, StackOptions, StateToml, MODEL};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// One worker; a worker is saturated while a request's prefill (2,000 tokens here, ~200 ms
/// at the prior cost) waits there. Tenants map to classes; `late` is served after `batch` and
/// waits at most 300 ms.
fn options() -> StackOptions {
    StackOptions { workers: 1, plugin: plugin(), state: StateToml { tables: TABLES.into(), ..StateToml::default() }, ..StackOptions::default() }
}

const TABLES: &str = r#"
[scheduling]
enabled = true
saturation_wait_ms = 50.0
max_engine_waiting = 0
max_unstarted = 0
wait_ms = 300

[scheduling.classes.interactive]
order = 0
queue_deadline_ms = 30000

[scheduling.classes.standard]
order = 1
queue_deadline_ms = 30000

[scheduling.classes.batch]
order = 2
queue_deadline_ms = 60000

[scheduling.classes.sheddable]
order = 3
queue_deadline_ms = 0

[scheduling.classes.late]
order = 4
queue_deadline_ms = 300

[scheduling.tenants.ui]
class = "interactive"

[scheduling.tenants.bulk]
class = "batch"

[scheduling.tenants.spot]
class = "sheddable"

[scheduling.tenants.late]
class = "late"
"#;

/// A pick timeout below the service's hold (as in production: 50 ms against 500): the first
/// call of a queued pick is answered "queued" within it, never timed out.
fn plugin() -> Value {
    json!({
        "pick_timeout_ms": 200,
        "identity": { "sources": [{ "header": { "name": "x-tenant", "trusted_sources": ["127.0.0.1/32"] } }] }
    })
}

/// Sends one 2,000-token completion as `tenant`; its status, `Retry-After`, body and when it
/// finished.
async fn send(s: &Stack, tenant: &str, seed: u32) -> Result<(u16, String, Value, Instant)> {
    send_to(&s.client, &s.url("/v1/completions"), tenant, seed).await
}

async fn send_to(client: &reqwest::Client, url: &str, tenant: &str, seed: u32) -> Result<(u16, String, Value, Instant)> {
    let r = client.post(url).header("x-tenant", tenant).json(&completion(MODEL, &tokens(seed, 2_000), 4, false)).send().await?;
    let (status, retry) = (r.status().as_u16(), header(&r, "retry-after"));
    let body: Value = r.json().await.unwrap_or(Value::Null);
    Ok((status, retry, body, Instant::now()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_saturation_picks_wait_in_the_router_and_leave_it_by_class() -> Result<()> {
    let s = Stack::start(options()).await?;
    let s = std::sync::Arc::new(s);
    // Batch work arrives first and fills the worker; the rest of it queues in the router.
    let bulk: Vec<_> = (0..6).map(|i| tokio::spawn({ let s = s.clone(); async move { send(&s, "bulk", 100 + i).await } })).collect();
    wait_for("batch picks queued", Duration::from_secs(10), || async {
        (s.metric("kvroute_queue_depth", "class=\"batch\"").await.ok()? >= 4.0).then_some(())
    })
    .await?;
    // Interactive requests come later and go first.
    let ui: Vec<_> = (0..4).map(|i| tokio::spawn({ let s = s.clone(); async move { send(&s, "ui", 200 + i).await } })).collect();
    // A class that never waits is shed at once, in OpenAI's error shape.
    let started = Instant::now();
    let (status, retry, body, _) = send(&s, "spot", 300).await?;
    assert_eq!(status, 503, "{body}");
    assert!(started.elapsed() < Duration::from_secs(2), "shed at once");
    assert!(retry.parse::<u64>().is_ok_and(|r| r >= 1), "Retry-After: {retry:?}");
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    // A class behind batch with a 300 ms deadline is shed when it passes.
    let started = Instant::now();
    let (status, retry, body, _) = send(&s, "late", 301).await?;
    let waited = started.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5), "shed at its deadline, after {waited:?}");
    assert!(!retry.is_empty(), "{body}");

    let mut bulk_done = Vec::new();
    for h in bulk {
        let (status, _, body, done) = h.await??;
        assert_eq!(status, 200, "{body}");
        bulk_done.push(done);
    }
    let mut ui_last = None;
    for h in ui {
        let (status, _, body, done) = h.await??;
        assert_eq!(status, 200, "{body}");
        ui_last = ui_last.max(Some(done));
    }
    let ui_last = ui_last.expect("four interactive requests");
    // First come, first served would finish every batch request before the first interactive
    // one; by class, most batch requests finish after the last interactive one.
    let timeouts = s.proxy.counter("kvroute_fallback_pick_timeout").await?;
    let after = bulk_done.iter().filter(|d| **d > ui_last).count();
    println!("{after} of 6 batch requests finished after the last interactive one; pick timeouts {timeouts:?}");
    assert!(after >= 3, "{after} of 6 batch requests finished after the last interactive one");

    if let Some(timeouts) = timeouts {
        assert_eq!(timeouts, 0, "no queued pick outlived its call");
    }
    let dispatched = s.metric("kvroute_queue_outcomes_total", "outcome=\"dispatched\"").await?;
    assert!(dispatched >= 8.0, "{dispatched} queued picks dispatched");
    assert_eq!(s.metric("kvroute_queue_outcomes_total", "outcome=\"shed_at_once\"").await?, 1.0);
    assert_eq!(s.metric("kvroute_queue_outcomes_total", "outcome=\"shed_deadline\"").await?, 1.0);
    assert_eq!(s.metric("kvroute_queue_depth", "").await?, 0.0, "nothing left queued");
    if let Some(waits) = s.proxy.counter("kvroute_pick_waits").await? {
        assert!(waits >= 1, "the filter asked again for queued picks");
    }
    Ok(())
}

/// A state service that freezes while it holds queued picks costs each of them a fallback to
/// the default route within one call (`wait_ms` 300 + pick timeout 50 + 100 ms margin), never
/// its queue deadline: every request is still served, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_state_service_costs_its_queued_picks_a_fallback_not_their_wait() -> Result<()> {
    let s = std::sync::Arc::new(Stack::start(options()).await?);
    let bulk: Vec<_> = (0..8).map(|i| tokio::spawn({ let s = s.clone(); async move { send(&s, "bulk", 400 + i).await } })).collect();
    wait_for("batch picks queued", Duration::from_secs(10), || async {
        (s.metric("kvroute_queue_depth", "class=\"batch\"").await.ok()? >= 5.0).then_some(())
    })
    .await?;
    s.freeze_state(true)?;
    let frozen = Instant::now();
    // New requests meanwhile: the pick timeout, then the default route.
    let (status, _, body, done) = send(&s, "ui", 500).await?;
    assert_eq!(status, 200, "{body}");
    let mut last = done;
    for h in bulk {
        let (status, _, body, done) = h.await??;
        assert_eq!(status, 200, "{body}");
        last = last.max(done);
    }
    // Frozen past every call's hold and grace (300 ms + 1 s), as a stuck replica would be.
    tokio::time::sleep(Duration::from_secs(2).saturating_sub(frozen.elapsed())).await;
    s.freeze_state(false)?;
    // The picks it held are dropped once their proxy has stopped asking, never dispatched.
    wait_for("forsaken picks dropped", Duration::from_secs(10), || async {
        (s.metric("kvroute_queue_depth", "").await.ok()? == 0.0).then_some(())
    })
    .await?;
    let forsaken = s.metric("kvroute_queue_outcomes_total", "outcome=\"forsaken\"").await?;
    let dispatched_late = s.metric("kvroute_queue_outcomes_total", "outcome=\"dispatched\"").await?;
    println!("after the freeze: {forsaken} forsaken, {dispatched_late} dispatched in all");
    assert!(forsaken >= 5.0, "{forsaken} forsaken");
    // Nine requests of ~160 ms each on one worker after at most ~0.5 s of waiting for the
    // frozen service: far less than the batch class's 60 s deadline.
    let took = last.duration_since(frozen);
    assert!(took < Duration::from_secs(8), "served {took:?} after the freeze");
    let timeouts = s.proxy.counter("kvroute_fallback_pick_timeout").await?.unwrap_or(0);
    println!("all served {took:?} after the freeze; {timeouts} picks fell back on a timeout");
    assert!(timeouts >= 5, "the queued picks fell back: {timeouts}");
    let worker = s.worker_view(0).await?;
    println!("worker 0 after: {}", worker["load"]);
    Ok(())
}

/// Two replicas on Redis behind one Envoy (its state cluster holds both): picks queue on
/// both; one replica is killed while it holds queued picks. Each of them is then asked for
/// again on the other replica (the filter's next call carries its ticket and how long it
/// waited) and dispatched there, or fails open: every request is served, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_while_holding_queued_picks_loses_none() -> Result<()> {
    use kvroute_e2e::envoy::{Envoy, EnvoyExtra, EnvoyOptions, Mode};
    use kvroute_e2e::replicas::{ReplicaOptions, ReplicaStack};
    let mut s = ReplicaStack::start(ReplicaOptions {
        workers: 1,
        replicas: 2,
        shards: 1,
        time_scale: 0.2,
        scrape_metrics: true,
        tables: TABLES.into(),
        plugin: plugin(),
    })
    .await?;
    let both = EnvoyExtra { more_state_ports: vec![s.replicas[1].port], ..EnvoyExtra::default() };
    let options = EnvoyOptions { mode: Mode::Endpoint, worker_ports: vec![s.http_base], state_port: s.replicas[0].port, plugin: plugin() };
    let envoy = std::sync::Arc::new(Envoy::start_with(options, both).await?);
    let client = s.client.clone();
    let n = 12u32;
    let sent: Vec<_> = (0..n)
        .map(|i| {
            let (client, url) = (client.clone(), envoy.url("/v1/completions"));
            tokio::spawn(async move { send_to(&client, &url, "bulk", 600 + i).await })
        })
        .collect();
    wait_for("picks queued on replica 0", Duration::from_secs(20), || async {
        (s.metric(0, "kvroute_queue_depth", "").await.ok()? >= 2.0).then_some(())
    })
    .await?;
    let held = s.metric(0, "kvroute_queue_depth", "").await?;
    s.replicas[0].state.kill();
    for h in sent {
        let (status, _, body, _) = h.await??;
        assert_eq!(status, 200, "{body}\n{}", s.log_tails());
    }
    let dispatched = s.metric(1, "kvroute_queue_outcomes_total", "outcome=\"dispatched\"").await?;
    let unavailable = envoy.counter("kvroute_fallback_pick_unavailable").await.unwrap_or(0);
    let timeouts = envoy.counter("kvroute_fallback_pick_timeout").await.unwrap_or(0);
    println!("replica 0 held {held} queued picks when killed; replica 1 dispatched {dispatched} in all; fell back: {unavailable} unavailable, {timeouts} timed out");
    assert!(dispatched >= 1.0, "replica 1 dispatched none of the picks replica 0 held");
    // Served once each: the worker finished as many requests as were sent.
    let served = s.client.get(s.worker_url(0, "/metrics")).send().await?.text().await?;
    let finished = kvroute_e2e::stack::metric_sum(&served, "vllm:request_success_total", "");
    assert_eq!(finished, f64::from(n), "each request served exactly once");
    Ok(())
}
