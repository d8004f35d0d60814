//! Pick latency over HTTP: memory store vs redis store (3 shards), 1 and 2 replicas.
//!
//! `cargo run --release -p kvroute-state --example redis_pick_bench [picks]`
//! Starts its own `redis-server`s on free loopback ports, replicas in this process (each on
//! its own runtime, HTTP on loopback), 4 workers without events; one client sends picks
//! sequentially (keep-alive), alternating replicas, 64-block prompts from 50 prefixes.

use kvroute_state::config::{Config, WorkerConfig};
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

fn replica(config: Config) -> anyhow::Result<(tokio::runtime::Runtime, SocketAddr)> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let addr = rt.block_on(async move {
        let state = match config.store {
            StoreKind::Memory => kvroute_state::app::start(config, Arc::new(kvroute_state::index::memory::MemoryIndex::new()))?,
            StoreKind::Redis => {
                let store = RedisStore::connect(&config).await?;
                kvroute_state::app::start_with_store(config, store.index.clone(), store)?
            }
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, kvroute_state::api::app(state)).await });
        anyhow::Ok(addr)
    })?;
    Ok((rt, addr))
}

fn run(label: &str, addrs: &[SocketAddr], picks: usize) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client = reqwest::Client::new();
    let mut lat = rt.block_on(async {
        let mut lat = Vec::with_capacity(picks);
        for i in 0..picks + 200 {
            let prefix = (i % 50) as u64;
            let keys: Vec<u64> = (0..64).map(|b| prefix << 32 | b).collect();
            let body = serde_json::json!({ "model": "m", "token_keys": keys, "block_size": 16, "prompt_tokens": 1024 });
            let url = format!("http://{}/v1/pick", addrs[i % addrs.len()]);
            let t = Instant::now();
            let r = client.post(&url).json(&body).send().await?;
            let resp: serde_json::Value = r.json().await?;
            if i >= 200 {
                lat.push(t.elapsed());
            }
            // Complete every pick (untimed) so in-flight load stays bounded, as in steady state.
            let report = serde_json::json!({ "reports": [{ "assignment_id": resp["assignment_id"], "kind": 3 }] });
            client.post(url.replace("/v1/pick", "/v1/report")).json(&report).send().await?;
        }
        anyhow::Ok(lat)
    })?;
    lat.sort();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1e3;
    println!("| {label} | {picks} | {:.3} | {:.3} | {:.3} |", q(0.5), q(0.99), q(0.999));
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let picks: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(5000);
    let servers = (0..3).map(|_| redis()).collect::<anyhow::Result<Vec<_>>>()?;
    let urls: Vec<String> = servers.iter().map(|s| format!("redis://127.0.0.1:{}", s.1)).collect();
    println!("| store, replicas | picks | p50 ms | p99 ms | p99.9 ms |\n|---|---|---|---|---|");
    let (_m, a) = replica(config(None, "mem"))?;
    run("memory, 1", &[a], picks)?;
    let (_r1, a) = replica(config(Some(&urls), "ra"))?;
    run("redis (3 shards), 1", &[a], picks)?;
    let (_r2, b) = replica(config(Some(&urls), "rb"))?;
    run("redis (3 shards), 2", &[a, b], picks)?;
    Ok(())
}
