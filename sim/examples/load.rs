//! Cost probe for sim/README.md: drive a running `kvroute-sim` at a fixed request rate of
//! long token-id prompts and report the simulator process's CPU use from /proc.
//!
//! `kvroute-sim --workers 8 ... & cargo run -p kvroute-sim --release --example load -- \
//!    --pid $! --workers 8 --http-port 8100 --rate 20 --prompt-tokens 8192 --seconds 30`

use std::time::{Duration, Instant};

fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0) + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0 // USER_HZ
}

#[tokio::main]
async fn main() {
    let pid = arg("--pid", 0.0) as u32;
    let workers = arg("--workers", 8.0) as usize;
    let port = arg("--http-port", 8100.0) as u16;
    let rate = arg("--rate", 20.0);
    let n = arg("--prompt-tokens", 8192.0) as u32;
    let secs = arg("--seconds", 30.0);
    let client = reqwest::Client::new();
    let start_cpu = cpu_seconds(pid);
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut sent = 0u64;
    let mut tasks = Vec::new();
    while start.elapsed().as_secs_f64() < secs {
        tick.tick().await;
        // 16 distinct 6k-token "system prompts" shared across requests, plus a unique tail.
        let shared = (sent % 16) as u32;
        let prompt: Vec<u32> = (0..n).map(|i| if i < n * 3 / 4 { shared * 1_000_000 + i } else { (sent as u32) * 10_000 + i }).collect();
        let url = format!("http://127.0.0.1:{}/v1/completions", port as usize + (sent as usize % workers));
        let body = serde_json::json!({"prompt": prompt, "max_tokens": 32, "ignore_eos": true});
        let c = client.clone();
        tasks.push(tokio::spawn(async move { c.post(url).json(&body).send().await.map(|r| r.status().is_success()).unwrap_or(false) }));
        sent += 1;
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - start_cpu;
    let mut ok = 0;
    for t in tasks {
        if let Ok(Ok(true)) = tokio::time::timeout(Duration::from_millis(1), t).await {
            ok += 1;
        }
    }
    println!(
        "sent {sent} requests of {n} tokens at {rate}/s to {workers} workers over {wall:.1}s; \
         completed within the window: {ok}; simulator CPU {cpu:.2}s = {:.1}% of one core",
        100.0 * cpu / wall
    );
}
