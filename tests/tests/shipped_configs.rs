//! Every Envoy configuration kvroute ships (envoy/, the test templates, docker/ which is the
//! benchmark stack's generator output, kept equal by bench/tests/compose.rs) takes the peer
//! address from the connection: each HTTP connection manager sets `use_remote_address: true`
//! and trusts no X-Forwarded-For hops, so a client's X-Forwarded-For never becomes the address
//! that `trusted_sources` and the trusted-hop identity source are checked against. The NGINX
//! configs never replace `$remote_addr` with a client header (no `real_ip`).
//!
//! Every Envoy config also heals and bounds itself (issue 33): the `kvroute_state` cluster
//! health-checks `/readyz` and ejects a replica whose picks fail, every connection manager times
//! out slow headers and bodies, and Envoy caps its downstream connections.

use serde_yaml::Value;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The shipped Envoy configs, with the harness's `${PLACEHOLDERS}` filled by plain scalars.
fn envoy_configs() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for dir in ["envoy", "docker"] {
        for entry in std::fs::read_dir(repo().join(dir)).expect("config folder").flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if !(name.ends_with(".yaml") || name.ends_with(".yaml.tmpl")) {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).expect("readable config");
            let filled = fill_placeholders(&text);
            let value: Value = serde_yaml::from_str(&filled).unwrap_or_else(|e| panic!("{dir}/{name} is not YAML: {e}"));
            out.push((format!("{dir}/{name}"), value));
        }
    }
    out
}

/// `${NAME}` -> `0`, the worker lists empty (the placeholders are ports, paths and lists the
/// harness fills: tests/src/envoy.rs).
fn fill_placeholders(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        match rest[at..].find('}') {
            Some(end) => {
                let name = &rest[at..at + end + 1];
                out.push_str(match name {
                    "${WORKER_LB_ENDPOINTS}" | "${STATE_LB_ENDPOINTS}" => "[]",
                    "${WORKER_CLUSTERS}" => "",
                    _ => "0",
                });
                rest = &rest[at + end + 1..];
            }
            None => {
                rest = &rest[at..];
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every mapping whose `@type` names an HTTP connection manager.
fn connection_managers<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Mapping(m) => {
            if m.get("@type").and_then(Value::as_str).is_some_and(|t| t.ends_with(".HttpConnectionManager")) {
                out.push(v);
            }
            m.values().for_each(|child| connection_managers(child, out));
        }
        Value::Sequence(s) => s.iter().for_each(|child| connection_managers(child, out)),
        _ => {}
    }
}

#[test]
fn every_connection_manager_takes_the_peer_from_the_connection() {
    let configs = envoy_configs();
    assert!(configs.len() >= 4, "the shipped configs: {:?}", configs.iter().map(|c| &c.0).collect::<Vec<_>>());
    for (name, config) in &configs {
        let mut managers = Vec::new();
        connection_managers(config, &mut managers);
        assert!(!managers.is_empty(), "{name}: no HTTP connection manager found");
        for m in managers {
            assert_eq!(m.get("use_remote_address").and_then(Value::as_bool), Some(true), "{name}: use_remote_address must be true");
            let hops = m.get("xff_num_trusted_hops").and_then(Value::as_u64).unwrap_or(0);
            assert_eq!(hops, 0, "{name}: a trusted X-Forwarded-For hop would let a client's header name the peer");
            assert!(m.get("original_ip_detection_extensions").is_none(), "{name}: the peer must be the connection's");
        }
    }
}

/// The cluster named `name`, wherever the config lists clusters.
fn cluster<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    match v {
        Value::Mapping(m) => {
            if m.get("name").and_then(Value::as_str) == Some(name) && m.contains_key("load_assignment") {
                return Some(v);
            }
            m.values().find_map(|child| cluster(child, name))
        }
        Value::Sequence(s) => s.iter().find_map(|child| cluster(child, name)),
        _ => None,
    }
}

/// `"1s"` / `"0.25s"` in seconds.
fn seconds(v: Option<&Value>) -> Option<f64> {
    v?.as_str()?.strip_suffix('s')?.parse().ok()
}

#[test]
fn every_state_cluster_ejects_a_failed_replica() {
    for (name, config) in &envoy_configs() {
        let state = cluster(config, "kvroute_state").unwrap_or_else(|| panic!("{name}: no kvroute_state cluster"));
        let check = &state["health_checks"][0];
        assert_eq!(check["http_health_check"]["path"].as_str(), Some("/readyz"), "{name}: health check on readiness");
        assert!(seconds(check.get("interval")).is_some_and(|s| s <= 1.0), "{name}: probe every second at least");
        assert!(check["unhealthy_threshold"].as_u64().is_some_and(|n| n <= 2), "{name}: two failed probes eject");
        assert!(seconds(check.get("no_traffic_interval")).is_some_and(|s| s <= 5.0), "{name}: idle clusters are probed too");
        let outlier = &state["outlier_detection"];
        assert!(outlier["consecutive_5xx"].as_u64().is_some_and(|n| n <= 2), "{name}: two failed picks eject");
        assert_eq!(outlier["max_ejection_percent"].as_u64(), Some(100), "{name}: any replica may be ejected");
    }
}

#[test]
fn every_envoy_bounds_slow_and_greedy_clients() {
    for (name, config) in &envoy_configs() {
        let mut managers = Vec::new();
        connection_managers(config, &mut managers);
        for m in managers {
            assert!(seconds(m.get("request_headers_timeout")).is_some_and(|s| s > 0.0), "{name}: request_headers_timeout");
            assert!(seconds(m.get("request_timeout")).is_some_and(|s| s > 0.0), "{name}: request_timeout");
            assert!(seconds(m["common_http_protocol_options"].get("idle_timeout")).is_some_and(|s| s > 0.0), "{name}: idle_timeout");
        }
        let monitors = config["overload_manager"]["resource_monitors"].as_sequence().cloned().unwrap_or_default();
        let limit = monitors
            .iter()
            .find(|m| m["name"].as_str() == Some("envoy.resource_monitors.global_downstream_max_connections"))
            .and_then(|m| m["typed_config"]["max_active_downstream_connections"].as_u64());
        assert!(limit.is_some_and(|n| n > 0), "{name}: a downstream connection limit");
    }
}

#[test]
fn nginx_configs_keep_the_connection_address() {
    for name in ["envoy/nginx-wasm.conf", "envoy/test-nginx.conf.tmpl"] {
        let text = std::fs::read_to_string(repo().join(name)).expect("nginx config");
        for directive in ["real_ip_header", "set_real_ip_from", "real_ip_recursive"] {
            let used = text.lines().map(str::trim).any(|l| !l.starts_with('#') && l.starts_with(directive));
            assert!(!used, "{name}: `{directive}` would take the peer address from a client header");
        }
    }
}

#[test]
fn the_checker_sees_a_manager_without_it() {
    let bad: Value = serde_yaml::from_str(
        "a: [{typed_config: {'@type': type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager, stat_prefix: x}}]",
    )
    .unwrap();
    let mut managers = Vec::new();
    connection_managers(&bad, &mut managers);
    assert_eq!(managers.len(), 1);
    assert_eq!(managers[0].get("use_remote_address"), None);
    assert_eq!(fill_placeholders("port: ${PORT}\nx: ${WORKER_LB_ENDPOINTS}\n${WORKER_CLUSTERS}"), "port: 0\nx: []\n");
}
