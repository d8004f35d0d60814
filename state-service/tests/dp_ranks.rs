//! Data parallelism end to end: one simulated vLLM server with two DP ranks (`kvroute-sim`,
//! in process, real ZMQ), configured in the state service as one worker with `dp_ranks = 2`
//! and rank 0's endpoints. Ingestion must derive rank 1's ports (+ 1, vLLM's rule), keep each
//! rank's blocks under its own engine, and end up with exactly each rank's cache.

use kvroute_sim::chat::ChatTokenizer;
use kvroute_sim::cluster::{Cluster, ClusterConfig, WorkerLayout};
use kvroute_sim::engine::EngineConfig;
use kvroute_state::config::{Config, WorkerConfig};
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_state::app::App;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DP: usize = 2;

/// A sim on a fixed ZMQ base port (the "+ r" rule needs real ports, not OS-chosen ones),
/// retried on another base if something else holds one of its 2 * DP ports.
async fn start_sim() -> Cluster {
    for _ in 0..20 {
        let base = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        if base > u16::MAX - 2 * DP as u16 {
            continue;
        }
        let cfg = ClusterConfig {
            workers: 1,
            dp_size: DP,
            http_port: 0,
            zmq_port: base,
            // 40 blocks per rank: the load below evicts, so BlockRemoved is exercised.
            engine: EngineConfig { time_scale: 0.01, num_gpu_blocks: 40, ..EngineConfig::default() },
            ..ClusterConfig::default()
        };
        if let Ok(c) = Cluster::start(cfg, Arc::new(ChatTokenizer::byte_fallback())).await {
            return c;
        }
    }
    panic!("no free run of {} ZMQ ports", 2 * DP);
}

fn worker_config(l: &WorkerLayout) -> WorkerConfig {
    WorkerConfig {
        endpoint: l.http.trim_start_matches("http://").to_string(),
        events_endpoint: l.kv_events.clone(),
        replay_endpoint: l.kv_replay.clone(),
        block_size: Some(l.block_size as u32),
        dp_ranks: DP as u32,
        ..WorkerConfig::new("w0", &l.model)
    }
}

/// A completion pinned to `rank` (vLLM's `X-data-parallel-rank`).
async fn complete(client: &reqwest::Client, l: &WorkerLayout, rank: usize, prompt: Vec<u32>) {
    let body = serde_json::json!({"model": l.model, "prompt": prompt, "max_tokens": 2, "ignore_eos": true});
    let r = client.post(format!("{}/v1/completions", l.http)).header("X-data-parallel-rank", rank.to_string()).json(&body).send().await.expect("sim up");
    assert!(r.status().is_success(), "status {}", r.status());
    assert_eq!(r.headers()["x-sim-dp-rank"], rank.to_string().as_str());
}

/// Rank `rank`'s `(cached engine hashes sorted, next_seq)`, its publisher flushed.
async fn rank_state(client: &reqwest::Client, l: &WorkerLayout, rank: usize) -> (Vec<u64>, u64) {
    let v: serde_json::Value = client.get(format!("{}/sim/state", l.http)).send().await.expect("sim up").json().await.expect("JSON");
    let r = &v["ranks"][rank];
    assert_eq!(r["dp_rank"], rank as u64);
    let hashes = r["cached_block_hashes"].as_array().expect("hashes").iter().filter_map(|h| h.as_u64()).collect();
    (hashes, r["publisher"]["next_seq"].as_u64().expect("next_seq"))
}

fn last_seq(state: &App, rank: usize) -> Option<u64> {
    let w = state.fleet.worker("w0").expect("worker");
    let feed = w.engines[rank].feed.lock().clone().expect("ingestion runs");
    feed.snapshot().last_seq
}

fn prompt(rank: usize, conv: u32, len: u32) -> Vec<u32> {
    (0..len).map(|t| 1000 + rank as u32 * 50_000 + conv * 97 + t % 50).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_per_engine_equals_each_ranks_cache() {
    let sim = start_sim().await;
    let l = sim.layout[0].clone();
    assert_eq!(l.ranks.len(), DP);
    let index = Arc::new(MemoryIndex::new());
    let config = Config { workers: vec![worker_config(&l)], ..Config::default() };
    let state = kvroute_state::app::App::start(config, kvroute_state::store::memory::MemoryStore::store(index.clone())).expect("valid config");
    let client = reqwest::Client::new();

    // Different conversations per rank, sharing prefixes within a rank.
    for i in 0..30u32 {
        let rank = (i % 2) as usize;
        complete(&client, &l, rank, prompt(rank, i % 6, 40 + (i * 13) % 120)).await;
    }

    // A subscriber that joined late only catches up (from replay) when a live batch arrives:
    // send a fresh prompt to a rank until its feed has applied everything it published.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut truth = Vec::new();
    for rank in 0..DP {
        let mut nudge = 1000;
        loop {
            let (hashes, next) = rank_state(&client, &l, rank).await;
            if next > 0 && last_seq(&state, rank) == Some(next - 1) {
                truth.push(hashes);
                break;
            }
            assert!(Instant::now() < deadline, "rank {rank}: feed at {:?}, published up to {next}", last_seq(&state, rank));
            nudge += 1;
            complete(&client, &l, rank, prompt(rank, nudge, 40)).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Settling rank 1 sent nothing to rank 0, so rank 0's truth still holds.
    let w = state.fleet.worker("w0").expect("worker");
    for (rank, hashes) in truth.iter().enumerate() {
        assert!(!hashes.is_empty(), "rank {rank} caches blocks");
        let indexed: Vec<u64> = index.export(w.engines[rank].slot).into_iter().map(|b| b.hash.0).collect();
        assert_eq!(&indexed, hashes, "engine of rank {rank}: index vs /sim/state");
    }
    assert!(truth[0].iter().all(|h| !truth[1].contains(h)), "the ranks' caches are separate");
    drop(w);
    assert!(state.membership.remove_worker("w0"));
}
