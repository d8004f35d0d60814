//! The simulator's own endpoints: `/sim/state` (what each rank's engine holds, for comparing
//! with a router's index per engine) and `/sim/fault` (fault injection, per worker or rank).
//!
//! `/sim/state` keeps the single-engine shape at the top level: with one rank the top-level
//! fields are rank 0's, unchanged from before data parallelism; with several they are
//! worker totals (counts summed, `cached_block_hashes` the sorted union, `publisher`,
//! `stats`, `faults` and `dp_rank` null). `ranks[r]` always has rank r's own view.
//! `cpu_cached_block_hashes` is the CPU offload tier's counterpart of `cached_block_hashes`
//! (readable CPU blocks: what a subscriber's `medium: CPU` view should hold; empty without a
//! tier), `num_cpu_blocks_used` its occupancy and `offload` its counters (null without one).

use super::body::parse_json;
use super::error::ApiError;
use super::{AppState, Faults};
use crate::events::PubCommand;
use crate::worker::Worker;
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

/// One rank's engine, publisher and faults. The publisher is flushed first, so `next_seq`
/// matches the reported cache.
async fn rank_state(w: &Worker, faults: &Faults) -> Map<String, Value> {
    if let Some(p) = w.publisher() {
        p.flush().await;
    }
    let publisher = w.publisher().map(|p| {
        let st = &p.stats;
        json!({
            "next_seq": st.next_seq.load(Ordering::SeqCst), "sent": st.sent.load(Ordering::Relaxed),
            "dropped": st.dropped.load(Ordering::Relaxed), "suppressed": st.suppressed.load(Ordering::Relaxed),
            "replays": st.replays.load(Ordering::Relaxed),
        })
    });
    let inner = w.inner.lock();
    let e = &inner.engine;
    let v = json!({
        "dp_rank": w.dp_rank,
        "num_requests_running": e.num_running(), "num_requests_waiting": e.num_waiting(),
        "kv_cache_usage": e.kv_usage(), "num_free_blocks": e.num_free_blocks(),
        "stats": e.stats(), "cached_block_hashes": e.cached_hashes(),
        "cpu_cached_block_hashes": e.cpu_cached_hashes(), "num_cpu_blocks_used": e.num_cpu_blocks_used(),
        "offload": e.offload_stats(),
        "restarts": inner.restarts, "faults": faults, "publisher": publisher,
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Worker totals over several ranks.
fn totals(ranks: &[Map<String, Value>]) -> Map<String, Value> {
    let sum = |k: &str| ranks.iter().filter_map(|r| r[k].as_u64()).sum::<u64>();
    let union = |k: &str| -> BTreeSet<u64> {
        ranks.iter().flat_map(|r| r[k].as_array().into_iter().flatten().filter_map(Value::as_u64)).collect()
    };
    let hashes = union("cached_block_hashes");
    let usage = ranks.iter().filter_map(|r| r["kv_cache_usage"].as_f64()).sum::<f64>() / ranks.len().max(1) as f64;
    let v = json!({
        "dp_rank": null,
        "num_requests_running": sum("num_requests_running"), "num_requests_waiting": sum("num_requests_waiting"),
        "kv_cache_usage": usage, "num_free_blocks": sum("num_free_blocks"),
        "stats": null, "cached_block_hashes": hashes,
        "cpu_cached_block_hashes": union("cpu_cached_block_hashes"), "num_cpu_blocks_used": sum("num_cpu_blocks_used"),
        "offload": null,
        "restarts": sum("restarts"), "faults": null, "publisher": null,
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

pub async fn state(State(s): State<AppState>) -> Json<Value> {
    let faults = s.faults.lock().clone();
    let mut ranks = Vec::new();
    for (w, f) in s.worker.ranks().iter().zip(&faults) {
        ranks.push(rank_state(w, f).await);
    }
    let mut top = if ranks.len() == 1 { ranks[0].clone() } else { totals(&ranks) };
    top.insert("worker".into(), json!(s.worker.id()));
    top.insert("model".into(), json!(s.worker.model()));
    top.insert("dp_size".into(), json!(s.worker.dp_size()));
    top.insert("endpoints".into(), (*s.layout).clone());
    top.insert("config".into(), json!(s.worker.config()));
    top.insert("ranks".into(), Value::Array(ranks.into_iter().map(Value::Object).collect()));
    Json(Value::Object(top))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultBody {
    drop_fraction: Option<f64>,
    stop_publishing: Option<bool>,
    slowdown: Option<f64>,
    /// Every vLLM endpoint answers 5xx (see `Faults::engine_dead`).
    engine_dead: Option<bool>,
    /// A flooding engine: its event stream announces this many distinct blocks it never
    /// holds (see [`Worker::flood`]); sent in the background.
    flood_blocks: Option<u64>,
    #[serde(default)]
    restart: bool,
    /// Only this rank; without it every rank of the worker.
    rank: Option<u32>,
}

/// The most blocks one flood may announce (one block's event is ~100 bytes on the wire).
const MAX_FLOOD_BLOCKS: u64 = 50_000_000;

pub async fn fault(State(s): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: FaultBody = parse_json(&body)?;
    if let Some(f) = req.drop_fraction.filter(|f| !(0.0..=1.0).contains(f)) {
        return Err(ApiError::BadRequest(format!("drop_fraction must be within 0..=1, got {f}")));
    }
    if let Some(f) = req.slowdown.filter(|f| !(f.is_finite() && *f > 0.0)) {
        return Err(ApiError::BadRequest(format!("slowdown must be a positive number, got {f}")));
    }
    if let Some(n) = req.flood_blocks.filter(|n| *n > MAX_FLOOD_BLOCKS) {
        return Err(ApiError::BadRequest(format!("flood_blocks must be at most {MAX_FLOOD_BLOCKS}, got {n}")));
    }
    let targets: Vec<&Worker> = match req.rank {
        Some(r) => vec![s.worker.rank(r).map_err(|e| ApiError::BadRequest(e.to_string()))?],
        None => s.worker.ranks().iter().collect(),
    };
    let whole_worker = targets.len() == s.worker.dp_size();
    let mut faults = s.faults.lock();
    for w in targets {
        apply(w, &mut faults[w.dp_rank as usize], &req);
    }
    if req.restart && whole_worker {
        // The server process restarted: its stored Responses are gone, as with vLLM. (One
        // rank's engine restarting alone leaves the API server, and its store, up.)
        s.responses.clear();
    }
    let reported = if faults.len() == 1 { json!(faults[0]) } else { json!(*faults) };
    Ok(Json(json!({"faults": reported, "restarted": req.restart})))
}

fn apply(w: &Worker, faults: &mut Faults, req: &FaultBody) {
    if let Some(f) = req.drop_fraction {
        faults.drop_fraction = f;
        if let Some(p) = w.publisher() {
            p.send(PubCommand::SetDropFraction(f));
        }
    }
    if let Some(stop) = req.stop_publishing {
        faults.stop_publishing = stop;
        if let Some(p) = w.publisher() {
            p.send(PubCommand::SetStopped(stop));
        }
    }
    if let Some(f) = req.slowdown {
        faults.slowdown = f;
        w.inner.lock().engine.set_slowdown(f);
    }
    if let Some(dead) = req.engine_dead {
        faults.engine_dead = dead;
    }
    if let Some(n) = req.flood_blocks.filter(|n| *n > 0) {
        let seed = faults.flooded_blocks;
        faults.flooded_blocks += n;
        let w = w.clone();
        tokio::spawn(async move { w.flood(n, seed).await });
    }
    if req.restart {
        w.restart();
    }
}
