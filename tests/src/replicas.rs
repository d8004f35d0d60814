//! Several `kvroute-state` replicas acting as one (`store = "redis"` over real `redis-server`
//! shards), each behind its own Envoy with the kvroute filter, all in front of the same
//! `kvroute-sim` workers. Every replica subscribes to every worker's ZMQ events itself.

use crate::envoy::{Envoy, EnvoyOptions, Mode};
use crate::net::{free_port, wait_for, wait_http_ok};
use crate::paths;
use crate::proc::Proc;
use crate::redis::RedisServer;
use crate::stack::{start_sim, state_toml, StateToml};
use anyhow::Result;
use serde_json::Value;
use std::time::Duration;

pub struct ReplicaOptions {
    pub workers: usize,
    pub replicas: usize,
    pub shards: usize,
    /// `--time-scale` of the simulator.
    pub time_scale: f64,
    /// Scrape the workers' metrics (see [`StateToml::scrape_metrics`]).
    pub scrape_metrics: bool,
    /// Extra tables for every replica's config (e.g. `[timeouts]`).
    pub tables: String,
    /// Every Envoy's plugin configuration, over the harness defaults.
    pub plugin: Value,
}

/// One replica: the state service and the Envoy that asks it.
pub struct Replica {
    pub state: Proc,
    pub port: u16,
    pub envoy: Envoy,
}

pub struct ReplicaStack {
    pub sim: Proc,
    pub shards: Vec<RedisServer>,
    pub replicas: Vec<Replica>,
    pub http_base: u16,
    pub workers: usize,
    pub client: reqwest::Client,
}

impl ReplicaStack {
    /// Starts the shards, the workers, then each replica (`replica_id = "r<i>"`, the same shard
    /// list) and its Envoy; returns once every replica is ready and has subscribed to (and
    /// resynced from) every shard, so no replicated event can be missed from then on.
    pub async fn start(opts: ReplicaOptions) -> Result<ReplicaStack> {
        let mut shards = Vec::new();
        for _ in 0..opts.shards {
            shards.push(RedisServer::start().await?);
        }
        let urls: Vec<String> = shards.iter().map(|s| format!("\"{}\"", s.url())).collect();
        let (sim, http_base, zmq_base) = start_sim(opts.workers, opts.time_scale).await?;
        let client = crate::net::client(Duration::from_secs(60));
        let mut replicas = Vec::new();
        for r in 0..opts.replicas {
            let port = free_port();
            // A generous call timeout: on a loaded machine a slow (not dead) shard must not be
            // marked down; a killed one refuses connections at once anyway.
            let extra = StateToml {
                scrape_metrics: opts.scrape_metrics,
                top: "store = \"redis\"\n".into(),
                tables: format!(
                    "\n[redis]\nurls = [{}]\nkey_prefix = \"e2e\"\nreplica_id = \"r{r}\"\ntimeout_ms = 1000\nprobe_interval_ms = 50\n{}",
                    urls.join(", "),
                    opts.tables
                ),
                worker_lines: Vec::new(),
            };
            let config = std::env::temp_dir().join(format!("kvroute-e2e-state-{port}.toml"));
            std::fs::write(&config, state_toml(port, http_base, zmq_base, opts.workers, &extra))?;
            let args = vec!["--config".to_string(), config.display().to_string()];
            let mut state = Proc::spawn(&format!("state-r{r}"), &paths::workspace_bin("kvroute-state", "kvroute-state")?, &args)?;
            if let Err(e) = wait_http_ok(&format!("http://127.0.0.1:{port}/readyz"), Duration::from_secs(60)).await {
                state.check_alive()?;
                return Err(e);
            }
            let envoy = Envoy::start(EnvoyOptions {
                mode: Mode::Endpoint,
                worker_ports: (0..opts.workers as u16).map(|i| http_base + i).collect(),
                state_port: port,
                plugin: opts.plugin.clone(),
            })
            .await?;
            replicas.push(Replica { state, port, envoy });
        }
        let stack = ReplicaStack { sim, shards, replicas, http_base, workers: opts.workers, client };
        for r in 0..stack.replicas.len() {
            let n = opts.shards as f64;
            wait_for(&format!("replica {r} subscribed to every shard"), Duration::from_secs(30), || async {
                let resyncs = stack.metric(r, "kvroute_store_resyncs_total", "").await.ok()?;
                let up = stack.metric(r, "kvroute_store_shard_up", "").await.ok()?;
                (resyncs >= n && up == n).then_some(())
            })
            .await?;
        }
        Ok(stack)
    }

    pub fn state_url(&self, r: usize, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.replicas[r].port, path)
    }

    pub fn envoy_url(&self, r: usize, path: &str) -> String {
        self.replicas[r].envoy.url(path)
    }

    pub fn worker_url(&self, i: usize, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.http_base as usize + i, path)
    }

    pub async fn get_json(&self, url: &str) -> Result<Value> {
        Ok(self.client.get(url).send().await?.error_for_status()?.json().await?)
    }

    /// `GET /v1/workers` of replica `r`.
    pub async fn workers_view(&self, r: usize) -> Result<Value> {
        self.get_json(&self.state_url(r, "/v1/workers")).await
    }

    /// Replica `r`'s view of worker `i` (id = index).
    pub async fn worker_view(&self, r: usize, i: usize) -> Result<Value> {
        let v = self.workers_view(r).await?;
        let found = v["workers"].as_array().and_then(|ws| ws.iter().find(|w| w["id"].as_str() == Some(&i.to_string())).cloned());
        found.ok_or_else(|| anyhow::anyhow!("worker {i} not in /v1/workers of replica {r}: {v}"))
    }

    /// The sum of replica `r`'s `/metrics` samples named `name` whose line contains `labels`
    /// (e.g. `reason="state_unavailable"`; "" for all); 0 when there are none.
    pub async fn metric(&self, r: usize, name: &str, labels: &str) -> Result<f64> {
        let text = self.client.get(self.state_url(r, "/metrics")).send().await?.error_for_status()?.text().await?;
        Ok(text
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains(labels))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let metric = series.split('{').next()?;
                if metric == name { value.parse::<f64>().ok() } else { None }
            })
            .sum())
    }

    /// Waits until no worker runs or queues a request (as the workers themselves report it).
    pub async fn wait_workers_drained(&self) -> Result<()> {
        for i in 0..self.workers {
            wait_for(&format!("worker {i} drained"), Duration::from_secs(30), || async {
                let s = self.get_json(&self.worker_url(i, "/sim/state")).await.ok()?;
                (s["num_requests_running"].as_u64()? == 0 && s["num_requests_waiting"].as_u64()? == 0).then_some(())
            })
            .await?;
        }
        Ok(())
    }

    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for (r, rep) in self.replicas.iter().enumerate() {
            out.push_str(&format!(
                "--- envoy r{r} ---\n{}\n--- state r{r} ---\n{}\n",
                rep.envoy.proc.log_tail(2000),
                rep.state.log_tail(3000)
            ));
        }
        out.push_str(&format!("--- sim ---\n{}", self.sim.log_tail(2000)));
        out
    }
}
