//! docker-compose.yml cannot be run here (no Docker engine), so this checks its structure:
//! the services exist and share one network namespace (loopback-only traffic), the files
//! it mounts and builds from exist, and docker/envoy.yaml and docker/state.toml are exactly
//! what `kvroute-bench stack --port-base 10000` generates (so they stay in sync with the
//! tested generator). `KVROUTE_BLESS=1 cargo test -p kvroute-bench --test compose`
//! rewrites the two files from the generator.

use kvroute_bench::stack::config::{envoy_yaml, state_toml};
use kvroute_bench::stack::{Ports, StackConfig};
use serde_yaml::Value;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn compose() -> Value {
    let text = std::fs::read_to_string(root().join("docker-compose.yml")).unwrap();
    let mut v: Value = serde_yaml::from_str(&text).unwrap();
    v.apply_merge().unwrap();
    v
}

fn container_cfg() -> StackConfig {
    StackConfig {
        sim_bin: "kvroute-sim".into(),
        state_bin: "kvroute-state".into(),
        envoy_bin: "envoy".into(),
        wasm: "/etc/envoy/kvroute_filter.wasm".into(),
        workers: 4,
        ports: Ports::from_base(10000),
        model: "kvroute/sim-27b-fp8".into(),
        time_scale: 0.25,
        admin_token: "compose-demo".into(),
        api_token: String::new(),
        tokenizer_dir: None,
        sim_args: vec![],
        work_dir: "/tmp".into(),
        // The production topology: two replicas on three Redis shards.
        replicas: 2,
        redis_shards: 3,
        redis_bin: "redis-server".into(),
        scheduling: false,
        scheduling_set: Vec::new(),
        tenant_header: false,
    }
}

fn strs(v: &Value) -> Vec<String> {
    v.as_sequence().map(|s| s.iter().filter_map(|x| x.as_str().map(String::from)).collect()).unwrap_or_default()
}

#[test]
fn services_share_one_loopback_namespace() {
    let c = compose();
    let services = c["services"].as_mapping().unwrap();
    let names: Vec<&str> = services.keys().filter_map(|k| k.as_str()).collect();
    for want in ["redis", "redis-1", "redis-2", "state", "state-1", "envoy", "demo", "sim-0", "sim-1", "sim-2", "sim-3"] {
        assert!(names.contains(&want), "missing service {want}");
    }
    for (name, s) in services {
        if name.as_str() != Some("redis") {
            assert_eq!(s["network_mode"].as_str(), Some("service:redis"), "{name:?}");
            assert!(s["ports"].is_null(), "{name:?} publishes ports outside the shared namespace");
        }
    }
    let ports = strs(&c["services"]["redis"]["ports"]);
    for p in ["10000", "10002"] {
        assert!(ports.iter().any(|x| x.starts_with("127.0.0.1:") && x.ends_with(&format!(":{p}"))), "port {p}");
    }
    for (i, service) in ["redis", "redis-1", "redis-2"].iter().enumerate() {
        let cmd = strs(&c["services"][*service]["command"]).join(" ");
        assert!(cmd.contains(&format!("--port {}", 10300 + i)), "{service}: {cmd}");
    }
    for i in 0..4 {
        let cmd = strs(&c["services"][format!("sim-{i}").as_str()]["command"]).join(" ");
        assert!(cmd.contains(&format!("--http-port {}", 10100 + i)), "{cmd}");
        assert!(cmd.contains(&format!("--zmq-port {}", 10200 + 2 * i)), "{cmd}");
    }
    let demo = strs(&c["services"]["demo"]["command"]).join(" ");
    assert!(demo.contains("--attach") && demo.contains("--url=http://127.0.0.1:10000"));
    for bad in ["http://redis", "http://envoy", "http://state"] {
        assert!(!demo.contains(bad), "the demo must target loopback");
    }
}

#[test]
fn mounted_and_built_files_exist() {
    let c = compose();
    for (name, s) in c["services"].as_mapping().unwrap() {
        for vol in strs(&s["volumes"]) {
            let src = vol.split(':').next().unwrap();
            if src.starts_with("./") && !src.starts_with("./bench/results") {
                assert!(root().join(src).is_file(), "{name:?} mounts missing {src}");
            }
        }
        if let Some(df) = s["build"]["dockerfile"].as_str() {
            assert!(root().join(df).is_file(), "{name:?} builds from missing {df}");
        }
    }
    assert_eq!(strs(&c["services"]["envoy"]["volumes"]), ["./docker/envoy.yaml:/etc/envoy/envoy.yaml:ro"]);
    assert_eq!(strs(&c["services"]["state"]["volumes"]), ["./docker/state.toml:/etc/kvroute/state.toml:ro"]);
    assert_eq!(strs(&c["services"]["state-1"]["volumes"]), ["./docker/state-1.toml:/etc/kvroute/state.toml:ro"]);
    let envoy_df = std::fs::read_to_string(root().join("docker/envoy.Dockerfile")).unwrap();
    assert!(envoy_df.contains("/etc/envoy/kvroute_filter.wasm"));
    assert!(envoy_df.contains("envoyproxy/envoy:v1.40"));
}

#[test]
fn docker_configs_match_the_generator() {
    let cfg = container_cfg();
    let (envoy, state, state1) = (envoy_yaml(&cfg), state_toml(&cfg, 0), state_toml(&cfg, 1));
    let envoy_path = root().join("docker/envoy.yaml");
    let (state_path, state1_path) = (root().join("docker/state.toml"), root().join("docker/state-1.toml"));
    if std::env::var("KVROUTE_BLESS").is_ok() {
        std::fs::write(&envoy_path, &envoy).unwrap();
        std::fs::write(&state_path, &state).unwrap();
        std::fs::write(&state1_path, &state1).unwrap();
    }
    let on_disk = std::fs::read_to_string(&envoy_path).unwrap();
    assert_eq!(on_disk, envoy, "docker/envoy.yaml is stale: rerun with KVROUTE_BLESS=1");
    assert_eq!(std::fs::read_to_string(&state_path).unwrap(), state, "docker/state.toml is stale");
    assert_eq!(std::fs::read_to_string(&state1_path).unwrap(), state1, "docker/state-1.toml is stale");
    assert!(state.contains("store = \"redis\"") && state1.contains("listen = \"127.0.0.1:10051\""));
    assert!(on_disk.contains("port_value: 10002") && on_disk.contains("port_value: 10051"), "both replicas behind kvroute_state");
    // What a reader checks by eye: the wasm path and the state-service cluster.
    let y: Value = serde_yaml::from_str(&on_disk).unwrap();
    let clusters = &y["static_resources"]["clusters"];
    let names: Vec<&str> = clusters.as_sequence().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["kvroute_state", "vllm_workers"]);
    assert!(on_disk.contains("filename: \"/etc/envoy/kvroute_filter.wasm\""));
    assert!(on_disk.contains("state_cluster") && on_disk.contains("allow_on_headers_stop_iteration: true"));
    assert!(state.contains("listen = \"127.0.0.1:10002\""));
}
