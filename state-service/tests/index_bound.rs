//! A worker whose event stream floods blocks it cannot hold: its engine's index stays within
//! the capacity its `/metrics` reports (times `resilience.index_capacity_factor`), the
//! overflow is dropped oldest first and counted, and the other workers' matches are untouched.
//! Real ZMQ (the simulator's vLLM-shaped publisher) and a real metrics endpoint.

use axum::routing::get;
use axum::Router;
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_kv::index::KvIndex;
use kvroute_sim::engine::{KvEvent, Medium};
use kvroute_sim::events::{encode_batch, spawn_publisher, EventEncoding, PubCommand, PublisherConfig};
use kvroute_sim::ids::EngineHash;
use kvroute_state::app::App;
use kvroute_state::config::{Config, WorkerConfig};
use kvroute_state::store::memory::MemoryStore;
use std::sync::Arc;
use std::time::Duration;

const REPORTED_BLOCKS: u64 = 1000;

async fn metrics_server() -> String {
    let text = format!("vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} 0.0\nvllm:cache_config_info{{block_size=\"16\",engine=\"0\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{REPORTED_BLOCKS}\"}} 1.0\n");
    let app = Router::new().route("/metrics", get(move || std::future::ready(text.clone())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/metrics")
}

/// `n` one-block roots starting at block `first`, as one batch.
fn batch(first: u64, n: u64) -> Vec<u8> {
    let events: Vec<KvEvent> = (first..first + n)
        .map(|b| KvEvent::BlockStored {
            block_hashes: vec![EngineHash(1_000_000 + b)],
            parent_block_hash: None,
            token_ids: (0..16).map(|t| (b * 16 + t) as u32).collect(),
            block_size: 16,
            extra_keys: Some(vec![None]),
            medium: Medium::Gpu,
            kv_cache_spec_kind: None,
        })
        .collect();
    encode_batch(0.0, &events, 0, EventEncoding::Map)
}

/// This process's resident set, KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

/// What one flood did: blocks held at the end, dropped as over capacity, RSS before and after (KiB).
struct Flood {
    held: usize,
    over: u64,
    distinct: u64,
    rss_before: u64,
    rss_after: u64,
}

/// Floods one worker reporting `REPORTED_BLOCKS` with `blocks` distinct one-block roots.
async fn flood(factor: f64, blocks: u64) -> (Flood, App, Arc<MemoryIndex>) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let ctx = zmq::Context::new();
    let cfg = PublisherConfig { endpoint: format!("tcp://127.0.0.1:{port}"), replay_endpoint: None, topic: String::new(), buffer_steps: 16, hwm: 100_000 };
    let (publisher, _, _) = spawn_publisher(&ctx, cfg).expect("publisher");
    let mut config = Config { seed: Some(7), ..Config::default() };
    config.timeouts.scrape_interval_ms = 100;
    config.resilience.index_capacity_factor = factor;
    config.workers.push(WorkerConfig {
        events_endpoint: Some(format!("tcp://127.0.0.1:{port}")),
        metrics_url: Some(metrics_server().await),
        block_size: Some(16),
        ..WorkerConfig::new("flood", "m")
    });
    let index: Arc<MemoryIndex> = Arc::new(MemoryIndex::new());
    let app = App::start(config, MemoryStore::store(index.clone())).expect("app");
        let worker = app.fleet.worker("flood").expect("registered");
    let slot = worker.engines[0].slot;

    // The subscriber joins late (ZMQ PUB): repeat a first batch until it is seen.
    let feed = || worker.engines[0].feed.lock().clone().expect("ingesting").snapshot();
    for _ in 0..100 {
        publisher.send(PubCommand::Batch(batch(0, 1)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        if feed().batches > 0 {
            break;
        }
    }
    assert!(feed().batches > 0, "the subscriber never joined");
    // Bounded once a scrape reported the capacity.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // `blocks` distinct blocks, none ever removed, paced so the subscriber keeps up.
    let (base_stored, base_held) = (feed().blocks_stored, index.engine_blocks(slot) as u64);
    let rss_before = rss_kib();
    for b in 0..blocks / 100 {
        publisher.send(PubCommand::Batch(batch(1 + b * 100, 100)));
        if b % 500 == 499 {
            while feed().blocks_stored + 20_000 < base_stored + b * 100 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    publisher.flush().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while feed().blocks_stored < base_stored + blocks && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = feed();
    assert_eq!(stats.blocks_stored, base_stored + blocks, "every batch arrived");
    let over = stats.rejected.iter().find(|(k, _)| *k == "over_capacity").map_or(0, |(_, n)| *n);
    let held = index.engine_blocks(slot);
    let out = Flood { held, over, distinct: base_held + blocks, rss_before, rss_after: rss_kib() };
    drop(publisher);
    (out, app, index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_worker_is_held_to_its_reported_capacity() {
    let (f, app, index) = flood(2.0, 20_000).await;
    let cap = (REPORTED_BLOCKS as f64 * 2.0) as usize + 256;
    println!("held {} of {} distinct blocks stored (cap {cap}), {} dropped as over capacity", f.held, f.distinct, f.over);
    assert!(f.held <= cap, "held {} > cap {cap}", f.held);
    assert_eq!(f.held as u64 + f.over, f.distinct, "every block either held or counted");
    // The newest are kept: the last batch's blocks match.
    let last = kvroute_core::keys::token_block_keys(&kvroute_core::keys::KeyRoot::new("m", ""), &(19_901u32 * 16..19_902 * 16).collect::<Vec<_>>(), 16);
    assert_eq!(index.match_prefix(&last).len(), 1);
    let metrics = app.metrics.encode();
    assert!(metrics.lines().any(|l| l.starts_with("kvroute_events_rejected_total") && l.contains("over_capacity") && !l.ends_with(" 0")), "counted in metrics");
}

/// The memory a 2M-block flood costs with and without the bound (one process per run:
/// `cargo test --release -p kvroute-state --test index_bound flood_rss -- --ignored --nocapture`,
/// `KVROUTE_FLOOD_FACTOR=0` for the unbounded run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures"]
async fn flood_rss() {
    let factor = std::env::var("KVROUTE_FLOOD_FACTOR").ok().and_then(|v| v.parse().ok()).unwrap_or(2.0);
    let (f, _app, _index) = flood(factor, 2_000_000).await;
    println!(
        "factor {factor}: held {} of {} blocks, {} dropped; RSS {} -> {} MiB (+{} MiB)",
        f.held,
        f.distinct,
        f.over,
        f.rss_before / 1024,
        f.rss_after / 1024,
        f.rss_after.saturating_sub(f.rss_before) / 1024
    );
}
