//! Worker groups: workers the service finds itself, by DNS (a Kubernetes headless Service, an
//! SRV record) or in a file it watches, each registered from the group's template
//! (`discovery.rs` runs them).

use super::file::WorkerConfig;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// `[[worker_groups]]`: one source of workers and the template each is registered with.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerGroup {
    /// Names the group in ids (`NAME@host:port`), logs and metrics.
    pub name: String,
    /// An A/AAAA name: one worker per address, serving on `port`.
    #[serde(default)]
    pub dns: Option<String>,
    /// An SRV name (`_http._tcp.vllm.ns.svc.cluster.local`): one worker per target address
    /// and the record's port.
    #[serde(default)]
    pub srv: Option<String>,
    /// A file listing the workers (see `discovery/file.rs` for its format), watched.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// The serving port of an A/AAAA group.
    #[serde(default)]
    pub port: Option<u16>,
    /// Each address's KV-event publisher port (vLLM `--kv-events-config` endpoint); none: load
    /// from metrics and assignments only.
    #[serde(default)]
    pub events_port: Option<u16>,
    /// Each address's replay port.
    #[serde(default)]
    pub replay_port: Option<u16>,
    /// The metrics path on the serving port; empty: not scraped.
    #[serde(default = "metrics_path")]
    pub metrics_path: String,
    /// The DNS server to ask (`host:port`); default: the system's (`/etc/resolv.conf`).
    #[serde(default)]
    pub resolver: Option<SocketAddr>,
    /// Bounds of the re-resolve interval, which is the answer's TTL within them; a file is
    /// checked every `min_refresh_ms`.
    #[serde(default = "min_refresh_ms")]
    pub min_refresh_ms: u64,
    #[serde(default = "max_refresh_ms")]
    pub max_refresh_ms: u64,
    /// Every field of a `[[workers]]` entry but those the group derives (`id`, `endpoint`,
    /// `cluster`, `events_endpoint`, `replay_endpoint`, `metrics_url`): `model` (required),
    /// `labels`, `block_size`, `dp_ranks`, costs, adapters.
    pub template: WorkerConfig,
}

fn metrics_path() -> String {
    "/metrics".into()
}

fn min_refresh_ms() -> u64 {
    1_000
}

fn max_refresh_ms() -> u64 {
    30_000
}

/// Where a group's workers come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source<'a> {
    Dns { name: &'a str, port: u16 },
    Srv(&'a str),
    File(&'a std::path::Path),
}

impl WorkerGroup {
    /// The group's one source (validated).
    pub fn source(&self) -> Option<Source<'_>> {
        match (&self.dns, &self.srv, &self.file) {
            (Some(name), None, None) => Some(Source::Dns { name, port: self.port? }),
            (None, Some(name), None) => Some(Source::Srv(name)),
            (None, None, Some(path)) => Some(Source::File(path)),
            _ => None,
        }
    }

    /// The worker serving at `host:port` (an IPv6 host in brackets): the template with the
    /// derived id, endpoint, event, replay and metrics addresses.
    pub fn worker_at(&self, host: &str, port: u16) -> WorkerConfig {
        let mut w = self.template.clone();
        w.id = format!("{}@{host}:{port}", self.name);
        w.endpoint = format!("{host}:{port}");
        w.events_endpoint = self.events_port.map(|p| format!("tcp://{host}:{p}"));
        w.replay_endpoint = self.replay_port.map(|p| format!("tcp://{host}:{p}"));
        w.metrics_url = (!self.metrics_path.is_empty()).then(|| format!("http://{host}:{port}{}", self.metrics_path));
        w
    }

    /// What is wrong with the group, as (field, message).
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if self.name.is_empty() || self.name.contains(['/', ' ', '?', '#', '@']) {
            return Some(("name", "must be non-empty without '/', '?', '#', '@' or spaces".into()));
        }
        let sources = [self.dns.is_some(), self.srv.is_some(), self.file.is_some()].iter().filter(|s| **s).count();
        if sources != 1 {
            return Some(("dns", "set exactly one of dns, srv and file".into()));
        }
        if self.dns.is_some() != self.port.is_some() {
            return Some(("port", "a dns group needs port (the serving port); srv and file groups name their own".into()));
        }
        if [&self.dns, &self.srv].into_iter().flatten().any(|n| n.is_empty()) {
            return Some(("dns", "the name must not be empty".into()));
        }
        if self.file.is_none() && (self.template.model.is_empty()) {
            return Some(("template.model", "must be non-empty".into()));
        }
        if !self.metrics_path.is_empty() && !self.metrics_path.starts_with('/') {
            return Some(("metrics_path", "must start with '/' (or be empty: not scraped)".into()));
        }
        if self.min_refresh_ms == 0 || self.max_refresh_ms < self.min_refresh_ms {
            return Some(("min_refresh_ms", "must be > 0 and at most max_refresh_ms".into()));
        }
        let t = &self.template;
        let derived = [!t.id.is_empty(), !t.endpoint.is_empty(), !t.cluster.is_empty(), t.events_endpoint.is_some(), t.replay_endpoint.is_some(), t.metrics_url.is_some()];
        if derived.iter().any(|d| *d) {
            return Some(("template", "id, endpoint, cluster, events_endpoint, replay_endpoint and metrics_url come from the group, not the template".into()));
        }
        None
    }
}
