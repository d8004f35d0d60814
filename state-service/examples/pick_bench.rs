//! In-process pick cost for long token-id prompts, as the filter sends them.
//!
//! `cargo run --release -p kvroute-state --example pick_bench [picks] [blocks]`
//! Four healthy workers without KV events (so every key is new, as in tests/LATENCY.md),
//! the real MemoryIndex, speculative credit on; each pick is reported complete afterwards.
//! Prints the time inside `Picker::pick` (p50/p99 µs) — no HTTP, no protobuf.

use kvroute_core::wire::PickRequest;
use kvroute_state::config::{Config, WorkerConfig};
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_state::app::App;
use kvroute_state::load::VllmLoad;
use kvroute_state::pick::Deadline;
use std::sync::Arc;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let picks: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let blocks: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(512);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let mut config = Config { seed: Some(1), ..Config::default() };
        for i in 0..4 {
            config.workers.push(WorkerConfig { endpoint: format!("127.0.0.1:{}", 8000 + i), ..WorkerConfig::new(&format!("w{i}"), "m") });
        }
        let app = App::new(config, Arc::new(MemoryIndex::new()))?;
        for w in app.fleet.workers() {
            w.load.lock().record_ok(VllmLoad::default(), tokio::time::Instant::now());
        }
        let mut lat = Vec::with_capacity(picks);
        for i in 0..picks as u64 {
            let keys: Vec<u64> = (0..blocks).map(|b| (i << 32 | b).wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
            let req = PickRequest { model: "m".into(), token_keys: keys, block_size: 16, prompt_tokens: blocks as u32 * 16, ..Default::default() };
            let t = Instant::now();
            let resp = app.picker.pick(&req, Deadline::default()).await;
            lat.push(t.elapsed());
            anyhow::ensure!(!resp.worker_id.is_empty(), "not routed: {}", resp.degraded_reason().label());
            let done = kvroute_core::wire::Report { assignment_id: resp.assignment_id, kind: kvroute_core::wire::ReportKind::ReportComplete as i32, ..Default::default() };
            app.reporter.apply(&done);
        }
        lat.sort();
        let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1e6;
        println!("picks {picks} blocks {blocks}: p50 {:.1} us  p99 {:.1} us  mean {:.1} us", q(0.5), q(0.99),
            lat.iter().map(|d| d.as_secs_f64()).sum::<f64>() / lat.len() as f64 * 1e6);
        anyhow::Ok(())
    })
}
