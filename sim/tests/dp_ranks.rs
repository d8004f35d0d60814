//! Data-parallel ranks (`dp_size` 2): the worker's endpoint spreads concurrent requests over
//! both ranks; each rank publishes on its own ports with its rank in every batch, and its
//! stream (live or replayed) reproduces exactly that rank's cache; metrics have one series
//! per engine; faults can target one rank.

mod common;

use common::*;
use futures_like::join_all;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// `join_all` over spawned tasks, without a `futures` dependency.
mod futures_like {
    pub async fn join_all<T: Send + 'static>(fs: Vec<impl std::future::Future<Output = T> + Send + 'static>) -> Vec<T> {
        let handles: Vec<_> = fs.into_iter().map(tokio::spawn).collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.expect("task"));
        }
        out
    }
}

fn prompt(seed: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| seed * 100_000 + i).collect()
}

fn rank_blocks(st: &Value, r: usize) -> BTreeSet<u64> {
    engine_blocks(&st["ranks"][r])
}

async fn complete_on(client: &reqwest::Client, http: &str, rank: Option<u32>, prompt: Vec<u32>) -> reqwest::Response {
    let body = json!({"prompt": prompt, "max_tokens": 3, "ignore_eos": true});
    let mut req = client.post(format!("{http}/v1/completions")).json(&body);
    if let Some(r) = rank {
        req = req.header("X-data-parallel-rank", r.to_string());
    }
    req.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_spread_over_both_ranks() {
    // Real-time steps (tens of ms): requests sent together are all in flight at once, so
    // the balancer sees the earlier ones queued on the rank it gave them.
    let cluster = start_dp(1, 2, 400, 1.0).await;
    let http = cluster.layout[0].http.clone();
    let client = reqwest::Client::new();
    let sends = (0..6).map(|i| {
        let (client, http) = (client.clone(), http.clone());
        async move {
            let r = complete_on(&client, &http, None, prompt(i, 64)).await;
            assert!(r.status().is_success());
            r.headers()["x-sim-dp-rank"].to_str().unwrap().parse::<usize>().unwrap()
        }
    });
    let ranks = join_all(sends.collect()).await;
    let per_rank: Vec<usize> = (0..2).map(|r| ranks.iter().filter(|&&x| x == r).count()).collect();
    assert!(per_rank.iter().all(|&n| n > 0), "both ranks served: {per_rank:?}");
    let st = state(&client, &http).await;
    for (r, n) in per_rank.iter().enumerate() {
        assert_eq!(st["ranks"][r]["stats"]["requests_finished"], *n as u64, "rank {r}");
    }
    assert_eq!(st["dp_size"], 2);
    assert_eq!(st["stats"], Value::Null, "worker totals, per-rank detail in ranks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rank_publishes_its_own_cache_on_its_own_ports() {
    // 40 blocks per rank: the workload overflows it, so evictions happen too.
    let cluster = start_dp(2, 2, 40, 0.01).await;
    let layout = cluster.layout[1].clone();
    assert_eq!((layout.dp_size, layout.ranks.len()), (2, 2));
    assert_eq!(layout.kv_events, layout.ranks[0].kv_events, "the configured endpoint is rank 0's");
    let endpoints: BTreeSet<_> = cluster.layout.iter().flat_map(|l| l.ranks.iter().flat_map(|r| [r.kv_events.clone(), r.kv_replay.clone()])).collect();
    assert_eq!(endpoints.len(), 2 * 2 * 2, "distinct ports for every rank of every worker");
    let http = layout.http.clone();
    let client = reqwest::Client::new();
    let ctx = zmq::Context::new();
    let subs: Vec<Subscriber> = layout.ranks.iter().map(|r| Subscriber::connect(&ctx, r.kv_events.as_deref().unwrap())).collect();

    // Pinned requests (vLLM's X-data-parallel-rank): different prompts on each rank.
    for i in 0..24u32 {
        let r = complete_on(&client, &http, Some(i % 2), prompt(i % 2 * 10 + i % 5, 100 + i * 7)).await;
        assert_eq!(r.headers()["x-sim-dp-rank"], (i % 2).to_string().as_str());
    }
    let st = state(&client, &http).await;
    for (r, sub) in subs.iter().enumerate() {
        let rank = &layout.ranks[r];
        let (events, replay) = (rank.kv_events.clone().unwrap(), rank.kv_replay.clone().unwrap());
        let upto = st["ranks"][r]["publisher"]["next_seq"].as_u64().unwrap();
        let mut live = Mirror::default();
        let (ctx2, replay2) = (ctx.clone(), replay.clone());
        live = tokio::task::block_in_place(|| {
            sub.sync(&mut live, &ctx2, &replay2, upto);
            live
        });
        assert_eq!(live.blocks, rank_blocks(&st, r), "rank {r} live on {events}");
        let mut fresh = Mirror::default();
        tokio::task::block_in_place(|| fresh.replay(&ctx, &replay));
        assert_eq!(fresh.next_seq, upto);
        assert_eq!(fresh.blocks, rank_blocks(&st, r), "rank {r}: replay on {replay} reproduces its cache");
        assert_eq!(fresh.ranks, BTreeSet::from([r as i64]), "every batch carries data_parallel_rank = {r}");
        assert_eq!(st["ranks"][r]["dp_rank"], r as u64);
    }
    assert!(rank_blocks(&st, 0).is_disjoint(&rank_blocks(&st, 1)), "separate caches, separate prompts");
    let union: BTreeSet<u64> = rank_blocks(&st, 0).union(&rank_blocks(&st, 1)).copied().collect();
    assert_eq!(engine_blocks(&st), union, "top level: the worker's union");
    let other = state(&client, &cluster.layout[0].http).await;
    assert!(engine_blocks(&other).is_empty(), "worker 0 untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_per_engine_and_faults_per_rank() {
    let cluster = start_dp(1, 2, 400, 0.01).await;
    let http = cluster.layout[0].http.clone();
    let client = reqwest::Client::new();
    for i in 0..3 {
        complete_on(&client, &http, Some(1), prompt(7, 40 + i)).await;
    }
    complete_on(&client, &http, Some(0), prompt(8, 40)).await;
    let st = state(&client, &http).await;
    let m = client.get(format!("{http}/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(m.matches("# TYPE vllm:prefix_cache_queries_total counter").count(), 1, "one family");
    for r in 0..2 {
        let l = format!("{{model_name=\"{}\",engine=\"{r}\"}}", cluster.layout[0].model);
        let get = |n: &str| kvroute_sim::metrics::sample(&m, &format!("{n}{l}")).unwrap();
        let stats = &st["ranks"][r]["stats"];
        assert_eq!(get("vllm:prefix_cache_queries_total"), stats["prefix_cache_queries"].as_f64().unwrap(), "engine {r}");
        assert_eq!(get("vllm:request_success_total"), stats["requests_finished"].as_f64().unwrap(), "engine {r}");
        assert_eq!(get("vllm:kv_cache_usage_perc"), st["ranks"][r]["kv_cache_usage"].as_f64().unwrap());
        assert!(m.contains(&format!("engine=\"{r}\",num_gpu_blocks=\"400\"")));
    }
    assert_eq!(st["ranks"][1]["stats"]["requests_finished"], 3);
    assert!(!m.contains("engine=\"2\""));

    // A fault for rank 1 only; then one for the whole worker.
    let r = client.post(format!("{http}/sim/fault")).json(&json!({"stop_publishing": true, "rank": 1})).send().await.unwrap();
    assert!(r.status().is_success());
    let st = state(&client, &http).await;
    assert_eq!((st["ranks"][0]["faults"]["stop_publishing"].as_bool(), st["ranks"][1]["faults"]["stop_publishing"].as_bool()), (Some(false), Some(true)));
    client.post(format!("{http}/sim/fault")).json(&json!({"slowdown": 2.0})).send().await.unwrap();
    let st = state(&client, &http).await;
    assert!((0..2).all(|r| st["ranks"][r]["faults"]["slowdown"] == 2.0));

    // Bad ranks are the client's error.
    let r = client.post(format!("{http}/sim/fault")).json(&json!({"restart": true, "rank": 2})).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    for bad in ["2", "x"] {
        let body = json!({"prompt": [1, 2, 3], "max_tokens": 1});
        let r = client.post(format!("{http}/v1/completions")).header("X-data-parallel-rank", bad).json(&body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "rank {bad}");
    }
}
