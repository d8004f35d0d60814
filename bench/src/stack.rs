//! Starting the whole stack on loopback ports for one benchmark run, and stopping it.
//!
//! Layout (from [`Ports`]): N simulated workers (`kvroute-sim`, one process) on consecutive
//! HTTP ports with ZMQ event/replay pairs, the state service (`kvroute-state`, in-memory
//! store) with a generated TOML config naming those workers, and Envoy with the kvroute
//! Wasm filter and a generated bootstrap routing to the workers by override-host.
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
}

impl Ports {
    pub fn from_base(base: u16) -> Ports {
        Ports { envoy: base, envoy_admin: base + 1, state: base + 2, sim_http: base + 100, sim_zmq: base + 200 }
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
    /// Where generated configs and process logs go.
    pub work_dir: PathBuf,
}

pub struct Stack {
    pub config: StackConfig,
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
        for p in [&cfg.sim_bin, &cfg.state_bin, &cfg.envoy_bin, &cfg.wasm] {
            if !p.exists() {
                return Err(BenchError::Stack(format!("{} does not exist (build it first; see bench/README.md)", p.display())));
            }
        }
        let io = |e: std::io::Error, p: &std::path::Path| BenchError::Io { path: p.to_path_buf(), source: e };
        std::fs::create_dir_all(&cfg.work_dir).map_err(|e| io(e, &cfg.work_dir))?;
        let state_toml = cfg.work_dir.join("kvroute-state.toml");
        std::fs::write(&state_toml, config::state_toml(&cfg)).map_err(|e| io(e, &state_toml))?;
        let envoy_yaml = cfg.work_dir.join("envoy.yaml");
        std::fs::write(&envoy_yaml, config::envoy_yaml(&cfg)).map_err(|e| io(e, &envoy_yaml))?;

        let mut stack = Stack { config: cfg.clone(), children: Vec::new() };
        let sim = Managed::spawn("sim", &cfg.sim_bin, &config::sim_args(&cfg), &cfg.work_dir, &[])?;
        stack.children.insert(0, sim);
        for url in stack.worker_urls() {
            wait_http(&format!("{url}/health"), Duration::from_secs(30), &mut stack.children).await?;
        }
        let state_args = vec!["--config".to_string(), state_toml.display().to_string()];
        let state = Managed::spawn("state", &cfg.state_bin, &state_args, &cfg.work_dir, &[("KVROUTE_API_TOKEN", &cfg.api_token)])?;
        stack.children.insert(0, state);
        wait_http(&format!("{}/readyz", stack.state_url()), Duration::from_secs(30), &mut stack.children).await?;
        let envoy_args: Vec<String> = [
            "-c", &envoy_yaml.display().to_string(), "--concurrency", "1", "--log-level", "warn",
            "--disable-hot-restart",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let envoy = Managed::spawn("envoy", &cfg.envoy_bin, &envoy_args, &cfg.work_dir, &[("KVROUTE_STATE_TOKEN", &cfg.api_token)])?;
        stack.children.insert(0, envoy);
        let ready = format!("http://127.0.0.1:{}/ready", cfg.ports.envoy_admin);
        wait_http(&ready, Duration::from_secs(60), &mut stack.children).await?;
        Ok(stack)
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
async fn wait_http(url: &str, limit: Duration, children: &mut [Managed]) -> Result<(), BenchError> {
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
