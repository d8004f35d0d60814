//! Pick latency over HTTP: memory store vs redis store (3 shards), 1 and 2 replicas.
//!
//! `cargo run --release -p kvroute-state --example redis_pick_bench [picks]`
//! Starts its own `redis-server`s on free loopback ports and each replica as its own process
//! (this binary with `--replica`; runtime as `main.rs`), 4 workers without events; one client
//! (one thread) sends picks sequentially (keep-alive), alternating replicas, 64-block prompts
//! from 50 prefixes, each completed by an untimed report. `server p99` is the time inside the
//! replica's router (a response header); the rest is loopback and waiting for a CPU.

use kvroute_state::config::{Config, WorkerConfig};
use kvroute_state::app::App;
use kvroute_state::store::memory::MemoryStore;
use kvroute_state::store::redis::RedisStore;
use kvroute_state::store::StoreKind;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Redis(Child, u16);
impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis() -> anyhow::Result<Redis> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()?;
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(start.elapsed() < Duration::from_secs(10), "redis-server did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(Redis(child, port))
}

fn config(urls: Option<&[String]>, name: &str) -> Config {
    let mut c = Config { seed: Some(name.len() as u64), ..Config::default() };
    for i in 0..4 {
        c.workers.push(WorkerConfig { endpoint: format!("127.0.0.1:{}", 8000 + i), ..WorkerConfig::new(&format!("w{i}"), "m") });
    }
    if let Some(urls) = urls {
        c.store = StoreKind::Redis;
        c.redis.urls = urls.to_vec();
        c.redis.replica_id = Some(name.into());
        c.redis.key_prefix = format!("bench-{}", std::process::id());
    }
    c
}

/// A replica in its own process (this binary with `--replica`), like a deployment: its own
/// runtime, flavor as `main.rs` (multi-thread, one worker per core). Prints its address.
fn replica_main(args: &[String]) -> anyhow::Result<()> {
    let (name, prefix, urls) = (&args[0], &args[1], &args[2..]);
    let mut config = config(if urls.is_empty() { None } else { Some(urls) }, name);
    config.redis.key_prefix = prefix.clone();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let store = match config.store {
            StoreKind::Memory => MemoryStore::store(Arc::new(kvroute_kv::index::memory::MemoryIndex::new())),
            StoreKind::Redis => RedisStore::connect(&config).await?.store(),
        };
        let state = App::start(config, store)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("{}", listener.local_addr()?);
        let app = state.router().layer(axum::middleware::from_fn(trace));
        // Exits when the bench closes our stdin.
        tokio::spawn(async move { axum::serve(listener, app).await });
        tokio::task::spawn_blocking(|| std::io::Read::read(&mut std::io::stdin(), &mut [0u8; 1])).await??;
        anyhow::Ok(())
    })
}

struct Replica(Child, SocketAddr);
impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn replica(name: &str, urls: &[String]) -> anyhow::Result<Replica> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--replica")
        .arg(name)
        .arg(format!("bench-{}", std::process::id()))
        .args(urls)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().expect("piped")), &mut line)?;
    let addr = line.trim().parse().map_err(|e| anyhow::anyhow!("replica {name} did not start: {e} ({line:?})"))?;
    Ok(Replica(child, addr))
}

/// Time spent in the replica's router (body parsing, pick, response), as a response header:
/// the rest of a pick's latency is loopback and waiting to be scheduled.
async fn trace(req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let t = Instant::now();
    let mut r = next.run(req).await;
    r.headers_mut().insert("x-bench-server-us", (t.elapsed().as_micros() as u64).into());
    r
}

fn run(label: &str, addrs: &[SocketAddr], picks: usize) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client = reqwest::Client::new();
    let lat = rt.block_on(async {
        let mut lat = Vec::with_capacity(picks);
        for i in 0..picks + 200 {
            let prefix = (i % 50) as u64;
            let keys: Vec<u64> = (0..64).map(|b| prefix << 32 | b).collect();
            let body = serde_json::json!({ "model": "m", "token_keys": keys, "block_size": 16, "prompt_tokens": 1024 });
            let url = format!("http://{}/v1/pick", addrs[i % addrs.len()]);
            let t = Instant::now();
            let r = client.post(&url).json(&body).send().await?;
            let server = r.headers().get("x-bench-server-us").and_then(|v| v.to_str().ok()?.parse::<u64>().ok()).unwrap_or(0);
            let resp: serde_json::Value = r.json().await?;
            if i >= 200 {
                lat.push((t.elapsed(), Duration::from_micros(server)));
            }
            // Complete every pick (untimed) so in-flight load stays bounded, as in steady state.
            let report = serde_json::json!({ "reports": [{ "assignment_id": resp["assignment_id"], "kind": 3 }] });
            client.post(url.replace("/v1/pick", "/v1/report")).json(&report).send().await?;
        }
        anyhow::Ok(lat)
    })?;
    let mut server: Vec<Duration> = lat.iter().map(|l| l.1).collect();
    let mut lat: Vec<Duration> = lat.into_iter().map(|l| l.0).collect();
    server.sort();
    lat.sort();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1e3;
    let sq = |p: f64| server[((server.len() as f64 * p) as usize).min(server.len() - 1)].as_secs_f64() * 1e3;
    println!("| {label} | {picks} | {:.3} | {:.3} | {:.3} | {:.3} |", q(0.5), q(0.99), q(0.999), sq(0.99));
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--replica") {
        return replica_main(&args[1..]);
    }
    let picks: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(5000);
    let servers = (0..3).map(|_| redis()).collect::<anyhow::Result<Vec<_>>>()?;
    let urls: Vec<String> = servers.iter().map(|s| format!("redis://127.0.0.1:{}", s.1)).collect();
    println!("| store, replicas | picks | p50 ms | p99 ms | p99.9 ms | server p99 ms |\n|---|---|---|---|---|---|");
    let m = replica("mem", &[])?;
    run("memory, 1", &[m.1], picks)?;
    drop(m);
    let ra = replica("ra", &urls)?;
    run("redis (3 shards), 1", &[ra.1], picks)?;
    let rb = replica("rb", &urls)?;
    run("redis (3 shards), 2", &[ra.1, rb.1], picks)?;
    Ok(())
}
