//! Calibration table for sim/README.md: measured TTFT vs uncached prompt tokens and
//! inter-token latency vs batch size, through real HTTP against one in-process worker with
//! the default profile, next to what the profile intends.
//!
//! `cargo run -p kvroute-sim --release --example calibrate [-- --time-scale 1.0]`

use kvroute_sim::chat::ChatTokenizer;
use kvroute_sim::cluster::{Cluster, ClusterConfig};
use kvroute_sim::engine::{EngineConfig, StepProfile};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Stream one completion; returns (ttft, mean gap between later chunks).
async fn stream(client: &reqwest::Client, url: &str, prompt: Vec<u32>, max_tokens: u32) -> (f64, f64) {
    let body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true, "stream": true});
    let start = Instant::now();
    let mut resp = client.post(url).json(&body).send().await.expect("request");
    let mut stamps = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let n = chunk.windows(6).filter(|w| w == b"data: ").count();
        for _ in 0..n {
            stamps.push(start.elapsed().as_secs_f64());
        }
    }
    let tokens: Vec<f64> = stamps[..stamps.len().saturating_sub(1)].to_vec(); // minus [DONE]
    let ttft = tokens.first().copied().unwrap_or(f64::NAN);
    let gaps: Vec<f64> = tokens.windows(2).skip(2).map(|w| w[1] - w[0]).collect();
    let itl = if gaps.is_empty() { f64::NAN } else { gaps.iter().sum::<f64>() / gaps.len() as f64 };
    (ttft, itl)
}

#[tokio::main]
async fn main() {
    let scale: f64 = std::env::args()
        .skip_while(|a| a != "--time-scale")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let engine = EngineConfig { time_scale: scale, ..EngineConfig::default() };
    let p: StepProfile = engine.profile.clone();
    let budget = engine.max_num_batched_tokens;
    let cfg = ClusterConfig { workers: 1, http_port: 0, zmq_port: 0, engine, ..ClusterConfig::default() };
    let cluster = Cluster::start(cfg, Arc::new(ChatTokenizer::byte_fallback())).await.expect("start");
    let url = format!("{}/v1/completions", cluster.layout[0].http);
    let client = reqwest::Client::new();

    println!("time scale {scale}; measured values are divided by the scale\n");
    println!("| uncached prompt tokens | intended TTFT (s) | measured TTFT (s) |");
    println!("|---:|---:|---:|");
    for (i, n) in [128usize, 512, 1024, 2048, 4096, 8192].into_iter().enumerate() {
        let prompt: Vec<u32> = (0..n as u32).map(|t| t + 1_000_000 * (i as u32 + 1)).collect();
        let (ttft, _) = stream(&client, &url, prompt, 1).await;
        // Chunks of `budget` tokens; the last step also carries the sequence cost.
        let steps = n.div_ceil(budget);
        let intended = steps as f64 * p.overhead_s + n as f64 * p.per_prefill_token_s + steps as f64 * p.per_running_seq_s;
        println!("| {n} | {intended:.3} | {:.3} |", ttft / scale);
    }

    println!("\n| batch size | intended ITL (ms) | measured ITL (ms) |");
    println!("|---:|---:|---:|");
    for (j, b) in [1usize, 8, 32, 64, 128].into_iter().enumerate() {
        let mut tasks = Vec::new();
        for k in 0..b {
            let (client, url) = (client.clone(), url.clone());
            let prompt: Vec<u32> = vec![(j * 1000 + k) as u32 + 7; 16];
            tasks.push(tokio::spawn(async move { stream(&client, &url, prompt, 40).await }));
        }
        let mut itls = Vec::new();
        for t in tasks {
            itls.push(t.await.expect("task").1);
        }
        let itl = itls.iter().sum::<f64>() / itls.len() as f64;
        let intended = p.step_seconds(0, b);
        println!("| {b} | {:.1} | {:.1} |", intended * 1e3, itl / scale * 1e3);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
