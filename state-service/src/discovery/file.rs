//! A file source: the group's workers listed in a YAML (or JSON) file that the group's task
//! reads again every `min_refresh_ms` and applies when its content changed. The format is
//! llm-d's file discovery (`file-discovery` plugin, `endpoints:` with `name`, `namespace`,
//! `address`, `port` as a string or a number, `labels`), so one file can feed both; kvroute
//! adds `model`, `events_port` and `replay_port`, and takes a `model` label as the model:
//!
//! ```yaml
//! endpoints:
//!   - name: vllm-0             # optional: the worker id is GROUP@name (else GROUP@address:port)
//!     address: 10.0.0.5        # required: an IP address (IPv6 bare or in brackets) or a host name
//!     port: "8000"             # required: the serving port
//!     labels: { pool: canary } # optional: merged over the template's
//!     model: qwen3-32b         # optional: instead of the template's (or a `model` label)
//!     events_port: 5557        # optional: instead of the group's
//!     replay_port: 5558        # optional: instead of the group's
//! ```
//!
//! Unlike llm-d, which skips a bad entry (and so deletes its endpoint), a missing, unreadable
//! or invalid file (a bad entry, a duplicate name or address, an unknown field) is a failed
//! look: counted, logged, and the whole last good set stays, so a half-written or mistyped
//! file never drains a fleet. Write the file by renaming a complete one over it (a ConfigMap
//! volume does); polling sees renames and symlink swaps alike.

use crate::config::groups::WorkerGroup;
use crate::config::WorkerConfig;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Listing {
    #[serde(default)]
    endpoints: Vec<Endpoint>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Endpoint {
    #[serde(default)]
    name: Option<String>,
    /// llm-d's; accepted, not used (one group is one namespace).
    #[serde(default)]
    #[allow(dead_code)]
    namespace: Option<String>,
    address: String,
    port: Port,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    events_port: Option<u16>,
    #[serde(default)]
    replay_port: Option<u16>,
}

/// A port as llm-d writes it (`"8000"`) or as a number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Port {
    Number(u16),
    Text(String),
}

impl Port {
    fn get(&self) -> Option<u16> {
        match self {
            Port::Number(p) => Some(*p),
            Port::Text(t) => t.trim().parse().ok(),
        }
        .filter(|p| *p != 0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// A watched file and what its last good content named.
pub struct Watched {
    path: PathBuf,
    last: Option<(String, Vec<WorkerConfig>)>,
}

impl Watched {
    pub fn new(path: &Path) -> Watched {
        Watched { path: path.to_path_buf(), last: None }
    }

    /// The workers the file names now (parsed again only when its content changed).
    pub fn read(&mut self, group: &WorkerGroup) -> Result<Vec<WorkerConfig>, FileError> {
        let path = self.path.display().to_string();
        let text = std::fs::read_to_string(&self.path).map_err(|e| FileError::Read { path: path.clone(), message: e.to_string() })?;
        if let Some((seen, workers)) = &self.last {
            if *seen == text {
                return Ok(workers.clone());
            }
        }
        let workers = parse(group, &text).map_err(|message| FileError::Invalid { path, message })?;
        self.last = Some((text, workers.clone()));
        Ok(workers)
    }
}

/// The workers a listing names, each from the group's template.
pub fn parse(group: &WorkerGroup, text: &str) -> Result<Vec<WorkerConfig>, String> {
    let listing: Listing = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
    let (mut ids, mut addresses) = (BTreeSet::new(), BTreeSet::new());
    let mut workers = Vec::with_capacity(listing.endpoints.len());
    for (i, e) in listing.endpoints.into_iter().enumerate() {
        let host = host(&e.address).ok_or_else(|| format!("endpoints[{i}].address {:?} is not a host name or IP address", e.address))?;
        let port = e.port.get().ok_or_else(|| format!("endpoints[{i}].port {:?} is not a port (1-65535)", e.port))?;
        if !addresses.insert((host.clone(), port)) {
            return Err(format!("endpoints[{i}]: {host}:{port} is listed twice"));
        }
        let mut w = group.worker_at(&host, port);
        if let Some(name) = e.name {
            if name.is_empty() || name.contains(['/', ' ', '?', '#']) {
                return Err(format!("endpoints[{i}].name {name:?} must be non-empty without '/', '?', '#' or spaces"));
            }
            w.id = format!("{}@{name}", group.name);
        }
        if !ids.insert(w.id.clone()) {
            return Err(format!("endpoints[{i}]: the name of {} is listed twice", w.id));
        }
        if let Some(p) = e.events_port {
            w.events_endpoint = Some(format!("tcp://{host}:{p}"));
        }
        if let Some(p) = e.replay_port {
            w.replay_endpoint = Some(format!("tcp://{host}:{p}"));
        }
        if let Some(model) = e.model.or_else(|| e.labels.get("model").cloned()) {
            w.model = model;
        }
        if w.model.is_empty() {
            return Err(format!("endpoints[{i}] names no model and the group's template has none"));
        }
        w.labels.extend(e.labels);
        workers.push(w);
    }
    Ok(workers)
}

/// `address` as the host part of `host:port`: an IP address (IPv6 bracketed) or a DNS name.
fn host(address: &str) -> Option<String> {
    let bare = address.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(address);
    if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
        return Some(match ip {
            std::net::IpAddr::V4(v4) => v4.to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        });
    }
    let name_ok = !bare.is_empty()
        && bare.len() <= 253
        && bare.split('.').all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    name_ok.then(|| bare.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> WorkerGroup {
        let toml = r#"
            name = "farm"
            file = "/tmp/x.yaml"
            events_port = 5557
            [template]
            model = "m"
            labels = { tier = "gpu" }
        "#;
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn entries_become_workers_from_the_template() {
        let text = "endpoints:\n  - {address: 10.0.0.5, port: 8000, labels: {pool: canary}}\n  - {address: '::1', port: 8001, model: other, events_port: 6000}\n\
                    # llm-d's shape\n  - {name: vllm-0, namespace: default, address: 10.0.0.10, port: \"8000\", labels: {model: qwen}}\n";
        let w = parse(&group(), text).unwrap();
        assert_eq!(w[0].id, "farm@10.0.0.5:8000");
        assert_eq!(w[0].endpoint, "10.0.0.5:8000");
        assert_eq!(w[0].events_endpoint.as_deref(), Some("tcp://10.0.0.5:5557"));
        assert_eq!(w[0].metrics_url.as_deref(), Some("http://10.0.0.5:8000/metrics"));
        assert_eq!(w[0].labels.get("tier").map(String::as_str), Some("gpu"));
        assert_eq!(w[0].labels.get("pool").map(String::as_str), Some("canary"));
        assert_eq!(w[1].id, "farm@[::1]:8001");
        assert_eq!(w[1].model, "other");
        assert_eq!(w[1].events_endpoint.as_deref(), Some("tcp://[::1]:6000"));
        assert_eq!(w[2].id, "farm@vllm-0");
        assert_eq!(w[2].endpoint, "10.0.0.10:8000");
        assert_eq!(w[2].model, "qwen");
    }

    #[test]
    fn a_bad_listing_is_refused_whole() {
        for bad in [
            "endpoints:\n  - {address: 10.0.0.5}\n",
            "endpoints:\n  - {address: 'a b', port: 1}\n",
            "endpoints:\n  - {address: h, port: 1}\n  - {address: h, port: 1}\n",
            "endpoints:\n  - {address: h, port: 1, colour: red}\n",
            "endpoints:\n  - {address: h, port: '0'}\n",
            "endpoints:\n  - {name: a, address: h, port: 1}\n  - {name: a, address: i, port: 1}\n",
            "workers: []\n",
        ] {
            assert!(parse(&group(), bad).is_err(), "{bad}");
        }
        assert!(parse(&group(), "endpoints: []\n").unwrap().is_empty());
    }
}
