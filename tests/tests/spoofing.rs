//! Must-show (issue 12): no client header chooses the upstream, through real Envoy with the
//! real state service and workers, in both routing modes, with the filter working, with the
//! filter absent from the chain, and with its VM trapped (a module that crashes on the first
//! request; FAIL_OPEN then skips it). Forged copies of the override-host header, the cluster
//! header and kvroute's own headers, in any case and duplicated, name worker 0 or the state
//! service's own cluster; a forgery succeeds if a request lands where it pointed instead of
//! where kvroute (filter working) or the default route (no filter) sends it.
//!
//! Endpoint mode runs through Envoy and, with `KVROUTE_NGINX`, through NGINX (the decision in
//! an NGINX variable no client can send; the config strips the headers natively with
//! `proxy_set_header .. ""`); cluster mode is Envoy-only. A second test puts recording fake
//! workers behind each host and shows that no forged header even reaches the upstream.

use anyhow::Result;
use kvroute_e2e::envoy::{EnvoyExtra, EnvoyOptions, Mode};
use kvroute_e2e::fake::{FakeState, FakeWorker, PickBehavior};
use kvroute_e2e::host::{for_each_host, Host, Proxy};
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

fn extra(filter: Filter) -> Result<EnvoyExtra> {
    Ok(match filter {
        Filter::Working => EnvoyExtra::default(),
        Filter::Absent => EnvoyExtra { wasm: false, ..EnvoyExtra::default() },
        Filter::Trapped => EnvoyExtra { module: Some(trap_module()?), ..EnvoyExtra::default() },
    })
}

async fn no_forgery_succeeds(host: Host, mode: Mode, filter: Filter) -> Result<()> {
    let s = Stack::start(StackOptions { host, mode, workers: 3, envoy: extra(filter)?, ..StackOptions::default() }).await?;
    // Worker 1 holds the prefix: where the filter sends these requests.
    let prefix = tokens(3100, 160);
    let r = s.client.post(s.worker_url(1, "/v1/completions")).json(&completion(MODEL, &prefix, 1, false)).send().await?;
    r.bytes().await?;
    s.wait_index(1, 10).await?;
    if filter == Filter::Trapped {
        // The request the VM crashes on gets Envoy's local 503; FAIL_OPEN skips the filter for
        // every request after it. (In NGINX every request traps again, and the config's
        // `error_page 500` sends it to NGINX's own balancing without the filter.)
        let r = s.client.get(s.url("/v1/models")).send().await?;
        r.bytes().await?;
    }
    let worker0 = format!("127.0.0.1:{}", s.http_base);
    let state = format!("127.0.0.1:{}", s.state_port);
    let (mut landed, mut total, mut on_forged) = (Vec::new(), 0usize, 0usize);
    for (i, set) in forgeries(&worker0, &state).into_iter().enumerate() {
        for path in ["/v1/completions", "/v1/models"] {
            let mut req = if path == "/v1/models" {
                s.client.get(s.url(path))
            } else {
                s.client.post(s.url(path)).json(&completion(MODEL, &concat(&prefix, &tokens(3200 + i as u32, 16)), 2, false))
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
    for_each_host(|host| no_forgery_succeeds(host, Mode::Endpoint, Filter::Working)).await
}

#[tokio::test]
async fn forged_headers_never_choose_the_upstream_cluster_mode() -> Result<()> {
    // Envoy-only: cluster mode.
    no_forgery_succeeds(Host::Envoy, Mode::Cluster, Filter::Working).await
}

#[tokio::test]
async fn forged_headers_never_choose_the_upstream_without_the_filter_endpoint_mode() -> Result<()> {
    for_each_host(|host| no_forgery_succeeds(host, Mode::Endpoint, Filter::Absent)).await
}

#[tokio::test]
async fn forged_headers_never_choose_the_upstream_without_the_filter_cluster_mode() -> Result<()> {
    // Envoy-only: cluster mode.
    no_forgery_succeeds(Host::Envoy, Mode::Cluster, Filter::Absent).await
}

#[tokio::test]
async fn forged_headers_never_choose_the_upstream_with_a_trapped_vm_endpoint_mode() -> Result<()> {
    for_each_host(|host| no_forgery_succeeds(host, Mode::Endpoint, Filter::Trapped)).await
}

#[tokio::test]
async fn forged_headers_never_choose_the_upstream_with_a_trapped_vm_cluster_mode() -> Result<()> {
    // Envoy-only: cluster mode.
    no_forgery_succeeds(Host::Envoy, Mode::Cluster, Filter::Trapped).await
}

/// Recording fake workers behind the proxy (a fake state service picks worker B): forged
/// routing headers naming worker A never reach a worker, with the filter working, absent or
/// trapped. The only routing header an upstream may see is the override the filter itself set
/// (Envoy's endpoint mode: B's address).
async fn no_forged_header_reaches(host: Host, filter: Filter) -> Result<()> {
    let workers = [FakeWorker::start("A").await?, FakeWorker::start("B").await?];
    let (a, b) = (workers[0].addr(), workers[1].addr());
    let state = FakeState::start(PickBehavior::Route { worker: "B".into(), endpoint: b.clone(), cluster: "worker_1".into() }).await?;
    let opts = EnvoyOptions { mode: Mode::Endpoint, worker_ports: workers.iter().map(|w| w.port).collect(), state_port: state.port, plugin: serde_json::json!({}) };
    let proxy = Proxy::start(&host, opts, extra(filter)?).await?;
    let client = reqwest::Client::new();
    if filter == Filter::Trapped {
        // The request the VM traps on (Envoy answers it 503 and skips the filter from then on;
        // NGINX fails every request over to its own balancing, see test-nginx.conf.tmpl).
        client.get(proxy.url("/v1/models")).send().await?.bytes().await?;
    }
    let mut statuses = Vec::new();
    for set in forgeries(&a, "127.0.0.1:1") {
        // (The fake workers record every path but /v1/models.)
        for path in ["/v1/completions", "/health"] {
            let mut req = if path == "/v1/completions" {
                client.post(proxy.url(path)).json(&completion("m", &tokens(41, 64), 2, false))
            } else {
                client.get(proxy.url(path))
            };
            for (name, value) in &set {
                req = req.header(name.as_str(), value.as_str());
            }
            let r = req.send().await?;
            statuses.push(r.status().as_u16());
            r.bytes().await?;
        }
    }
    let seen: Vec<_> = workers.iter().flat_map(|w| w.seen()).collect();
    println!("{host}/{filter:?}: {} forged requests, {} reached a worker, statuses {:?}", statuses.len(), seen.len(), statuses.iter().collect::<std::collections::BTreeSet<_>>());
    assert!(statuses.iter().all(|s| *s < 500), "{host}/{filter:?}: {statuses:?}\n{}", proxy.log_tail());
    assert_eq!(seen.len(), statuses.len(), "every forged request reached a worker (and was checked)");
    for s in &seen {
        let leaked: Vec<_> = s.headers.iter().filter(|(k, _)| k.as_str().starts_with("x-kvroute-")).collect();
        assert!(leaked.is_empty(), "{host}/{filter:?} {}: {leaked:?} reached the worker", s.path);
        for v in s.headers.get_all("x-gateway-destination-endpoint") {
            assert_eq!(v.as_bytes(), b.as_bytes(), "{host}/{filter:?} {}: a forged override reached the worker", s.path);
        }
    }
    Ok(())
}

#[tokio::test]
async fn forged_headers_never_reach_the_upstream() -> Result<()> {
    for filter in [Filter::Working, Filter::Absent, Filter::Trapped] {
        for_each_host(|host| no_forged_header_reaches(host, filter)).await?;
    }
    Ok(())
}
