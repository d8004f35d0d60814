//! Starting Envoy with the kvroute filter from the templates in `envoy/`.
//!
//! The templates hold every part of the config that matters (filter chain, buffer limits,
//! override-host policy, routes); the harness fills in only ports, the `.wasm` path, the worker
//! list and the plugin JSON, so the tests exercise the same files operators read.

use crate::net::{free_port, wait_http_ok};
use crate::paths;
use crate::proc::Proc;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::time::Duration;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Endpoint,
    Cluster,
}

impl Mode {
    fn template(self) -> &'static str {
        match self {
            Mode::Endpoint => "envoy/test-endpoint.yaml.tmpl",
            Mode::Cluster => "envoy/test-cluster.yaml.tmpl",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Endpoint => "endpoint",
            Mode::Cluster => "cluster",
        }
    }
}

/// The Envoy cluster name the cluster-mode template gives worker `i`.
pub fn worker_cluster(i: usize) -> String {
    format!("worker_{i}")
}

pub struct EnvoyOptions {
    pub mode: Mode,
    /// Worker ports on 127.0.0.1, in order (cluster mode names them `worker_<index>`).
    pub worker_ports: Vec<u16>,
    pub state_port: u16,
    /// Merged over the defaults (`state_cluster`, `routing_mode`, a generous pick timeout).
    pub plugin: Value,
}

pub struct Envoy {
    pub proc: Proc,
    pub port: u16,
    pub admin_port: u16,
}

impl Envoy {
    pub async fn start(opts: EnvoyOptions) -> Result<Envoy> {
        let root = paths::repo_root();
        let template = std::fs::read_to_string(root.join(opts.mode.template())).context("reading envoy template")?;
        let (port, admin_port) = (free_port(), free_port());
        let mut plugin = json!({
            "state_cluster": "kvroute_state",
            "routing_mode": opts.mode.name(),
            // Loaded CI machines: a 50 ms budget would make routing assertions flaky.
            "pick_timeout_ms": 2000,
            "report_flush_ms": 50,
        });
        if let (Some(base), Value::Object(extra)) = (plugin.as_object_mut(), &opts.plugin) {
            for (k, v) in extra {
                base.insert(k.clone(), v.clone());
            }
        }
        let endpoint = |p: u16| format!("{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}}}}}");
        let lb_endpoints = format!("[{}]", opts.worker_ports.iter().map(|p| endpoint(*p)).collect::<Vec<_>>().join(", "));
        let clusters: String = opts
            .worker_ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "  - {{name: {}, type: STATIC, connect_timeout: 1s, load_assignment: {{cluster_name: {}, endpoints: [{{lb_endpoints: [{}]}}]}}}}\n",
                    worker_cluster(i),
                    worker_cluster(i),
                    endpoint(*p)
                )
            })
            .collect();
        let config = template
            .replace("${ADMIN_PORT}", &admin_port.to_string())
            .replace("${LISTEN_PORT}", &port.to_string())
            .replace("${STATE_PORT}", &opts.state_port.to_string())
            .replace("${WASM_PATH}", &paths::filter_wasm()?.display().to_string())
            .replace("${WORKER_LB_ENDPOINTS}", &lb_endpoints)
            .replace("${WORKER_CLUSTERS}", clusters.trim_end())
            .replace("${PLUGIN_CONFIG}", &plugin.to_string());
        let path = std::env::temp_dir().join(format!("kvroute-e2e-envoy-{port}.yaml"));
        std::fs::write(&path, config)?;
        let args = [
            "-c".to_string(),
            path.display().to_string(),
            "--disable-hot-restart".into(),
            "--concurrency".into(),
            "1".into(),
            "--log-level".into(),
            "info".into(),
        ];
        let mut proc = Proc::spawn("envoy", &paths::envoy()?, &args)?;
        let ready = format!("http://127.0.0.1:{admin_port}/ready");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        // Envoy exits at once on a rejected config: report that instead of waiting it out.
        loop {
            proc.check_alive()?;
            if wait_http_ok(&ready, Duration::from_millis(200)).await.is_ok() {
                return Ok(Envoy { proc, port, admin_port });
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!("envoy not ready after 60 s; log:\n{}", proc.log_tail(4000));
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// A filter counter (`wasmcustom.<name>`), 0 when not yet defined.
    pub async fn counter(&self, name: &str) -> Result<u64> {
        let url = format!("http://127.0.0.1:{}/stats?format=json&filter=^wasmcustom\\.{name}$", self.admin_port);
        let v: Value = reqwest::get(&url).await?.json().await?;
        let stats = v["stats"].as_array().cloned().unwrap_or_default();
        Ok(stats.iter().find_map(|s| s["value"].as_u64()).unwrap_or(0))
    }
}
