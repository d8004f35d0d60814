//! Must-show failure handling and reporting through real Envoy, the real state service and
//! simulated workers: the state service dying and coming back, bodies kvroute cannot or will
//! not read, unknown models, and first-token / completion reports closing the loop.
//! Every test runs through Envoy, and through NGINX too when `KVROUTE_NGINX` is set
//! (`host::for_each_host`); cluster mode is Envoy-only, and so are the filter's counters
//! (Envoy's admin stats: NGINX shows no proxy-wasm metrics), checked where the host has them.

use anyhow::Result;
use kvroute_e2e::envoy::{EnvoyExtra, Mode};
use kvroute_e2e::fake::{FakeState, PickBehavior};
use kvroute_e2e::host::{for_each_host, Host};
use kvroute_e2e::llm::{completion, header, tokens};
use kvroute_e2e::net::wait_for;
use kvroute_e2e::stack::{Stack, StackOptions, MODEL};
use serde_json::json;
use std::time::Duration;

async fn stack(host: Host, mode: Mode, plugin: serde_json::Value) -> Result<Stack> {
    Stack::start(StackOptions { host, mode, plugin, ..StackOptions::default() }).await
}

/// Asserts a filter counter where the host shows them (Envoy).
async fn counter_is(s: &Stack, name: &str, want: u64) -> Result<()> {
    if let Some(got) = s.proxy.counter(name).await? {
        assert_eq!(got, want, "{name}");
    }
    Ok(())
}

async fn survives_state_service_death(host: Host, mode: Mode) -> Result<()> {
    let mut s = stack(host, mode, json!({})).await?;
    let (client, url) = (s.client.clone(), s.url("/v1/completions"));
    let send = |seed: u32, stream: bool| client.post(&url).json(&completion(MODEL, &tokens(seed, 48), 4, stream)).send();
    let r = send(1, false).await?;
    assert_eq!(r.status(), 200);
    assert!(!header(&r, "x-kvroute-decision").is_empty());
    s.kill_state();
    for i in 0..6u32 {
        let r = send(10 + i, i % 2 == 0).await?;
        assert_eq!(r.status(), 200, "{}", s.log_tails());
        assert_eq!(header(&r, "x-kvroute-fallback"), "pick_unavailable");
        assert!(header(&r, "x-kvroute-decision").is_empty());
        let body = r.text().await?;
        assert!(body.contains("usage"), "a complete answer from the default route: {body}");
    }
    counter_is(&s, "kvroute_fallback_pick_unavailable", 6).await?;
    s.start_state().await?;
    let r = send(20, false).await?;
    assert_eq!(header(&r, "x-kvroute-fallback"), "");
    assert!(header(&r, "x-kvroute-decision").starts_with("worker="), "{:?}", r.headers());
    Ok(())
}

#[tokio::test]
async fn state_service_killed_mid_run_endpoint_mode() -> Result<()> {
    for_each_host(|host| survives_state_service_death(host, Mode::Endpoint)).await
}

#[tokio::test]
async fn state_service_killed_mid_run_cluster_mode() -> Result<()> {
    // Envoy-only: cluster mode.
    survives_state_service_death(Host::Envoy, Mode::Cluster).await
}

/// Must-show (issue 33): state replicas that fail cost no pick. Behind the same Envoy as the
/// real state service: a replica that is up and ready but refuses every pick (503), and one
/// that is dead (its port refuses connections). A refused pick is sent again (up to twice) and the
/// balancer gives it to another replica; the dead one fails its `/readyz` health checks and
/// takes no pick. Every request is routed, none falls back. Envoy-only: NGINX's
/// `state_cluster` is one address.
#[tokio::test]
async fn failed_state_replicas_cost_no_pick() -> Result<()> {
    let refusing = FakeState::start(PickBehavior::Status(503)).await?;
    let dead = kvroute_e2e::net::free_port();
    let envoy = EnvoyExtra { more_state_ports: vec![refusing.port, dead], ..EnvoyExtra::default() };
    let s = Stack::start(StackOptions { envoy, ..StackOptions::default() }).await?;
    // Envoy started before the state service: once its probe found it (the refusing replica
    // answers its probe too; the dead one never does).
    wait_for("the state service and the refusing replica healthy in Envoy", Duration::from_secs(10), || async {
        let stats = s.envoy().stats("^cluster\\.kvroute_state\\.membership_healthy$").await.ok()?;
        (stats.first()?.1 == "2").then_some(())
    })
    .await?;
    let url = s.url("/v1/completions");
    for i in 0..12u32 {
        let r = s.client.post(&url).json(&completion(MODEL, &tokens(300 + i, 48), 2, false)).send().await?;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-kvroute-fallback"), "", "request {i} fell back\n{}", s.log_tails());
        assert!(header(&r, "x-kvroute-decision").starts_with("worker="), "request {i}: {:?}", r.headers());
    }
    let refused = refusing.picks().len() as u64;
    assert!(refused >= 1, "the balancer gave the refusing replica no pick");
    let retries = s.envoy().counter("kvroute_pick_retries").await?;
    // At least every pick the refusing replica refused went again; more when the dead one
    // got some (once outlier detection ejects the refusing one, 1 healthy host of 3 is under
    // Envoy's panic threshold and the balancer uses all three).
    assert!(retries >= refused, "every refused pick went again: {retries} resent, {refused} refused");
    let stats = s.envoy().stats("^cluster\\.kvroute_state\\.health_check\\.failure$").await?;
    assert!(stats.first().is_some_and(|(_, v)| v != "0"), "the dead replica fails its probe: {stats:?}");
    counter_is(&s, "kvroute_fallback_pick_unavailable", 0).await?;
    Ok(())
}

#[tokio::test]
async fn unreadable_bodies_and_unknown_models_pass_through_counted() -> Result<()> {
    for_each_host(unreadable_bodies).await
}

async fn unreadable_bodies(host: Host) -> Result<()> {
    let s = stack(host, Mode::Endpoint, json!({"max_body_bytes": 65536})).await?;
    let big = serde_json::to_vec(&completion(MODEL, &tokens(3, 20_000), 2, false))?;
    assert!(big.len() > 65536);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{\"model\": \"kvroute/sim-27b-fp8\", \"prompt\": [1, 2,".to_vec(), "unparsable_body"),
        (big, "body_too_large"),
        (serde_json::to_vec(&completion("no-such-model", &tokens(4, 40), 2, false))?, "unknown_model"),
    ];
    for (body, reason) in cases {
        let r = s.client.post(s.url("/v1/completions")).header("content-type", "application/json").body(body).send().await?;
        let status = r.status().as_u16();
        assert!(status < 500, "{reason}: kvroute must never cause a 5xx, got {status}");
        assert_eq!(header(&r, "x-kvroute-fallback"), reason);
        // The worker itself judged the request: its own answer came back.
        assert!(!header(&r, "x-sim-worker").is_empty(), "{reason}");
        counter_is(&s, &format!("kvroute_fallback_{reason}"), 1).await?;
    }
    Ok(())
}

#[tokio::test]
async fn reports_close_every_assignment_and_calibrate() -> Result<()> {
    for_each_host(reports_close_and_calibrate).await
}

async fn reports_close_and_calibrate(host: Host) -> Result<()> {
    let s = stack(host, Mode::Endpoint, json!({})).await?;
    let burst: Vec<_> = (0..16u32)
        .map(|i| {
            let body = completion(MODEL, &tokens(100 + i, 64 + 16 * (i as usize % 4)), 8, i % 2 == 0);
            let req = s.client.post(s.url("/v1/completions")).json(&body).send();
            async move {
                let r = req.await?;
                let routed = !header(&r, "x-kvroute-decision").is_empty();
                let status = r.status();
                r.bytes().await?;
                anyhow::Ok((status, routed))
            }
        })
        .collect();
    let mut routed = 0;
    for f in burst {
        let (status, r) = f.await?;
        assert_eq!(status, 200);
        routed += usize::from(r);
    }
    assert_eq!(routed, 16);
    let view = wait_for("assignments back to zero", Duration::from_secs(20), || async {
        let v = s.workers_view().await.ok()?;
        (v["assignments"].as_u64()? == 0).then_some(v)
    })
    .await?;
    let samples: u64 = view["workers"].as_array().map(|ws| ws.iter().filter_map(|w| w["calibration"]["samples"].as_u64()).sum()).unwrap_or(0);
    assert!(samples >= 1, "first-token reports must calibrate the cost model: {view}");
    let moved = view["workers"].as_array().map(|ws| {
        ws.iter().any(|w| w["calibration"]["overhead_ms"].as_f64() != Some(15.0) || w["calibration"]["per_token_ms"].as_f64() != Some(0.1))
    });
    assert_eq!(moved, Some(true), "calibration should move from the priors: {view}");
    if let Some(sent) = s.proxy.counter("kvroute_reports_sent").await? {
        assert!(sent >= 32, "{sent}");
    }
    // The state service applied a first-token and a completion report of every request, and
    // none named a failed upstream (NGINX names the one that answered as IP and port apart;
    // the filter joins them).
    let metrics = s.client.get(s.state_url("/metrics")).send().await?.text().await?;
    assert!(applied_in(&metrics, "first_token") >= 16.0 && applied_in(&metrics, "complete") >= 16.0, "{metrics}");
    assert!(!metrics.contains("kvroute_upstream_failures_total{"), "no upstream failure reported: {metrics}");
    // A client that walks away mid-stream is reported as a cancel: the assignment is freed.
    let mut r = s.client.post(s.url("/v1/completions")).json(&completion(MODEL, &tokens(300, 64), 20_000, true)).send().await?;
    r.chunk().await?;
    drop(r);
    wait_for("cancelled assignment freed", Duration::from_secs(20), || async {
        (s.workers_view().await.ok()?["assignments"].as_u64()? == 0).then_some(())
    })
    .await?;
    Ok(())
}

/// Must-show (issue 12): a pick the proxy gave up on leaves no assignment behind. The state
/// service is frozen (SIGSTOP) while requests arrive: one whose pick times out in the filter
/// (it is served by the default route), and one whose client hangs up while its pick is in
/// flight. Both picks are decided when the service thaws, long after the filter moved on;
/// the filter cancelled them by the ids it named, and its report batch waited out the freeze.
#[tokio::test]
async fn timed_out_and_reset_picks_leave_no_assignment() -> Result<()> {
    for_each_host(picks_given_up).await
}

async fn picks_given_up(host: Host) -> Result<()> {
    let s = stack(host, Mode::Endpoint, json!({"pick_timeout_ms": 1500})).await?;
    let url = s.url("/v1/completions");
    s.freeze_state(true)?;
    let timed_out = s.client.post(&url).json(&completion(MODEL, &tokens(61, 64), 2, false)).send();
    let hung_up = kvroute_e2e::net::client(Duration::from_millis(500)).post(&url).json(&completion(MODEL, &tokens(62, 64), 2, false)).send();
    let (timed_out, hung_up) = tokio::join!(timed_out, hung_up);
    let timed_out = timed_out?;
    assert_eq!(timed_out.status(), 200, "served by the default route");
    assert_eq!(header(&timed_out, "x-kvroute-fallback"), "pick_timeout");
    assert!(hung_up.is_err(), "the client gave up before the pick answered");
    counter_is(&s, "kvroute_picks", 2).await?;
    s.freeze_state(false)?;
    // Both cancels delivered (each freed its assignment, or was remembered and discarded the
    // pick when it came later; a pick whose connection Envoy had closed may never be decided
    // at all), and nothing left in the table, then or a moment later.
    let sum = |metrics: &str, prefix: &str| -> f64 {
        metrics.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
    };
    let settled = wait_for("both picks cancelled, no assignment left", Duration::from_secs(10), || async {
        let metrics = s.client.get(s.state_url("/metrics")).send().await.ok()?.text().await.ok()?;
        let cancels = sum(&metrics, "kvroute_reports_total{kind=\"cancel\"");
        let left = s.workers_view().await.ok()?["assignments"].as_u64()?;
        (cancels >= 2.0 && left == 0).then_some(metrics)
    })
    .await;
    if settled.is_err() {
        let metrics = s.client.get(s.state_url("/metrics")).send().await?.text().await?;
        let seen: Vec<&str> = metrics.lines().filter(|l| l.starts_with("kvroute_picks") || l.starts_with("kvroute_reports_total")).collect();
        panic!("{settled:?}: {seen:?} assignments {}\n{}", s.workers_view().await?["assignments"], s.log_tails());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.workers_view().await?["assignments"], 0, "a late pick left load behind");
    Ok(())
}

/// Must-show (issue 12): a pick naming a target outside the filter's `allowed_targets` is a
/// counted fallback, never a 503, and leaves no assignment behind.
#[tokio::test]
async fn targets_outside_the_allowlist_fall_back_counted() -> Result<()> {
    for_each_host(targets_not_allowed).await
}

async fn targets_not_allowed(host: Host) -> Result<()> {
    let s = stack(host, Mode::Endpoint, json!({"allowed_targets": ["10.99.*:8000"]})).await?;
    for i in 0..4u32 {
        let r = s.client.post(s.url("/v1/completions")).json(&completion(MODEL, &tokens(70 + i, 64), 2, false)).send().await?;
        assert_eq!(r.status(), 200, "the default route served it");
        assert_eq!(header(&r, "x-kvroute-fallback"), "target_not_allowed");
        assert!(!header(&r, "x-sim-worker").is_empty());
        r.bytes().await?;
    }
    counter_is(&s, "kvroute_fallback_target_not_allowed", 4).await?;
    wait_for("the refused picks cancelled", Duration::from_secs(10), || async {
        (s.workers_view().await.ok()?["assignments"].as_u64()? == 0).then_some(())
    })
    .await?;
    Ok(())
}

/// Issue 18: a pick carries the reports pending in the proxy (`PickRequest.reports`), so a
/// proxy whose picks come at least as often as its flushes makes no report call of its own.
/// With a flush period no test outlives, every report the state service applies came with a
/// later pick: each request's first-token and complete reports arrive with the next request.
#[tokio::test]
async fn reports_ride_along_with_the_next_pick() -> Result<()> {
    for_each_host(reports_ride_along).await
}

async fn reports_ride_along(host: Host) -> Result<()> {
    let s = stack(host, Mode::Endpoint, json!({"report_flush_ms": 3_600_000})).await?;
    for i in 0..4u32 {
        let r = s.client.post(s.url("/v1/completions")).json(&completion(MODEL, &tokens(400 + i, 64), 3, i % 2 == 0)).send().await?;
        assert_eq!(r.status(), 200);
        assert!(!header(&r, "x-kvroute-decision").is_empty(), "routed");
        r.bytes().await?;
        // The response is over, its reports queued: the next pick takes them.
        assert_eq!((applied(&s, "first_token").await?, applied(&s, "complete").await?), (f64::from(i), f64::from(i)), "{}", s.log_tails());
    }
    counter_is(&s, "kvroute_reports_sent", 6).await?;
    Ok(())
}

/// The state service's count of applied reports of one kind, read now.
async fn applied(s: &Stack, kind: &str) -> Result<f64> {
    let metrics = s.client.get(s.state_url("/metrics")).send().await?.text().await?;
    Ok(applied_in(&metrics, kind))
}

/// Applied reports of one kind in a `/metrics` text.
fn applied_in(metrics: &str, kind: &str) -> f64 {
    let series = format!("kvroute_reports_total{{kind=\"{kind}\",outcome=\"applied\"}}");
    metrics.lines().find(|l| l.starts_with(&series)).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).unwrap_or(0.0)
}
