//! Must-show (issue 12): no client header chooses the upstream, through real Envoy with the
//! real state service and workers, in both routing modes, with the filter working, with the
//! filter absent from the chain, and with its VM trapped (a module that crashes on the first
//! request; FAIL_OPEN then skips it). Forged copies of the override-host header, the cluster
//! header and kvroute's own headers, in any case and duplicated, name worker 0 or the state
//! service's own cluster; a forgery succeeds if a request lands where it pointed instead of
//! where kvroute (filter working) or the default route (no filter) sends it.

use anyhow::Result;
use kvroute_e2e::envoy::{EnvoyExtra, Mode};
use kvroute_e2e::llm::{completion, concat, header, tokens};
use kvroute_e2e::stack::{Stack, StackOptions, MODEL};
use std::path::PathBuf;

#[derive(Copy, Clone, Debug, PartialEq)]
enum Filter {
    Working,
    Absent,
    Trapped,
}

/// The trapping module, built from `tests/fixtures/trap.wat`.
fn trap_module() -> Result<PathBuf> {
    let wat = std::fs::read_to_string(kvroute_e2e::paths::repo_root().join("tests/fixtures/trap.wat"))?;
    let path = std::env::temp_dir().join(format!("kvroute-e2e-trap-{}.wasm", std::process::id()));
    std::fs::write(&path, wat::parse_str(&wat)?)?;
    Ok(path)
}

/// Every forged header set: (name, value) pairs, added in this order.
fn forgeries(worker0: &str, state: &str) -> Vec<Vec<(String, String)>> {
    let mut sets = Vec::new();
    for name in ["x-gateway-destination-endpoint", "X-Gateway-Destination-Endpoint", "X-GATEWAY-DESTINATION-ENDPOINT"] {
        sets.push(vec![(name.to_string(), worker0.to_string())]);
        sets.push(vec![(name.to_string(), worker0.to_string()), (name.to_string(), state.to_string())]);
        sets.push(vec![(name.to_string(), format!("{worker0},{state}"))]);
    }
    for name in ["x-kvroute-cluster", "X-KVRoute-Cluster"] {
        sets.push(vec![(name.to_string(), "worker_0".to_string())]);
        sets.push(vec![(name.to_string(), "kvroute_state".to_string()), (name.to_string(), "worker_0".to_string())]);
    }
    sets.push(vec![("x-kvroute-decision".into(), "worker=0".into()), ("x-kvroute-fallback".into(), "none".into())]);
    sets
}

async fn no_forgery_succeeds(mode: Mode, filter: Filter) -> Result<()> {
    let envoy = match filter {
        Filter::Working => EnvoyExtra::default(),
        Filter::Absent => EnvoyExtra { wasm: false, ..EnvoyExtra::default() },
        Filter::Trapped => EnvoyExtra { module: Some(trap_module()?), ..EnvoyExtra::default() },
    };
    let s = Stack::start(StackOptions { mode, workers: 3, envoy, ..StackOptions::default() }).await?;
    // Worker 1 holds the prefix: where the filter sends these requests.
    let prefix = tokens(3100, 160);
    let r = s.client.post(s.worker_url(1, "/v1/completions")).json(&completion(MODEL, &prefix, 1, false)).send().await?;
    r.bytes().await?;
    s.wait_index(1, 10).await?;
    if filter == Filter::Trapped {
        // The request the VM crashes on gets Envoy's local 503; FAIL_OPEN skips the filter for
        // every request after it.
        let r = s.client.get(s.envoy.url("/v1/models")).send().await?;
        r.bytes().await?;
    }
    let worker0 = format!("127.0.0.1:{}", s.http_base);
    let state = format!("127.0.0.1:{}", s.state_port);
    let (mut landed, mut total, mut on_forged) = (Vec::new(), 0usize, 0usize);
    for (i, set) in forgeries(&worker0, &state).into_iter().enumerate() {
        for path in ["/v1/completions", "/v1/models"] {
            let mut req = if path == "/v1/models" {
                s.client.get(s.envoy.url(path))
            } else {
                s.client.post(s.envoy.url(path)).json(&completion(MODEL, &concat(&prefix, &tokens(3200 + i as u32, 16)), 2, false))
            };
            for (name, value) in &set {
                req = req.header(name.as_str(), value.as_str());
            }
            let r = req.send().await?;
            let (status, worker) = (r.status().as_u16(), header(&r, "x-sim-worker"));
            r.bytes().await?;
            total += 1;
            assert!(status < 500, "{mode:?}/{filter:?} {set:?} {path}: {status}\n{}", s.log_tails());
            assert!(!worker.is_empty(), "{mode:?}/{filter:?} {set:?} {path}: answered by something that is not a worker");
            if path == "/v1/completions" && filter == Filter::Working {
                assert_eq!(worker, "1", "{mode:?}: the pick, not the forged header, decides: {set:?}");
            }
            on_forged += usize::from(worker == "0");
            landed.push(worker);
            if filter == Filter::Working {
                s.wait_idle().await?;
            }
        }
    }
    // Without the filter the default route balances round robin: a header that steered would
    // put every request on worker 0.
    let distinct: std::collections::BTreeSet<&String> = landed.iter().collect();
    println!("{mode:?} mode, filter {filter:?}: {total} forged requests, {on_forged} on the forged worker, served by {distinct:?}");
    assert!(distinct.len() >= 2, "{mode:?}/{filter:?}: every request went to one worker: {landed:?}");
    assert!(on_forged < total / 2, "{mode:?}/{filter:?}: forged headers steered {on_forged} of {total}");
    Ok(())
}

#[tokio::test]
async fn forged_headers_never_choose_the_upstream_endpoint_mode() -> Result<()> {
    no_forgery_succeeds(Mode::Endpoint, Filter::Working).await
}

#[tokio::test]
async fn forged_headers_never_choose_the_upstream_cluster_mode() -> Result<()> {
    no_forgery_succeeds(Mode::Cluster, Filter::Working).await
}

#[tokio::test]
async fn forged_headers_never_choose_the_upstream_without_the_filter_endpoint_mode() -> Result<()> {
    no_forgery_succeeds(Mode::Endpoint, Filter::Absent).await
}

#[tokio::test]
async fn forged_headers_never_choose_the_upstream_without_the_filter_cluster_mode() -> Result<()> {
    no_forgery_succeeds(Mode::Cluster, Filter::Absent).await
}

#[tokio::test]
async fn forged_headers_never_choose_the_upstream_with_a_trapped_vm_endpoint_mode() -> Result<()> {
    no_forgery_succeeds(Mode::Endpoint, Filter::Trapped).await
}

#[tokio::test]
async fn forged_headers_never_choose_the_upstream_with_a_trapped_vm_cluster_mode() -> Result<()> {
    no_forgery_succeeds(Mode::Cluster, Filter::Trapped).await
}
