//! Starting the whole stack on loopback ports for one benchmark run, and stopping it.
//!
//! Layout (from [`Ports`]): N simulated workers (`kvroute-sim`, one process each, so one can
//! die alone) on consecutive HTTP ports with ZMQ event/replay pairs, the state service
//! (`kvroute-state`) with a generated TOML config naming those workers — one replica on the
//! in-memory store by default, or the production topology: several replicas on sharded
//! Redis (`redis-server` processes), all of them endpoints of Envoy's `kvroute_state` cluster —
//! and Envoy with the kvroute Wasm filter and a generated bootstrap routing to the workers by
//! override-host.
//!
//! Every child runs in its own process group and is owned by a [`process::Managed`] guard:
//! dropping the [`Stack`] (normal exit, error, or the binary's Ctrl-C handler) sends
//! SIGTERM to each group, then SIGKILL after a grace period. On Linux the children also get
//! `PR_SET_PDEATHSIG`, so even a SIGKILLed benchmark does not leave them behind.

pub mod config;
pub mod process;

use crate::BenchError;
use process::Managed;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, serde::Serialize)]
pub struct Ports {
    pub envoy: u16,
    pub envoy_admin: u16,
    pub state: u16,
    /// Worker i serves HTTP on `sim_http + i`.
    pub sim_http: u16,
    /// Worker i publishes on `sim_zmq + 2i`, replays on `sim_zmq + 2i + 1`.
    pub sim_zmq: u16,
    /// State replica r > 0 listens on `state_replicas + r` (replica 0 on `state`).
    pub state_replicas: u16,
    /// Redis shard i on `redis + i`.
    pub redis: u16,
}

impl Ports {
    pub fn from_base(base: u16) -> Ports {
        Ports {
            envoy: base,
            envoy_admin: base + 1,
            state: base + 2,
            sim_http: base + 100,
            sim_zmq: base + 200,
            state_replicas: base + 50,
            redis: base + 300,
        }
    }

    pub fn replica(&self, r: usize) -> u16 {
        if r == 0 {
            self.state
        } else {
            self.state_replicas + r as u16
        }
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct StackConfig {
    pub sim_bin: PathBuf,
    pub state_bin: PathBuf,
    pub envoy_bin: PathBuf,
    pub wasm: PathBuf,
    pub workers: usize,
    pub ports: Ports,
    pub model: String,
    /// The sims' wall-clock multiplier (0.25 = four times faster than the GPU profile).
    pub time_scale: f64,
    pub admin_token: String,
    /// The state API's credential: the state service's `KVROUTE_API_TOKEN` and the filter's
    /// `KVROUTE_STATE_TOKEN` (environment only).
    pub api_token: String,
    pub tokenizer_dir: Option<PathBuf>,
    /// Extra flags for `kvroute-sim` (e.g. `--num-gpu-blocks 3000`).
    pub sim_args: Vec<String>,
    /// State service replicas (1: the in-memory store; more need `redis_shards`).
    pub replicas: usize,
    /// Redis shards to start (0: none, the in-memory store).
    pub redis_shards: usize,
    pub redis_bin: PathBuf,
    /// Where generated configs and process logs go.
    pub work_dir: PathBuf,
    /// The state service queues picks while every worker is saturated (`[scheduling]`), with
    /// tenant `class-<name>` in class `<name>` for each default class.
    pub scheduling: bool,
    /// Settings written under `[scheduling]` (key, TOML value).
    pub scheduling_set: Vec<(String, String)>,
    /// The filter takes the tenant from `x-tenant` sent from loopback (`--classes`).
    pub tenant_header: bool,
}

/// How to start one child again (chaos scenarios kill and restart them).
#[derive(Clone, Debug)]
struct Spec {
    name: String,
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

pub struct Stack {
    pub config: StackConfig,
    specs: Vec<Spec>,
    // Drop order: Envoy first (stop new traffic), then the state service, then the workers.
    children: Vec<Managed>,
}

impl Stack {
    pub fn envoy_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.config.ports.envoy)
    }

    pub fn state_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.config.ports.state)
    }

    pub fn worker_urls(&self) -> Vec<String> {
        config::worker_urls(&self.config)
    }

    /// Start everything and wait until each part answers its readiness probe.
    pub async fn start(cfg: StackConfig) -> Result<Stack, BenchError> {
        let mut bins = vec![&cfg.sim_bin, &cfg.state_bin, &cfg.envoy_bin, &cfg.wasm];
        if cfg.redis_shards > 0 {
            bins.push(&cfg.redis_bin);
        }
        for p in bins {
            if !p.exists() {
                return Err(BenchError::Stack(format!("{} does not exist (build it first; see bench/README.md)", p.display())));
            }
        }
        if cfg.replicas > 1 && cfg.redis_shards == 0 {
            return Err(BenchError::Stack("several state replicas need Redis shards (--redis-shards)".into()));
        }
        let io = |e: std::io::Error, p: &std::path::Path| BenchError::Io { path: p.to_path_buf(), source: e };
        std::fs::create_dir_all(&cfg.work_dir).map_err(|e| io(e, &cfg.work_dir))?;
        let envoy_yaml = cfg.work_dir.join("envoy.yaml");
        std::fs::write(&envoy_yaml, config::envoy_yaml(&cfg)).map_err(|e| io(e, &envoy_yaml))?;

        let mut stack = Stack { config: cfg.clone(), specs: Vec::new(), children: Vec::new() };
        for i in 0..cfg.workers {
            stack.spawn(Spec { name: format!("sim{i}"), bin: cfg.sim_bin.clone(), args: config::sim_args(&cfg, i), env: Vec::new() })?;
        }
        for url in stack.worker_urls() {
            wait_http(&format!("{url}/health"), Duration::from_secs(30), &mut stack.children).await?;
        }
        for i in 0..cfg.redis_shards {
            let port = (cfg.ports.redis + i as u16).to_string();
            let args = ["--bind", "127.0.0.1", "--port", &port, "--save", "", "--appendonly", "no"].map(String::from).to_vec();
            stack.spawn(Spec { name: format!("redis{i}"), bin: cfg.redis_bin.clone(), args, env: Vec::new() })?;
        }
        for r in 0..cfg.replicas {
            let toml = cfg.work_dir.join(format!("kvroute-state-{r}.toml"));
            std::fs::write(&toml, config::state_toml(&cfg, r)).map_err(|e| io(e, &toml))?;
            let args = vec!["--config".to_string(), toml.display().to_string()];
            let env = vec![("KVROUTE_API_TOKEN".to_string(), cfg.api_token.clone())];
            stack.spawn(Spec { name: Stack::replica_name(r), bin: cfg.state_bin.clone(), args, env })?;
            wait_http(&format!("{}/readyz", stack.replica_url(r)), Duration::from_secs(30), &mut stack.children).await?;
        }
        let envoy_args: Vec<String> = [
            "-c", &envoy_yaml.display().to_string(), "--concurrency", "1", "--log-level", "warn",
            "--disable-hot-restart",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let env = vec![("KVROUTE_STATE_TOKEN".to_string(), cfg.api_token.clone())];
        stack.spawn(Spec { name: "envoy".into(), bin: cfg.envoy_bin.clone(), args: envoy_args, env })?;
        let ready = format!("http://127.0.0.1:{}/ready", cfg.ports.envoy_admin);
        wait_http(&ready, Duration::from_secs(60), &mut stack.children).await?;
        Ok(stack)
    }

    pub fn replica_name(r: usize) -> String {
        if r == 0 {
            "state".into()
        } else {
            format!("state{r}")
        }
    }

    pub fn replica_url(&self, r: usize) -> String {
        format!("http://127.0.0.1:{}", self.config.ports.replica(r))
    }

    /// Starts a child (first in the drop order: the latest started stops first).
    fn spawn(&mut self, spec: Spec) -> Result<(), BenchError> {
        let env: Vec<(&str, &str)> = spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let child = Managed::spawn(&spec.name, &spec.bin, &spec.args, &self.config.work_dir, &env)?;
        self.children.insert(0, child);
        self.specs.retain(|s| s.name != spec.name);
        self.specs.push(spec);
        Ok(())
    }

    fn child(&mut self, name: &str) -> Result<&mut Managed, BenchError> {
        self.children.iter_mut().find(|c| c.name == name).ok_or_else(|| BenchError::Stack(format!("no running child {name}")))
    }

    /// A running child's process id (its RSS is read from `/proc`).
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children.iter().find(|c| c.name == name)?.pid()
    }

    /// A running child's resident set, MiB.
    pub fn rss_mib(&self, name: &str) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid(name)?)).ok()?;
        let kib: f64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
        Some(kib / 1024.0)
    }

    /// SIGKILLs a child (`sim2`, `state1`, `redis0`, ...) and forgets it.
    pub fn kill(&mut self, name: &str) -> Result<(), BenchError> {
        self.child(name)?.kill_now();
        self.children.retain(|c| c.name != name);
        Ok(())
    }

    /// SIGSTOPs (`freeze`) or SIGCONTs a child.
    pub fn freeze(&mut self, name: &str, freeze: bool) -> Result<(), BenchError> {
        self.child(name)?.signal(if freeze { libc::SIGSTOP } else { libc::SIGCONT });
        Ok(())
    }

    /// Starts a killed child again with what it was started with.
    pub fn restart(&mut self, name: &str) -> Result<(), BenchError> {
        if self.children.iter().any(|c| c.name == name) {
            return Ok(());
        }
        let spec = self.specs.iter().find(|s| s.name == name).cloned().ok_or_else(|| BenchError::Stack(format!("unknown child {name}")))?;
        self.spawn(spec)
    }

    /// Stop every child (also what `Drop` does); returns once they are gone.
    pub fn stop(&mut self) {
        for c in self.children.iter_mut() {
            c.stop();
        }
        self.children.clear();
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Poll `url` until it answers 2xx; fail early if a child already exited.
pub(crate) async fn wait_http(url: &str, limit: Duration, children: &mut [Managed]) -> Result<(), BenchError> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().map_err(|e| BenchError::http(url, e))?;
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(r) = client.get(url).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        for c in children.iter_mut() {
            if let Some(status) = c.exited() {
                return Err(BenchError::Stack(format!("{} exited ({status}); see {}", c.name, c.log.display())));
            }
        }
        if Instant::now() > deadline {
            return Err(BenchError::Stack(format!("{url} not ready after {limit:?}")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
