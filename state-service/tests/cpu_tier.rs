//! The CPU offloading tier end to end: a simulated vLLM worker with a small GPU cache and
//! a CPU pool (`kvroute-sim`, vLLM 0.33's offloading connector semantics: write-through
//! stores reported as `medium` "CPU" placeholders, LRU eviction), real ZMQ ingestion, the
//! real index and the pick. A prefix pushed out of the GPU but held in CPU memory is still
//! matched, split into its GPU part (none) and the offloaded rest, and predicted at reload
//! cost rather than recomputed.

use kvroute_core::keys::{token_block_keys, KeyRoot};
use kvroute_core::wire::PickRequest;
use kvroute_sim::chat::ChatTokenizer;
use kvroute_sim::cluster::{Cluster, ClusterConfig, WorkerLayout};
use kvroute_sim::engine::{EngineConfig, OffloadConfig};
use kvroute_state::config::{Config, WorkerConfig};
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_kv::index::KvIndex;
use kvroute_state::app::App;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn start_sim() -> Cluster {
    let cfg = ClusterConfig {
        workers: 1,
        http_port: 0,
        zmq_port: 0,
        // 40 GPU blocks: three 20-block prompts cannot all stay; 400 CPU blocks keep them.
        engine: EngineConfig {
            time_scale: 0.01,
            num_gpu_blocks: 40,
            offload: OffloadConfig { cpu_blocks: 400, ..OffloadConfig::default() },
            ..EngineConfig::default()
        },
        ..ClusterConfig::default()
    };
    Cluster::start(cfg, Arc::new(ChatTokenizer::byte_fallback())).await.expect("sim starts")
}

fn prompt(conv: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * 16).map(|t| 2000 + conv * 1000 + t).collect()
}

async fn complete(client: &reqwest::Client, l: &WorkerLayout, prompt: &[u32]) {
    let body = serde_json::json!({"model": l.model, "prompt": prompt, "max_tokens": 2, "ignore_eos": true});
    let r = client.post(format!("{}/v1/completions", l.http)).json(&body).send().await.expect("sim up");
    assert!(r.status().is_success(), "status {}", r.status());
}

/// The sim's GPU and CPU block sets and its next sequence number.
async fn sim_state(client: &reqwest::Client, l: &WorkerLayout) -> (BTreeSet<u64>, BTreeSet<u64>, u64) {
    let v: serde_json::Value = client.get(format!("{}/sim/state", l.http)).send().await.expect("sim up").json().await.expect("JSON");
    let r = &v["ranks"][0];
    let set = |k: &str| r[k].as_array().expect(k).iter().filter_map(|h| h.as_u64()).collect();
    (set("cached_block_hashes"), set("cpu_cached_block_hashes"), r["publisher"]["next_seq"].as_u64().expect("next_seq"))
}

fn last_seq(state: &App) -> Option<u64> {
    let w = state.fleet.worker("w0").expect("worker");
    let feed = w.engines[0].feed.lock().clone().expect("ingestion runs");
    feed.snapshot().last_seq
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_evicted_from_the_gpu_is_matched_in_the_cpu_tier_and_predicted_at_reload_cost() {
    let sim = start_sim().await;
    let l = sim.layout[0].clone();
    let index = Arc::new(MemoryIndex::new());
    let worker = WorkerConfig {
        endpoint: l.http.trim_start_matches("http://").to_string(),
        events_endpoint: l.kv_events.clone(),
        replay_endpoint: l.kv_replay.clone(),
        block_size: Some(l.block_size as u32),
        ..WorkerConfig::new("w0", &l.model)
    };
    let state = kvroute_state::app::App::start(Config { workers: vec![worker], ..Config::default() }, kvroute_state::store::memory::MemoryStore::store(index.clone())).expect("valid config");
    let client = reqwest::Client::new();

    let first = prompt(0, 20);
    for p in [first.clone(), prompt(1, 20), prompt(2, 20)] {
        complete(&client, &l, &p).await;
    }
    // Until ingestion has applied everything published (a late subscriber catches up by replay
    // when a live batch arrives: nudge with tiny fresh prompts).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut nudge = 100;
    let (gpu, cpu) = loop {
        let (gpu, cpu, next) = sim_state(&client, &l).await;
        if next > 0 && last_seq(&state) == Some(next - 1) {
            break (gpu, cpu);
        }
        assert!(Instant::now() < deadline, "feed at {:?}, published up to {next}", last_seq(&state));
        nudge += 1;
        complete(&client, &l, &prompt(nudge, 1)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(cpu.len() > gpu.len(), "the CPU tier holds more than the GPU: {} vs {}", cpu.len(), gpu.len());

    let keys = token_block_keys(&KeyRoot::new(&l.model, ""), &first, 16);
    let w = state.fleet.worker("w0").expect("worker");
    let m = index.match_prefix(&keys).into_iter().find(|m| m.engine == w.engines[0].slot).expect("the first prompt is still held");
    // vLLM never caches a prompt's last block before the request ends with its first token
    // computed; 19 of 20 blocks are the most a worker can report.
    assert!(m.matched_blocks >= 19, "{m:?}");
    assert!(m.gpu_blocks < m.matched_blocks, "pushed out of the GPU by the later prompts: {m:?}");

    let req = PickRequest { model: l.model.clone(), token_keys: keys.iter().map(|k| k.0).collect(), block_size: 16, prompt_tokens: first.len() as u32, ..Default::default() };
    let resp = state.picker.pick(&req, kvroute_state::pick::Deadline::default()).await;
    assert_eq!(resp.matched_blocks, m.matched_blocks, "{resp:?}");
    // An idle worker: prediction = steps + (uncached prefill) + reload of the offloaded part.
    let p = &state.config.priors;
    let reloaded = (m.matched_blocks - m.gpu_blocks) as f64 * 16.0;
    let uncached = (first.len() as f64) - f64::from(m.matched_blocks) * 16.0;
    let want = p.overhead_ms + p.per_token_ms * uncached + p.reload_ms_per_token * reloaded;
    assert!((resp.predicted_ttft_ms - want).abs() < 1e-6, "predicted {} want {want}", resp.predicted_ttft_ms);
    drop(w);
    assert!(state.membership.remove_worker("w0"));
}
