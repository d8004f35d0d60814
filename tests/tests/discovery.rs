//! Worker discovery against a real DNS server (dnsmasq) and real files.
//!
//! DNS: a headless-Service-like name (`workers.kvroute.test`, TTL 1 s) whose A records the
//! test changes, each address a sim on its own loopback IP (127.0.0.2-5) on the same ports, as
//! pods are. The state service discovers the group (`[[worker_groups]] dns`), Envoy routes to
//! the same name (`STRICT_DNS`, as the shipped configs document). Scaled 2 -> 4 -> 3 under
//! load: no request fails, new workers take picks within a TTL or two, the removed one is
//! drained (its running requests finish) and then removed.
//!
//! SRV and files: a group finds its workers by an SRV record and keeps them while its DNS
//! server is gone (counted); a file group follows edits (an added entry, a relabelled one, a
//! removed one) and keeps its last good set on a bad edit.

use anyhow::{Context, Result};
use kvroute_e2e::dns::{Dnsmasq, Srv};
use kvroute_e2e::envoy::{Envoy, EnvoyExtra, EnvoyOptions, Mode, WorkersDns};
use kvroute_e2e::llm::{completion, header, tokens};
use kvroute_e2e::net::{free_port, wait_for, wait_http_ok, API_TOKEN};
use kvroute_e2e::paths;
use kvroute_e2e::proc::Proc;
use kvroute_e2e::stack::{metric_sum, MODEL};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NAME: &str = "workers.kvroute.test";

/// A sim worker on its own loopback address (`127.0.0.<host>`, id = host).
fn spawn_sim(host: u8, http: u16, zmq: u16) -> Result<Proc> {
    let args: Vec<String> = [
        "--workers", "1", "--first-worker-id", &host.to_string(), "--host", &format!("127.0.0.{host}"), "--http-port", &http.to_string(),
        "--zmq-port", &zmq.to_string(), "--time-scale", "0.2", "--model", MODEL,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Proc::spawn(&format!("sim{host}"), &paths::workspace_bin("kvroute-sim", "kvroute-sim")?, &args)
}

async fn start_sims(hosts: &[u8], http: u16, zmq: u16) -> Result<Vec<Proc>> {
    let mut sims = hosts.iter().map(|h| spawn_sim(*h, http, zmq)).collect::<Result<Vec<_>>>()?;
    for (h, sim) in hosts.iter().zip(&mut sims) {
        if let Err(e) = wait_http_ok(&format!("http://127.0.0.{h}:{http}/health"), Duration::from_secs(60)).await {
            sim.check_alive()?;
            return Err(e);
        }
    }
    Ok(sims)
}

fn start_state(toml: &str) -> Result<(Proc, u16)> {
    let port = free_port();
    let path = std::env::temp_dir().join(format!("kvroute-e2e-discovery-{port}.toml"));
    let text = format!("listen = \"127.0.0.1:{port}\"\nseed = 7\napi_token = \"{API_TOKEN}\"\n[models.\"{MODEL}\"]\nblock_size = 16\n{toml}");
    std::fs::write(&path, text)?;
    let args = vec!["--config".to_string(), path.display().to_string()];
    Ok((Proc::spawn("state", &paths::workspace_bin("kvroute-state", "kvroute-state")?, &args)?, port))
}

/// `/v1/workers`' entries.
async fn workers(client: &reqwest::Client, state_port: u16) -> Result<Vec<Value>> {
    let v: Value = client.get(format!("http://127.0.0.1:{state_port}/v1/workers")).send().await?.error_for_status()?.json().await?;
    Ok(v["workers"].as_array().cloned().unwrap_or_default())
}

fn ids(ws: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = ws.iter().filter_map(|w| w["id"].as_str().map(String::from)).collect();
    ids.sort();
    ids
}

async fn metric(client: &reqwest::Client, state_port: u16, name: &str, labels: &str) -> Result<f64> {
    let text = client.get(format!("http://127.0.0.1:{state_port}/metrics")).send().await?.text().await?;
    Ok(metric_sum(&text, name, labels))
}

/// One request's outcome: when it ended, its status and the sim that served it.
#[derive(Clone, Debug)]
struct Outcome {
    ended: Instant,
    status: u16,
    worker: String,
}

async fn send(client: &reqwest::Client, url: &str, seed: u32, max_tokens: u32) -> Outcome {
    let body = completion(MODEL, &tokens(seed, 200), max_tokens, false);
    match client.post(url).json(&body).send().await {
        Ok(r) => {
            let (status, worker) = (r.status().as_u16(), header(&r, "x-sim-worker"));
            let ok = r.bytes().await.is_ok();
            Outcome { ended: Instant::now(), status: if ok { status } else { 0 }, worker }
        }
        Err(_) => Outcome { ended: Instant::now(), status: 0, worker: String::new() },
    }
}

/// `clients` loops sending short requests until `stop`, bounded at 60 s.
fn load(url: String, clients: u32, stop: Arc<AtomicBool>, log: Arc<Mutex<Vec<Outcome>>>) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|c| {
            let (url, stop, log) = (url.clone(), stop.clone(), log.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let start = Instant::now();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(60) {
                    let outcome = send(&client, &url, c * 100_000 + n, 8).await;
                    log.lock().unwrap().push(outcome);
                    n += 1;
                }
            })
        })
        .collect()
}

#[tokio::test]
async fn a_dns_group_scales_from_two_to_four_and_back_to_three_under_load() -> Result<()> {
    let (http, zmq) = (free_port(), free_port());
    let mut sims = start_sims(&[2, 3, 4, 5], http, zmq).await?;
    let hosts = |n: u8| (2..2 + n).map(|h| (format!("127.0.0.{h}"), NAME)).collect::<Vec<_>>();
    let as_refs = |v: &[(String, &'static str)]| v.iter().map(|(a, n)| (a.clone(), *n)).collect::<Vec<_>>();
    let two = as_refs(&hosts(2));
    let dns = Dnsmasq::start(&two.iter().map(|(a, n)| (a.as_str(), *n)).collect::<Vec<_>>(), &[], 1).await?;
    let group = format!(
        "[[worker_groups]]\nname = \"vllm\"\ndns = \"{NAME}\"\nport = {http}\nevents_port = {zmq}\nreplay_port = {}\nresolver = \"{}\"\n\
         [worker_groups.template]\nmodel = \"{MODEL}\"\n",
        zmq + 1,
        dns.addr()
    );
    let (mut state, state_port) = start_state(&group)?;
    let client = kvroute_e2e::net::client(Duration::from_secs(30));
    let id = |h: u8| format!("vllm@127.0.0.{h}:{http}");
    let healthy = |ws: &[Value]| ws.iter().filter(|w| w["healthy"].as_bool() == Some(true)).count();
    wait_for("two discovered workers, healthy", Duration::from_secs(30), || async {
        let ws = workers(&client, state_port).await.ok()?;
        (ids(&ws) == vec![id(2), id(3)] && healthy(&ws) == 2).then_some(())
    })
    .await
    .map_err(|e| e.context(state.log_tail(3000)))?;
    state.check_alive()?;
    let envoy = Envoy::start_with(
        EnvoyOptions { mode: Mode::Endpoint, worker_ports: Vec::new(), state_port, plugin: Value::Object(Default::default()) },
        EnvoyExtra { workers_dns: Some(WorkersDns { name: NAME.into(), port: http, resolver: dns.addr() }), ..EnvoyExtra::default() },
    )
    .await?;
    let url = envoy.url("/v1/completions");
    let (stop, log) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
    let loops = load(url.clone(), 4, stop.clone(), log.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 2 -> 4.
    let four: Vec<(String, &str)> = as_refs(&hosts(4));
    dns.set_hosts(&four.iter().map(|(a, n)| (a.as_str(), *n)).collect::<Vec<_>>())?;
    let scaled = Instant::now();
    wait_for("four workers registered", Duration::from_secs(10), || async {
        let ws = workers(&client, state_port).await.ok()?;
        (ids(&ws).len() == 4).then_some(())
    })
    .await?;
    let registered = scaled.elapsed();
    let served_by = |h: u8, after: Instant| log.lock().unwrap().iter().any(|o| o.worker == h.to_string() && o.ended > after && o.status == 200);
    wait_for("the new workers serve requests", Duration::from_secs(15), || async { (served_by(4, scaled) && served_by(5, scaled)).then_some(()) })
        .await
        .map_err(|e| e.context(format!("{}\n--- envoy ---\n{}", state.log_tail(3000), envoy.proc.log_tail(3000))))?;
    let taking = scaled.elapsed();
    println!("scaled 2 -> 4: registered after {registered:?}, both new workers served after {taking:?} (TTL 1 s)");
    // One TTL to see the change, one resolve to ask, one scrape to be healthy.
    assert!(registered < Duration::from_secs(3), "new addresses registered after {registered:?}");

    // 4 -> 3 with long requests running everywhere: the removed worker finishes its own.
    let long: Vec<_> = (0..8)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move { send(&reqwest::Client::new(), &url, 900_000 + i, 400).await })
        })
        .collect();
    wait_for("worker 5 runs a long request", Duration::from_secs(10), || async {
        let ws = workers(&client, state_port).await.ok()?;
        let w = ws.iter().find(|w| w["id"].as_str() == Some(&id(5)))?;
        (w["load"]["own_in_flight"].as_u64()? > 0).then_some(())
    })
    .await?;
    let three: Vec<(String, &str)> = as_refs(&hosts(3));
    dns.set_hosts(&three.iter().map(|(a, n)| (a.as_str(), *n)).collect::<Vec<_>>())?;
    // Draining (or, on a slow machine, already drained and gone): how many ran there then.
    let running_at_drain = wait_for("worker 5 draining", Duration::from_secs(10), || async {
        let ws = workers(&client, state_port).await.ok()?;
        match ws.iter().find(|w| w["id"].as_str() == Some(&id(5))) {
            Some(w) => w["draining"].as_bool()?.then(|| w["load"]["own_in_flight"].as_u64().unwrap_or(0)),
            None => Some(0),
        }
    })
    .await
    .context("worker 5 should drain once its address is gone")?;
    let drained_at = Instant::now();
    let mut long_outcomes = Vec::new();
    for task in long {
        long_outcomes.push(task.await?);
    }
    wait_for("worker 5 removed once drained", Duration::from_secs(10), || async {
        let ws = workers(&client, state_port).await.ok()?;
        (ids(&ws) == vec![id(2), id(3), id(4)]).then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for task in loops {
        task.await?;
    }

    let outcomes = log.lock().unwrap().clone();
    let failed: Vec<_> = outcomes.iter().chain(&long_outcomes).filter(|o| o.status != 200).collect();
    let on_five = outcomes.iter().chain(&long_outcomes).filter(|o| o.worker == "5" && o.ended > drained_at).count();
    println!("{} short + {} long requests, {} failed; {on_five} finished on the removed worker while it drained", outcomes.len(), long_outcomes.len(), failed.len());
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    if running_at_drain > 0 {
        assert!(on_five > 0, "the {running_at_drain} requests running on worker 5 when it was drained finished there");
    }
    assert!(outcomes.len() > 40, "the load ran: {} requests", outcomes.len());
    assert_eq!(metric(&client, state_port, "kvroute_discovery_changes_total", "change=\"added\"").await?, 4.0);
    assert_eq!(metric(&client, state_port, "kvroute_discovery_changes_total", "change=\"drained\"").await?, 1.0);
    assert_eq!(metric(&client, state_port, "kvroute_discovered_workers", "group=\"vllm\"").await?, 3.0);
    sims.clear();
    Ok(())
}

#[tokio::test]
async fn an_srv_group_finds_targets_and_ports() -> Result<()> {
    let (http_a, http_b, zmq) = (free_port(), free_port(), free_port());
    let mut sims = start_sims(&[6], http_a, zmq).await?;
    sims.extend(start_sims(&[7], http_b, zmq).await?);
    let srv = [
        Srv { name: "_http._tcp.vllm.kvroute.test", target: "a.kvroute.test", port: http_a },
        Srv { name: "_http._tcp.vllm.kvroute.test", target: "b.kvroute.test", port: http_b },
    ];
    let mut dns = Dnsmasq::start(&[("127.0.0.6", "a.kvroute.test"), ("127.0.0.7", "b.kvroute.test")], &srv, 1).await?;
    let group = format!(
        "[[worker_groups]]\nname = \"srv\"\nsrv = \"_http._tcp.vllm.kvroute.test\"\nevents_port = {zmq}\nresolver = \"{}\"\n\
         [worker_groups.template]\nmodel = \"{MODEL}\"\nlabels = {{ tier = \"gpu\" }}\n",
        dns.addr()
    );
    let (state, state_port) = start_state(&group)?;
    let client = kvroute_e2e::net::client(Duration::from_secs(30));
    let want = vec![format!("srv@127.0.0.6:{http_a}"), format!("srv@127.0.0.7:{http_b}")];
    wait_for("both SRV targets registered and healthy", Duration::from_secs(30), || async {
        let ws = workers(&client, state_port).await.ok()?;
        let healthy = ws.iter().all(|w| w["healthy"].as_bool() == Some(true) && w["labels"]["tier"] == "gpu");
        (ids(&ws) == want && healthy).then_some(())
    })
    .await
    .map_err(|e| e.context(format!("{}\n--- dnsmasq ---\n{}", state.log_tail(3000), dns.log_tail())))?;

    // The DNS server goes away: each failed lookup is counted, the last good set stays.
    dns.stop();
    wait_for("failed lookups counted", Duration::from_secs(15), || async {
        (metric(&client, state_port, "kvroute_discovery_failures_total", "group=\"srv\"").await.ok()? >= 1.0).then_some(())
    })
    .await?;
    let ws = workers(&client, state_port).await?;
    assert_eq!(ids(&ws), want, "a failed lookup drains nothing");
    assert!(ws.iter().all(|w| w["draining"] == false));
    Ok(())
}

fn write_atomically(path: &std::path::Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[tokio::test]
async fn a_file_group_follows_edits_and_keeps_its_last_good_set() -> Result<()> {
    let (http, zmq) = (free_port(), free_port());
    let _sims = start_sims(&[8, 9], http, zmq).await?;
    let file = std::env::temp_dir().join(format!("kvroute-e2e-workers-{http}.yaml"));
    let entry = |h: u8, labels: &str| format!("  - {{address: 127.0.0.{h}, port: {http}, events_port: {zmq}, labels: {{{labels}}}}}\n");
    write_atomically(&file, &format!("endpoints:\n{}", entry(8, "pool: canary")))?;
    let group = format!(
        "[[worker_groups]]\nname = \"farm\"\nfile = \"{}\"\nmin_refresh_ms = 200\n[worker_groups.template]\nmodel = \"{MODEL}\"\n",
        file.display()
    );
    let (state, state_port) = start_state(&group)?;
    let client = kvroute_e2e::net::client(Duration::from_secs(30));
    let (a, b) = (format!("farm@127.0.0.8:{http}"), format!("farm@127.0.0.9:{http}"));
    let view = |ws: Vec<Value>| ws.iter().map(|w| (w["id"].as_str().unwrap_or("").to_string(), w["labels"]["pool"].as_str().unwrap_or("").to_string())).collect::<Vec<_>>();
    let expect = |want: Vec<(String, &'static str)>| {
        let client = client.clone();
        async move {
            let want: Vec<(String, String)> = want.into_iter().map(|(id, p)| (id, p.to_string())).collect();
            wait_for(&format!("workers {want:?}"), Duration::from_secs(20), || async {
                let ws = workers(&client, state_port).await.ok()?;
                (view(ws) == want).then_some(())
            })
            .await
        }
    };
    expect(vec![(a.clone(), "canary")]).await.map_err(|e| e.context(state.log_tail(3000)))?;

    // Added, and the first one relabelled: drained (nothing runs there) and registered again.
    write_atomically(&file, &format!("endpoints:\n{}{}", entry(8, "pool: stable"), entry(9, "pool: stable")))?;
    expect(vec![(a.clone(), "stable"), (b.clone(), "stable")]).await.map_err(|e| e.context(state.log_tail(3000)))?;

    // A bad edit: counted, the last good set stays.
    let failures = metric(&client, state_port, "kvroute_discovery_failures_total", "group=\"farm\"").await?;
    write_atomically(&file, "endpoints:\n  - {address: 127.0.0.8}\n")?;
    wait_for("the bad edit counted", Duration::from_secs(10), || async {
        (metric(&client, state_port, "kvroute_discovery_failures_total", "group=\"farm\"").await.ok()? > failures).then_some(())
    })
    .await?;
    expect(vec![(a.clone(), "stable"), (b.clone(), "stable")]).await?;

    // Removed: drained and gone.
    write_atomically(&file, &format!("endpoints:\n{}", entry(9, "pool: stable")))?;
    expect(vec![(b.clone(), "stable")]).await?;
    assert_eq!(metric(&client, state_port, "kvroute_discovery_changes_total", "change=\"updated\"").await?, 1.0);
    assert_eq!(metric(&client, state_port, "kvroute_discovery_changes_total", "change=\"drained\"").await?, 1.0);
    let _ = std::fs::remove_file(&file);
    Ok(())
}
