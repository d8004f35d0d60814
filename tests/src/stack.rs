//! The real stack for the must-show tests: `kvroute-sim` (N workers on consecutive ports, one
//! process each, so one can be killed like a crashing vLLM server),
//! `kvroute-state` configured for exactly those workers (events, replay, metrics, endpoint and
//! cluster names), and the proxy with the filter in front (Envoy, or NGINX with
//! `StackOptions::host`). The state service can be killed and
//! restarted on the same port to test fail-open and recovery.

use crate::envoy::{worker_cluster, Envoy, EnvoyExtra, EnvoyOptions, Mode};
use crate::host::{Host, Proxy};
use crate::net::{free_port, free_port_range, wait_for, wait_http_ok, API_TOKEN};
use crate::paths;
use crate::proc::Proc;
use anyhow::{Context, Result};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

pub const MODEL: &str = "kvroute/sim-27b-fp8";

pub struct Stack {
    /// One process per worker (index = worker id); `None` once killed.
    pub sims: Vec<Option<Proc>>,
    pub state: Option<Proc>,
    pub proxy: Proxy,
    pub http_base: u16,
    zmq_base: u16,
    time_scale: f64,
    pub workers: usize,
    pub state_port: u16,
    state_config: PathBuf,
    pub client: reqwest::Client,
}

pub struct StackOptions {
    pub mode: Mode,
    pub workers: usize,
    /// Extra plugin configuration merged over the harness defaults.
    pub plugin: Value,
    /// `--time-scale` of the simulator (smaller = faster engine steps).
    pub time_scale: f64,
    /// What the state service's config adds to the harness defaults.
    pub state: StateToml,
    /// Proxy variations (no filter, another module; the others are Envoy-only).
    pub envoy: EnvoyExtra,
    /// The proxy host (Envoy unless a test loops over `host::hosts()`).
    pub host: Host,
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions {
            mode: Mode::Endpoint,
            workers: 2,
            plugin: Value::Object(Default::default()),
            time_scale: 0.2,
            state: StateToml::default(),
            envoy: EnvoyExtra::default(),
            host: Host::Envoy,
        }
    }
}

/// Starts `kvroute-sim` with `workers` workers on consecutive free ports and waits until each
/// answers `/health`. Returns the process and the HTTP and ZMQ base ports (worker `i`: HTTP
/// `http_base + i`, events `zmq_base + 2i`, replay `zmq_base + 2i + 1`).
pub async fn start_sim(workers: usize, time_scale: f64) -> Result<(Proc, u16, u16)> {
    let n = workers as u16;
    let http_base = free_port_range(n);
    let zmq_base = free_port_range(2 * n);
    let sim_args: Vec<String> = [
        "--workers", &n.to_string(), "--http-port", &http_base.to_string(), "--zmq-port", &zmq_base.to_string(),
        "--time-scale", &time_scale.to_string(), "--model", MODEL,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut sim = Proc::spawn("sim", &paths::workspace_bin("kvroute-sim", "kvroute-sim")?, &sim_args)?;
    for i in 0..n {
        if let Err(e) = wait_http_ok(&format!("http://127.0.0.1:{}/health", http_base + i), Duration::from_secs(60)).await {
            sim.check_alive()?;
            return Err(e);
        }
    }
    Ok((sim, http_base, zmq_base))
}

/// Starts worker `i` of a fleet as its own `kvroute-sim` process (HTTP `http_base + i`, events
/// `zmq_base + 2i`, replay `zmq_base + 2i + 1`, as [`start_sim`] lays workers out).
fn spawn_sim_process(i: u16, http_base: u16, zmq_base: u16, time_scale: f64) -> Result<Proc> {
    let args: Vec<String> = [
        "--workers", "1", "--first-worker-id", &i.to_string(), "--http-port", &(http_base + i).to_string(),
        "--zmq-port", &(zmq_base + 2 * i).to_string(), "--time-scale", &time_scale.to_string(), "--model", MODEL,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Proc::spawn(&format!("sim{i}"), &paths::workspace_bin("kvroute-sim", "kvroute-sim")?, &args)
}

async fn wait_sim(sim: &mut Proc, http_port: u16) -> Result<()> {
    if let Err(e) = wait_http_ok(&format!("http://127.0.0.1:{http_port}/health"), Duration::from_secs(60)).await {
        sim.check_alive()?;
        return Err(e);
    }
    Ok(())
}

/// Starts one `kvroute-sim` process per worker (ids `0..workers`, on the same consecutive
/// ports as [`start_sim`]) and waits until each answers `/health`.
pub async fn start_sim_processes(workers: usize, time_scale: f64) -> Result<(Vec<Proc>, u16, u16)> {
    let n = workers as u16;
    let http_base = free_port_range(n);
    let zmq_base = free_port_range(2 * n);
    let mut sims = (0..n).map(|i| spawn_sim_process(i, http_base, zmq_base, time_scale)).collect::<Result<Vec<_>>>()?;
    for (i, sim) in sims.iter_mut().enumerate() {
        wait_sim(sim, http_base + i as u16).await?;
    }
    Ok((sims, http_base, zmq_base))
}

/// What a `kvroute-state` config adds to the harness defaults.
pub struct StateToml {
    /// Give every worker its `metrics_url` (load scraping, health from scrapes). Without it
    /// the workers are healthy from the start and their load is only what the service routed.
    pub scrape_metrics: bool,
    /// Top-level keys (before any table), e.g. `store = "redis"`.
    pub top: String,
    /// Extra tables, e.g. `[redis]` and `[timeouts]`.
    pub tables: String,
    /// Extra lines in worker `i`'s `[[workers]]` table (by index; shorter: none).
    pub worker_lines: Vec<String>,
}

impl Default for StateToml {
    fn default() -> Self {
        StateToml { scrape_metrics: true, top: String::new(), tables: String::new(), worker_lines: Vec::new() }
    }
}

/// The `kvroute-state` config for the sim's `workers` (ids = indexes, events, replay, metrics,
/// endpoint and cluster names), listening on `state_port`.
pub fn state_toml(state_port: u16, http_base: u16, zmq_base: u16, workers: usize, extra: &StateToml) -> String {
    let mut toml = format!(
        "listen = \"127.0.0.1:{state_port}\"\nseed = 7\napi_token = \"{API_TOKEN}\"\n{}\n[models.\"{MODEL}\"]\nblock_size = 16\n",
        extra.top
    );
    for i in 0..workers as u16 {
        let (http, zmq) = (http_base + i, zmq_base + 2 * i);
        toml.push_str(&format!(
            "\n[[workers]]\nid = \"{i}\"\nmodel = \"{MODEL}\"\nendpoint = \"127.0.0.1:{http}\"\ncluster = \"{}\"\n\
             events_endpoint = \"tcp://127.0.0.1:{zmq}\"\nreplay_endpoint = \"tcp://127.0.0.1:{}\"\n",
            worker_cluster(i as usize),
            zmq + 1
        ));
        if extra.scrape_metrics {
            toml.push_str(&format!("metrics_url = \"http://127.0.0.1:{http}/metrics\"\n"));
        }
        if let Some(lines) = extra.worker_lines.get(i as usize) {
            toml.push_str(lines);
            toml.push('\n');
        }
    }
    toml.push_str(&extra.tables);
    toml
}

/// The sum of the samples named `name` in exposition `text` whose line contains `labels`
/// ("" for all); 0 when there are none.
pub fn metric_sum(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(labels))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            (series.split('{').next()? == name).then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

impl Stack {
    pub async fn start(opts: StackOptions) -> Result<Stack> {
        let n = opts.workers as u16;
        let (sims, http_base, zmq_base) = start_sim_processes(opts.workers, opts.time_scale).await?;
        let state_port = free_port();
        let toml = state_toml(state_port, http_base, zmq_base, opts.workers, &opts.state);
        let state_config = std::env::temp_dir().join(format!("kvroute-e2e-state-{state_port}.toml"));
        std::fs::write(&state_config, toml)?;
        let proxy = Proxy::start(
            &opts.host,
            EnvoyOptions { mode: opts.mode, worker_ports: (0..n).map(|i| http_base + i).collect(), state_port, plugin: opts.plugin },
            opts.envoy,
        )
        .await?;
        let client = crate::net::client(Duration::from_secs(60));
        let sims = sims.into_iter().map(Some).collect();
        let mut stack = Stack { sims, state: None, proxy, http_base, zmq_base, time_scale: opts.time_scale, workers: opts.workers, state_port, state_config, client };
        stack.start_state().await?;
        Ok(stack)
    }

    /// Starts (or restarts) the state service and waits until every worker is healthy.
    pub async fn start_state(&mut self) -> Result<()> {
        let args = vec!["--config".to_string(), self.state_config.display().to_string()];
        let mut proc = Proc::spawn("state", &paths::workspace_bin("kvroute-state", "kvroute-state")?, &args)?;
        let url = self.state_url("/readyz");
        let ready = wait_http_ok(&url, Duration::from_secs(60)).await;
        if let Err(e) = ready {
            proc.check_alive()?;
            return Err(e);
        }
        self.state = Some(proc);
        let n = self.workers;
        wait_for("every worker healthy", Duration::from_secs(30), || async {
            let w = self.workers_view().await.ok()?;
            let healthy = w["workers"].as_array()?.iter().filter(|w| w["healthy"].as_bool() == Some(true)).count();
            (healthy == n).then_some(())
        })
        .await
    }

    /// SIGKILLs the state service.
    pub fn kill_state(&mut self) {
        if let Some(mut p) = self.state.take() {
            p.kill();
        }
    }

    /// SIGSTOPs (`freeze = true`) or SIGCONTs the state service: a frozen, not dead, service.
    pub fn freeze_state(&self, freeze: bool) -> Result<()> {
        let pid = self.state.as_ref().and_then(Proc::pid).context("no state service running")?;
        let signal = if freeze { "-STOP" } else { "-CONT" };
        let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status()?;
        anyhow::ensure!(status.success(), "kill {signal} {pid} failed");
        Ok(())
    }

    /// SIGSTOPs (`freeze = true`) or SIGCONTs worker `i`: a worker that still accepts
    /// connections (the kernel does) and never answers.
    pub fn freeze_worker(&self, i: usize, freeze: bool) -> Result<()> {
        let pid = self.sims.get(i).and_then(Option::as_ref).and_then(Proc::pid).context("worker not running")?;
        let signal = if freeze { "-STOP" } else { "-CONT" };
        let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status()?;
        anyhow::ensure!(status.success(), "kill {signal} {pid} failed");
        Ok(())
    }

    /// SIGKILLs worker `i`'s process (a vLLM server crashing: connections refused from now on).
    pub fn kill_worker(&mut self, i: usize) {
        if let Some(mut p) = self.sims.get_mut(i).and_then(Option::take) {
            p.kill();
        }
    }

    /// Starts worker `i` again on its ports (an empty cache, as a restarted vLLM server).
    pub async fn restart_worker(&mut self, i: usize) -> Result<()> {
        self.kill_worker(i);
        let mut sim = spawn_sim_process(i as u16, self.http_base, self.zmq_base, self.time_scale)?;
        wait_sim(&mut sim, self.http_base + i as u16).await?;
        self.sims[i] = Some(sim);
        Ok(())
    }

    /// The Envoy of an Envoy-only test (panics on NGINX).
    pub fn envoy(&self) -> &Envoy {
        self.proxy.envoy().expect("Envoy-only")
    }

    /// A URL on the proxy's listener with the filter.
    pub fn url(&self, path: &str) -> String {
        self.proxy.url(path)
    }

    pub fn state_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.state_port, path)
    }

    pub fn worker_url(&self, i: usize, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.http_base as usize + i, path)
    }

    /// The sum of the state service's `/metrics` samples named `name` whose line contains
    /// `labels` (e.g. `outcome="dispatched"`; "" for all); 0 when there are none.
    pub async fn metric(&self, name: &str, labels: &str) -> Result<f64> {
        let text = self.client.get(self.state_url("/metrics")).send().await?.error_for_status()?.text().await?;
        Ok(metric_sum(&text, name, labels))
    }

    /// `GET /v1/workers` of the state service.
    pub async fn workers_view(&self) -> Result<Value> {
        Ok(self.client.get(self.state_url("/v1/workers")).send().await?.error_for_status()?.json().await?)
    }

    /// The state service's view of one worker (by id = index).
    pub async fn worker_view(&self, i: usize) -> Result<Value> {
        let v = self.workers_view().await?;
        v["workers"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["id"].as_str() == Some(&i.to_string())).cloned())
            .context("worker not in /v1/workers")
    }

    /// Waits until the state service's index holds at least `blocks` blocks for worker `i`
    /// (its KV events have arrived).
    pub async fn wait_index(&self, i: usize, blocks: u64) -> Result<()> {
        wait_for(&format!("worker {i} index >= {blocks} blocks"), Duration::from_secs(20), || async {
            let w = self.worker_view(i).await.ok()?;
            (w["index_blocks"].as_u64()? >= blocks).then_some(())
        })
        .await
        .map_err(|e| e.context(self.log_tails()))
    }

    /// Waits until the state service holds no assignment (every report arrived) and no worker
    /// reports running or waiting requests, so the next pick sees equal, fresh load.
    pub async fn wait_idle(&self) -> Result<()> {
        wait_for("idle fleet", Duration::from_secs(20), || async {
            let v = self.workers_view().await.ok()?;
            let busy = v["workers"].as_array()?.iter().any(|w| {
                w["load"]["running"].as_u64() != Some(0) || w["load"]["waiting"].as_u64() != Some(0)
            });
            (v["assignments"].as_u64() == Some(0) && !busy).then_some(())
        })
        .await
    }

    pub fn log_tails(&self) -> String {
        let state = self.state.as_ref().map(|p| p.log_tail(3000)).unwrap_or_default();
        let sims: String = self.sims.iter().flatten().map(|p| p.log_tail(800)).collect::<Vec<_>>().join("\n");
        format!("--- {} ---\n{}\n--- state ---\n{state}\n--- sims ---\n{sims}", self.proxy.host_name(), self.proxy.log_tail())
    }
}
