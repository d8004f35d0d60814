//! Real parts for the Redis store tests: `redis-server` processes on free loopback ports
//! (killed on drop), state-service replicas each on their own tokio runtime (dropping one
//! stops everything it started, like a process exit), and simulated vLLM workers.

use kvroute_state::config::{Config, WorkerConfig};
use kvroute_state::app::App;
use kvroute_state::store::redis::RedisStore;
use kvroute_state::store::StoreKind;
use kvroute_kv::types::EngineSlot;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

pub const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `cond` until it holds or the deadline passes (readiness, propagation).
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A `redis-server` on a loopback port, without persistence. Killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let mut s = RedisServer { port: free_port(), child: None };
        s.restart();
        s
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port, empty, and waits until it answers PING.
    pub fn restart(&mut self) {
        self.stop();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server installed (scripts/setup.sh)");
        self.child = Some(child);
        wait_until("redis-server to answer", || self.ping());
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn ping(&self) -> bool {
        self.inline("PING").is_some_and(|r| r.starts_with("+PONG"))
    }

    /// Sends one inline command (words without spaces) and returns the first reply read.
    pub fn inline(&self, command: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
        s.write_all(format!("{command}\r\n").as_bytes()).ok()?;
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn shards(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

/// A config for the Redis store over `servers`, with `replica` as id and seed.
pub fn redis_config(servers: &[RedisServer], replica: &str, seed: u64) -> Config {
    let mut c = Config { seed: Some(seed), store: StoreKind::Redis, ..Config::default() };
    c.redis.urls = servers.iter().map(RedisServer::url).collect();
    c.redis.replica_id = Some(replica.to_string());
    c.redis.key_prefix = "t".into();
    c.redis.lease_ttl_ms = 600;
    c.redis.mirror_interval_ms = 10;
    c.redis.probe_interval_ms = 50;
    c.redis.timeout_ms = 100;
    c.timeouts.speculative_ttl_ms = 60_000;
    c
}

pub fn plain_workers(config: &mut Config, n: usize) {
    for i in 0..n {
        config.workers.push(WorkerConfig { endpoint: format!("127.0.0.1:{}", 8000 + i), ..WorkerConfig::new(&format!("w{i}"), "m") });
    }
}

/// `n` replicas (`r0`, `r1`, ...) on `servers`, each with the same two plain workers.
pub fn plain_replicas(servers: &[RedisServer], n: usize) -> Vec<Replica> {
    (0..n)
        .map(|i| {
            let mut c = redis_config(servers, &format!("r{i}"), i as u64);
            plain_workers(&mut c, 2);
            Replica::start(c)
        })
        .collect()
}

/// One state-service replica: Redis store, wiring, HTTP API on a free port.
pub struct Replica {
    pub state: App,
    pub store: Arc<RedisStore>,
    pub addr: SocketAddr,
    rt: Option<Runtime>,
}

impl Replica {
    pub fn start(config: Config) -> Replica {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let (state, store, addr) = rt.block_on(async move {
            let store = RedisStore::connect(&config).await.expect("store");
            let state = kvroute_state::app::App::start(config, store.store()).expect("valid config");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let app = state.router();
            tokio::spawn(async move { axum::serve(listener, app).await });
            (state, store, addr)
        });
        Replica { state, store, addr, rt: Some(rt) }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn slot(&self, worker: &str) -> EngineSlot {
        self.state.fleet.worker(worker).expect("worker").engines[0].slot
    }

    /// Engine hashes `worker` holds in this replica's index, sorted.
    pub fn hashes(&self, worker: &str) -> Vec<u64> {
        self.store.index.memory().export(self.slot(worker)).into_iter().map(|b| b.hash.0).collect()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A runtime for the test's own HTTP client calls.
pub fn client_rt() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime")
}

pub fn post_json(rt: &Runtime, url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    rt.block_on(async {
        let r = reqwest::Client::new().post(url).json(&body).send().await.expect("request sent");
        let status = r.status().as_u16();
        let body = r.bytes().await.map(|b| serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null)).unwrap_or_default();
        (status, body)
    })
}
