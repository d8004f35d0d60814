//! NGINX with Kong's ngx_wasm_module as the proxy host, from `envoy/test-nginx.conf.tmpl`:
//! the same `kvroute_filter.wasm`, the decision in an NGINX variable. Runs only where
//! `KVROUTE_NGINX` names such a binary (no package registry ships one; see envoy/README.md).

use crate::net::{free_port, API_TOKEN};
use crate::paths;
use crate::proc::Proc;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// The NGINX binary to test with, or `None` (the caller prints [`SKIP`] and passes).
pub fn binary() -> Option<PathBuf> {
    std::env::var_os("KVROUTE_NGINX").map(PathBuf::from).filter(|p| p.is_file())
}

pub const SKIP: &str = "skipped: NGINX with ngx_wasm_module not found (set KVROUTE_NGINX)";

/// `envoy/test-nginx.conf.tmpl`.
pub fn template() -> Result<String> {
    std::fs::read_to_string(paths::repo_root().join("envoy/test-nginx.conf.tmpl")).context("reading the NGINX template")
}

/// The template with its placeholders filled (what the tests run, and `envoy/nginx-wasm.conf`
/// with example values).
pub fn render(template: &str, prefix: &str, wasm: &str, workers: &[String], listen: &str, plugin: &Value) -> String {
    let servers: String = workers.iter().map(|w| format!("        server {w};\n")).collect();
    template
        .replace("${PREFIX}", prefix)
        .replace("${WASM_PATH}", wasm)
        .replace("${WORKER_SERVERS}", servers.trim_end())
        .replace("${LISTEN}", listen)
        .replace("${PLUGIN_CONFIG}", &plugin.to_string())
}

/// The example's values: the demo's ports, the state service on :9000.
pub fn example() -> Result<String> {
    let workers: Vec<String> = (8100..8104).map(|p| format!("127.0.0.1:{p}")).collect();
    let plugin = json!({
        "state_cluster": "127.0.0.1:9000",
        "route_variable": "kvroute_upstream",
        "fallback_endpoints": 0,
        "pick_timeout_ms": 50,
        "state_token": "REPLACE-WITH-THE-STATE-SERVICE-API-TOKEN",
        "allowed_targets": ["127.0.0.1:81*"],
    });
    Ok(render(&template()?, "/var/lib/kvroute-nginx", "/etc/kvroute/kvroute_filter.wasm", &workers, "0.0.0.0:10000", &plugin))
}

pub struct Nginx {
    pub proc: Proc,
    pub port: u16,
    pub dir: PathBuf,
}

impl Nginx {
    /// NGINX in front of `worker_ports`, asking the state service on `state_port`; `plugin`
    /// is merged over the harness defaults.
    pub async fn start(bin: &std::path::Path, worker_ports: &[u16], state_port: u16, plugin: &Value) -> Result<Nginx> {
        let template = template()?;
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("kvroute-e2e-nginx-{port}"));
        std::fs::create_dir_all(&dir)?;
        let mut config = json!({
            "state_cluster": format!("127.0.0.1:{state_port}"),
            "route_variable": "kvroute_upstream",
            "fallback_endpoints": 0,
            "pick_timeout_ms": 2000,
            "report_flush_ms": 50,
            "state_token": API_TOKEN,
            "decision_header": true,
            "trusted_sources": ["127.0.0.1/32"],
        });
        if let (Some(base), Value::Object(extra)) = (config.as_object_mut(), plugin) {
            for (k, v) in extra {
                base.insert(k.clone(), v.clone());
            }
        }
        let servers: Vec<String> = worker_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let rendered = render(&template, &dir.display().to_string(), &paths::filter_wasm()?.display().to_string(), &servers, &format!("127.0.0.1:{port}"), &config);
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, rendered)?;
        let args = vec!["-p".to_string(), dir.display().to_string(), "-c".into(), conf.display().to_string()];
        let mut proc = Proc::spawn("nginx", bin, &args)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            proc.check_alive()?;
            anyhow::ensure!(std::time::Instant::now() < deadline, "nginx not listening after 30 s:\n{}", proc.log_tail(4000));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Nginx { proc, port, dir })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The end of NGINX's error log (the filter logs there).
    pub fn log_tail(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).map(|l| l.chars().rev().take(4000).collect::<Vec<_>>().into_iter().rev().collect()).unwrap_or_default()
    }
}
