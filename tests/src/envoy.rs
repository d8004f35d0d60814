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

/// Variations for benchmarks; `Default` is what [`Envoy::start`] runs.
#[derive(Clone, Debug)]
pub struct EnvoyExtra {
    /// `--concurrency`: Envoy worker threads (one Wasm VM each when the filter is loaded).
    pub concurrency: u32,
    /// Load the kvroute Wasm filter. `false` renders the same template with the filter's entry
    /// removed from the HTTP filter chain (the module is then never loaded).
    pub wasm: bool,
    /// Adds a second listener without any HTTP filter but the router, routing to `workers_rr`,
    /// a plain `ROUND_ROBIN` cluster over the same workers: the baseline of the latency benchmark.
    pub plain_listener: bool,
    /// Load this module instead of the kvroute filter (e.g. one that traps).
    pub module: Option<std::path::PathBuf>,
    /// HTTP filters (YAML list items at the chain's indentation) placed before kvroute, e.g.
    /// `jwt_authn`: what the proxy verifies before the filter reads it.
    pub filters_before: String,
    /// Serve the LLM listener over TLS, verifying client certificates when presented.
    pub downstream_tls: Option<DownstreamTls>,
    /// More state-service replicas: the state cluster's endpoints after `state_port`.
    pub more_state_ports: Vec<u16>,
    /// The `workers` cluster as a Kubernetes headless Service is proxied: `STRICT_DNS` on a
    /// name (every address it resolves to, re-resolved on the TTL) instead of `worker_ports`.
    pub workers_dns: Option<WorkersDns>,
}

/// A `STRICT_DNS` workers cluster: `name:port`, asked of `resolver`.
#[derive(Clone, Debug)]
pub struct WorkersDns {
    pub name: String,
    pub port: u16,
    pub resolver: std::net::SocketAddr,
}

impl WorkersDns {
    /// The cluster's head (after its name) and its endpoints.
    fn render(&self) -> (String, String) {
        let head = format!(
            r#"    type: STRICT_DNS
    dns_refresh_rate: 1s
    respect_dns_ttl: true
    dns_lookup_family: V4_ONLY
    typed_dns_resolver_config:
      name: envoy.network.dns_resolver.cares
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig
        resolvers: [{{ socket_address: {{ address: "{}", port_value: {} }} }}]
        dns_resolver_options: {{ no_default_search_domain: true }}
"#,
            self.resolver.ip(),
            self.resolver.port()
        );
        let endpoints = format!("[{{endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}}}]", self.name, self.port);
        (head, endpoints)
    }
}

/// PEM files of the listener's TLS (a test CA made at test time).
#[derive(Clone, Debug)]
pub struct DownstreamTls {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// Client certificates must chain to this CA; a client may also present none.
    pub client_ca: std::path::PathBuf,
}

impl Default for EnvoyExtra {
    fn default() -> Self {
        EnvoyExtra { concurrency: 1, wasm: true, plain_listener: false, module: None, filters_before: String::new(), downstream_tls: None, more_state_ports: Vec::new(), workers_dns: None }
    }
}

/// The LLM listener's filter chain over TLS (client certificates optional, verified).
fn with_downstream_tls(config: &str, tls: &DownstreamTls) -> Result<String> {
    const CHAIN: &str = "\n    filter_chains:\n    - filters:\n";
    anyhow::ensure!(config.contains(CHAIN), "template layout changed: no filter_chains");
    let socket = format!(
        r#"
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: false
          common_tls_context:
            tls_certificates:
            - certificate_chain: {{ filename: "{}" }}
              private_key: {{ filename: "{}" }}
            validation_context:
              trusted_ca: {{ filename: "{}" }}
      filters:
"#,
        tls.cert.display(),
        tls.key.display(),
        tls.client_ca.display()
    );
    Ok(config.replacen(CHAIN, &socket, 1))
}

pub struct Envoy {
    pub proc: Proc,
    pub port: u16,
    pub admin_port: u16,
    /// The plain round-robin listener ([`EnvoyExtra::plain_listener`]).
    pub plain_port: Option<u16>,
}

/// Removes the kvroute entry (from `- name: kvroute` up to the router) from the HTTP filter chain.
fn without_wasm_filter(config: &str) -> Result<String> {
    let lines: Vec<&str> = config.lines().collect();
    let start = lines.iter().position(|l| l.trim() == "- name: kvroute").context("template: no `- name: kvroute` filter")?;
    let end = lines[start..]
        .iter()
        .position(|l| l.trim() == "- name: envoy.filters.http.router")
        .map(|i| start + i)
        .context("template: no router after the kvroute filter")?;
    let mut out: Vec<&str> = lines[..start].to_vec();
    out.extend_from_slice(&lines[end..]);
    Ok(out.join("\n") + "\n")
}

fn plain_listener(port: u16) -> String {
    format!(
        r#"  - name: plain
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    per_connection_buffer_limit_bytes: 16777216
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: plain
          use_remote_address: true
          route_config:
            virtual_hosts:
            - name: plain
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route: {{ cluster: workers_rr, timeout: 300s }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

fn plain_cluster(lb_endpoints: &str) -> String {
    format!(
        r#"  - name: workers_rr
    type: STATIC
    connect_timeout: 1s
    per_connection_buffer_limit_bytes: 16777216
    lb_policy: ROUND_ROBIN
    load_assignment:
      cluster_name: workers_rr
      endpoints:
      - lb_endpoints: {lb_endpoints}
"#
    )
}

impl Envoy {
    pub async fn start(opts: EnvoyOptions) -> Result<Envoy> {
        Envoy::start_with(opts, EnvoyExtra::default()).await
    }

    pub async fn start_with(opts: EnvoyOptions, extra: EnvoyExtra) -> Result<Envoy> {
        let root = paths::repo_root();
        let template = std::fs::read_to_string(root.join(opts.mode.template())).context("reading envoy template")?;
        let (port, admin_port) = (free_port(), free_port());
        let mut plugin = json!({
            "state_cluster": "kvroute_state",
            "routing_mode": opts.mode.name(),
            // Loaded CI machines: a 50 ms budget would make routing assertions flaky.
            "pick_timeout_ms": 2000,
            "report_flush_ms": 50,
            // From Envoy's environment (vm_config.environment_variables), as operators should.
            "state_token_env": "KVROUTE_STATE_TOKEN",
            // The tests read the decision's details; off by default, and only for trusted peers.
            "decision_header": true,
            "trusted_sources": ["127.0.0.1/32"],
        });
        if let (Some(base), Value::Object(extra)) = (plugin.as_object_mut(), &opts.plugin) {
            for (k, v) in extra {
                base.insert(k.clone(), v.clone());
            }
        }
        let endpoint = |p: u16| format!("{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}}}}}");
        let endpoints = |ports: &mut dyn Iterator<Item = &u16>| format!("[{}]", ports.map(|p| endpoint(*p)).collect::<Vec<_>>().join(", "));
        let mut lb_endpoints = endpoints(&mut opts.worker_ports.iter());
        let state_endpoints = endpoints(&mut std::iter::once(&opts.state_port).chain(&extra.more_state_ports));
        // Worker i's own cluster: i at priority 0, the others at priority 1 (its failover).
        let clusters: String = opts
            .worker_ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let others: Vec<String> = opts.worker_ports.iter().filter(|o| *o != p).map(|o| endpoint(*o)).collect();
                let failover =
                    if others.is_empty() { String::new() } else { format!(", {{priority: 1, lb_endpoints: [{}]}}", others.join(", ")) };
                format!(
                    "  - {{name: {}, type: STATIC, connect_timeout: 1s, load_assignment: {{cluster_name: {}, endpoints: [{{lb_endpoints: [{}]}}{failover}]}}}}\n",
                    worker_cluster(i),
                    worker_cluster(i),
                    endpoint(*p)
                )
            })
            .collect();
        let mut template = if extra.wasm { template } else { without_wasm_filter(&template)? };
        if !extra.filters_before.is_empty() {
            const KVROUTE: &str = "\n          - name: kvroute\n";
            anyhow::ensure!(template.contains(KVROUTE), "template layout changed: no kvroute filter");
            template = template.replacen(KVROUTE, &format!("\n{}\n          - name: kvroute\n", extra.filters_before.trim_end()), 1);
        }
        if let Some(tls) = &extra.downstream_tls {
            template = with_downstream_tls(&template, tls)?;
        }
        if let Some(dns) = &extra.workers_dns {
            const WORKERS: &str = "\n  - name: workers\n    type: STATIC\n";
            anyhow::ensure!(template.contains(WORKERS), "template layout changed: no STATIC workers cluster");
            let (head, endpoints) = dns.render();
            template = template.replacen(WORKERS, &format!("\n  - name: workers\n{head}"), 1);
            lb_endpoints = endpoints;
        }
        let plain_port = extra.plain_listener.then(free_port);
        if let Some(p) = plain_port {
            anyhow::ensure!(template.contains("\n  listeners:\n") && template.contains("\n  clusters:\n"), "template layout changed");
            template = template
                .replacen("\n  listeners:\n", &format!("\n  listeners:\n{}", plain_listener(p)), 1)
                .replacen("\n  clusters:\n", &format!("\n  clusters:\n{}", plain_cluster(&lb_endpoints)), 1);
        }
        let config = template
            .replace("${ADMIN_PORT}", &admin_port.to_string())
            .replace("${LISTEN_PORT}", &port.to_string())
            .replace("${STATE_LB_ENDPOINTS}", &state_endpoints)
            .replace("${WASM_PATH}", &extra.module.clone().map_or_else(paths::filter_wasm, Ok)?.display().to_string())
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
            extra.concurrency.to_string(),
            "--log-level".into(),
            "info".into(),
        ];
        let mut proc = Proc::spawn_env("envoy", &paths::envoy()?, &args, &[("KVROUTE_STATE_TOKEN", crate::net::API_TOKEN)])?;
        let ready = format!("http://127.0.0.1:{admin_port}/ready");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        // Envoy exits at once on a rejected config: report that instead of waiting it out.
        loop {
            proc.check_alive()?;
            if wait_http_ok(&ready, Duration::from_millis(200)).await.is_ok() {
                return Ok(Envoy { proc, port, admin_port, plain_port });
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!("envoy not ready after 60 s; log:\n{}", proc.log_tail(4000));
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// A URL on the plain round-robin listener (panics when it was not requested).
    pub fn plain_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.plain_port.expect("Envoy started without plain_listener"), path)
    }

    /// Envoy's resident set size (`VmRSS` of `/proc/<pid>/status`), KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.proc.pid()?)).ok()?;
        status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()
    }

    /// Every admin stat (text format) whose name matches the regex `filter`, as (name, value).
    pub async fn stats(&self, filter: &str) -> Result<Vec<(String, String)>> {
        let url = format!("http://127.0.0.1:{}/stats", self.admin_port);
        let text = reqwest::Client::new().get(&url).query(&[("filter", filter)]).send().await?.text().await?;
        Ok(text.lines().filter_map(|l| l.split_once(": ")).map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    /// A filter counter (`wasmcustom.<name>`), 0 when not yet defined.
    pub async fn counter(&self, name: &str) -> Result<u64> {
        let url = format!("http://127.0.0.1:{}/stats?format=json&filter=^wasmcustom\\.{name}$", self.admin_port);
        let v: Value = reqwest::get(&url).await?.json().await?;
        let stats = v["stats"].as_array().cloned().unwrap_or_default();
        Ok(stats.iter().find_map(|s| s["value"].as_u64()).unwrap_or(0))
    }
}
