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
    /// The plain server's port (`NginxExtra::plain_listener`).
    pub plain_port: Option<u16>,
    pub dir: PathBuf,
}

/// Variations of the rendered config; `Default` is what [`Nginx::start`] runs.
#[derive(Clone, Debug)]
pub struct NginxExtra {
    /// Load the filter. `false` renders the template without its `wasm {}` block and
    /// `proxy_wasm` line (the module is then never loaded).
    pub wasm: bool,
    /// Load this module instead of the kvroute filter (e.g. one that traps).
    pub module: Option<PathBuf>,
    /// Adds a second server without the filter: `proxy_pass http://workers_default` (NGINX's
    /// own round robin over the same workers), the baseline of the latency benchmark.
    pub plain_listener: bool,
}

impl Default for NginxExtra {
    fn default() -> Self {
        NginxExtra { wasm: true, module: None, plain_listener: false }
    }
}

/// The rendered config without the module: the `wasm { .. }` block and every `proxy_wasm` line.
pub fn without_wasm(config: &str) -> Result<String> {
    let mut out = Vec::new();
    let mut in_wasm = false;
    let mut removed = 0;
    for line in config.lines() {
        let t = line.trim();
        if t == "wasm {" {
            in_wasm = true;
        } else if in_wasm {
            in_wasm = t != "}";
        } else if t.starts_with("proxy_wasm ") {
            removed += 1;
        } else {
            out.push(line);
        }
    }
    anyhow::ensure!(removed > 0 && !in_wasm, "NGINX template layout changed: no wasm block or proxy_wasm line");
    Ok(out.join("\n") + "\n")
}

/// A second server on `listen` in the same `http {}`: NGINX's own balancing over the same
/// upstream, no filter, the same buffering as the kvroute server.
fn with_plain_server(config: &str, listen: &str) -> Result<String> {
    let end = config.trim_end().rfind('}').context("NGINX template layout changed: no closing brace of http {}")?;
    let server = format!(
        "\n    server {{\n        listen {listen};\n        client_body_buffer_size 16m;\n        client_max_body_size 64m;\n        \
         proxy_buffering off;\n\n        location / {{\n            proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n            \
         proxy_pass http://workers_default;\n        }}\n    }}\n"
    );
    Ok(format!("{}{server}{}", &config[..end], &config[end..]))
}

impl Nginx {
    /// NGINX in front of `worker_ports`, asking the state service on `state_port`; `plugin`
    /// is merged over the harness defaults.
    pub async fn start(bin: &std::path::Path, worker_ports: &[u16], state_port: u16, plugin: &Value) -> Result<Nginx> {
        Nginx::start_with(bin, worker_ports, state_port, plugin, &NginxExtra::default()).await
    }

    pub async fn start_with(bin: &std::path::Path, worker_ports: &[u16], state_port: u16, plugin: &Value, extra: &NginxExtra) -> Result<Nginx> {
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
        let wasm = match &extra.module {
            Some(m) => m.clone(),
            None => paths::filter_wasm()?,
        };
        let mut rendered = render(&template, &dir.display().to_string(), &wasm.display().to_string(), &servers, &format!("127.0.0.1:{port}"), &config);
        if !extra.wasm {
            rendered = without_wasm(&rendered)?;
        }
        let plain_port = extra.plain_listener.then(free_port);
        if let Some(p) = plain_port {
            rendered = with_plain_server(&rendered, &format!("127.0.0.1:{p}"))?;
        }
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
        Ok(Nginx { proc, port, plain_port, dir })
    }

    /// A URL on the plain server (panics when it was not requested).
    pub fn plain_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.plain_port.expect("NGINX started without plain_listener"))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The end of NGINX's error log (the filter logs there).
    pub fn log_tail(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).map(|l| l.chars().rev().take(4000).collect::<Vec<_>>().into_iter().rev().collect()).unwrap_or_default()
    }
}
