//! The CPU offload tier end to end: a prompt evicted from the GPU but held by the CPU tier
//! is served from it (usage and the first-scheduling counters say so), and a subscriber
//! that only sees the wire ends up with both tiers' block sets.

mod common;

use common::*;
use kvroute_sim::engine::hashing::hash_blocks;
use kvroute_sim::engine::{EngineConfig, OffloadConfig};
use kvroute_sim::metrics::sample;

fn prompt(seed: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| seed * 100_000 + i).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_evicted_prefix_is_reloaded_from_cpu_with_events_and_counters() {
    // 19 usable GPU blocks: two 10-block fillers push the first prompt out of the GPU.
    let engine = EngineConfig {
        num_gpu_blocks: 20,
        time_scale: 0.01,
        offload: OffloadConfig { cpu_blocks: 200, ..OffloadConfig::default() },
        ..EngineConfig::default()
    };
    let cluster = start_engine(engine).await;
    let layout = cluster.layout[0].clone();
    let http = layout.http.clone();
    let client = reqwest::Client::new();
    let ctx = zmq::Context::new();

    let first = complete(&client, &http, prompt(1, 100), 1).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    complete(&client, &http, prompt(2, 150), 1).await;
    complete(&client, &http, prompt(3, 150), 1).await;
    let p1: Vec<u64> = hash_blocks(&prompt(1, 100), 16, None).iter().map(|d| d.engine_hash().0).collect();
    // The last stores land a step after the response: wait for them.
    let mut st = state(&client, &http).await;
    for _ in 0..200 {
        if cpu_blocks(&st).len() == 6 + 9 + 9 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        st = state(&client, &http).await;
    }
    assert_eq!(cpu_blocks(&st).len(), 6 + 9 + 9, "every full prompt block was offloaded");
    assert!(p1.iter().all(|h| !engine_blocks(&st).contains(h)), "evicted from the GPU");
    let again = complete(&client, &http, prompt(1, 100), 1).await;
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 96, "loaded from the CPU tier");
    let st = state(&client, &http).await;
    assert!(p1.iter().all(|h| engine_blocks(&st).contains(h)), "GPU-resident again");

    let text = client.get(format!("{http}/metrics")).send().await.unwrap().text().await.unwrap();
    let l = "{model_name=\"kvroute/sim-27b-fp8\",engine=\"0\"";
    let get = |n: &str| sample(&text, &format!("{n}{l}")).unwrap_or(-1.0);
    assert_eq!(get("kvroute_sim_prompt_tokens_first_scheduled_total"), 500.0);
    let cached = |m: &str| {
        sample(&text, &format!("kvroute_sim_cached_tokens_first_scheduled_total{l},medium=\"{m}\"}}")).unwrap()
    };
    assert_eq!((cached("GPU"), cached("CPU")), (0.0, 96.0));
    assert_eq!(get("vllm:external_prefix_cache_hits_total"), 96.0);
    assert_eq!(get("vllm:num_requests_waiting"), 0.0);

    // Both tiers' sets, rebuilt from the wire alone (full replay).
    let st = state(&client, &http).await;
    let mut m = Mirror::default();
    m.replay(&ctx, &layout.kv_replay.unwrap());
    assert_eq!(m.next_seq, st["publisher"]["next_seq"].as_u64().unwrap());
    assert_eq!(m.blocks, engine_blocks(&st));
    assert_eq!(m.cpu_blocks, cpu_blocks(&st));
    assert_eq!(st["offload"]["loaded_blocks"], 6);
}
