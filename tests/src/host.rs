//! The proxy host the end-to-end tests run the filter in: Envoy always, and NGINX with Kong's
//! ngx_wasm_module when `KVROUTE_NGINX` names such a binary. A test that means the same thing
//! in both loops over [`hosts()`] and runs ONE body against each; what only Envoy has (cluster
//! mode, override-host failover down the fallback list, admin stats, listener TLS, extra HTTP
//! filters) stays Envoy-only and says so where the test is.

use crate::envoy::{Envoy, EnvoyExtra, EnvoyOptions, Mode};
use crate::nginx::{self, Nginx, NginxExtra};
use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Host {
    #[default]
    Envoy,
    /// The NGINX binary (built with ngx_wasm_module).
    Nginx(PathBuf),
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Host::Envoy => "envoy",
            Host::Nginx(_) => "nginx",
        })
    }
}

/// The hosts to run a shared test body against: Envoy, then NGINX when `KVROUTE_NGINX` is set.
/// Without it, prints [`nginx::SKIP`] once per test binary.
pub fn hosts() -> Vec<Host> {
    static SKIP_ONCE: std::sync::Once = std::sync::Once::new();
    match nginx::binary() {
        Some(bin) => vec![Host::Envoy, Host::Nginx(bin)],
        None => {
            SKIP_ONCE.call_once(|| eprintln!("{}", nginx::SKIP));
            vec![Host::Envoy]
        }
    }
}

/// Runs `body` once per host of [`hosts()`], naming the host in its output and in the error.
pub async fn for_each_host<F, Fut>(mut body: F) -> Result<()>
where
    F: FnMut(Host) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    for host in hosts() {
        eprintln!("through {host}");
        let name = host.to_string();
        body(host).await.with_context(|| format!("through {name}"))?;
    }
    Ok(())
}

/// A started proxy with the filter (or without it, or with another module) in front of the
/// workers.
pub enum Proxy {
    Envoy(Envoy),
    Nginx(Nginx),
}

impl Proxy {
    /// Starts `host` with the same options the Envoy harness takes. NGINX has no cluster mode and
    /// none of Envoy's listener extras: asking for them is an error, not a silent substitute.
    pub async fn start(host: &Host, opts: EnvoyOptions, extra: EnvoyExtra) -> Result<Proxy> {
        match host {
            Host::Envoy => Ok(Proxy::Envoy(Envoy::start_with(opts, extra).await?)),
            Host::Nginx(bin) => {
                anyhow::ensure!(opts.mode == Mode::Endpoint, "cluster mode is Envoy-only (NGINX routes through a variable)");
                anyhow::ensure!(
                    extra.concurrency == 1 && extra.filters_before.is_empty() && extra.downstream_tls.is_none(),
                    "--concurrency, extra HTTP filters and listener TLS are Envoy-only harness options"
                );
                let nx = NginxExtra { wasm: extra.wasm, module: extra.module, plain_listener: extra.plain_listener };
                Ok(Proxy::Nginx(Nginx::start_with(bin, &opts.worker_ports, opts.state_port, &opts.plugin, &nx).await?))
            }
        }
    }

    pub fn host_name(&self) -> &'static str {
        match self {
            Proxy::Envoy(_) => "envoy",
            Proxy::Nginx(_) => "nginx",
        }
    }

    /// A URL on the listener with the filter.
    pub fn url(&self, path: &str) -> String {
        match self {
            Proxy::Envoy(e) => e.url(path),
            Proxy::Nginx(n) => n.url(path),
        }
    }

    /// A URL on the same proxy's plain route (no filter; panics when it was not requested).
    pub fn plain_url(&self, path: &str) -> String {
        match self {
            Proxy::Envoy(e) => e.plain_url(path),
            Proxy::Nginx(n) => n.plain_url(path),
        }
    }

    /// The proxy's log (the filter logs there).
    pub fn log_tail(&self) -> String {
        match self {
            Proxy::Envoy(e) => e.proc.log_tail(3000),
            Proxy::Nginx(n) => n.log_tail(),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        match self {
            Proxy::Envoy(e) => e.proc.pid(),
            Proxy::Nginx(n) => n.proc.pid(),
        }
    }

    /// A filter counter: `Some` in Envoy (admin stats); `None` in NGINX, which has no endpoint
    /// that shows proxy-wasm metrics, so assertions on counters are Envoy-only.
    pub async fn counter(&self, name: &str) -> Result<Option<u64>> {
        match self {
            Proxy::Envoy(e) => Ok(Some(e.counter(name).await?)),
            Proxy::Nginx(_) => Ok(None),
        }
    }

    /// The Envoy of an Envoy-only test.
    pub fn envoy(&self) -> Result<&Envoy> {
        match self {
            Proxy::Envoy(e) => Ok(e),
            Proxy::Nginx(_) => None.context("an Envoy-only test ran on NGINX"),
        }
    }
}
