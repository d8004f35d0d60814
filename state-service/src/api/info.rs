//! Read-only views: workers, assignments, health, readiness, metrics.

use crate::config::Config;
use crate::fleet::{Engine, Fleet, WorkerEntry};
use crate::metrics::Registry;
use crate::pick::Picker;
use crate::tenancy::Tenants;
use crate::tokenization::Tokenization;
use std::sync::Arc;
use axum::extract::State;
use axum::http::{header::CONTENT_TYPE, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Most assignments listed by `/v1/assignments` (the count is always exact).
const LIST_LIMIT: usize = 1000;

#[derive(Serialize)]
struct EngineView {
    rank: u32,
    slot: u32,
    index_blocks: usize,
    /// Absent until ingestion runs for the engine.
    events: Option<Value>,
}

fn engine_view(fleet: &Fleet, staleness_ms: u64, engine: &Engine, now_unix_ms: u64) -> EngineView {
    let events = engine.feed.lock().as_ref().map(|feed| {
        let s = feed.snapshot();
        let since = s.last_event_unix_ms.map(|t| now_unix_ms.saturating_sub(t) as f64 / 1000.0);
        let stale = since.is_none_or(|secs| secs * 1000.0 > staleness_ms as f64);
        json!({
            "last_seq": s.last_seq,
            "seconds_since_last_event": since,
            "stale": stale,
            "batches": s.batches,
            "gaps": s.gaps,
            "gaps_recovered": s.gaps_recovered,
            "replays": s.replays,
            "replay_failures": s.replay_failures,
            "resets": s.resets,
        })
    });
    EngineView { rank: engine.rank, slot: engine.slot.0, index_blocks: fleet.index().engine_blocks(engine.slot), events }
}

fn worker_view(fleet: &Fleet, config: &Config, w: &WorkerEntry, now_unix_ms: u64) -> Value {
    let staleness_ms = config.timeouts.staleness_ms;
    let load = w.load.lock().clone();
    let pending = fleet.assignments().pending(&w.id);
    let cal = *w.calibration.lock();
    let engines: Vec<EngineView> = w.engines.iter().map(|e| engine_view(fleet, staleness_ms, e, now_unix_ms)).collect();
    json!({
        "id": w.id.as_str(),
        "model": w.config.model,
        "lora_adapters": w.config.lora_adapters,
        "endpoint": w.config.endpoint,
        "cluster": w.config.cluster,
        "labels": w.config.labels,
        "pools": crate::pools::member_of(&config.pools, &w.config.labels),
        "block_size": w.block_size,
        "healthy": load.healthy,
        "takes_picks": load.takes_picks(),
        "suspect": load.suspect.map(|s| s.reason.label()),
        "draining": load.draining,
        "consecutive_scrape_failures": load.consecutive_failures,
        "last_scrape_error": load.last_error,
        "load": {
            "running": load.load.running,
            "waiting": load.load.waiting,
            "kv_usage": load.load.kv_usage,
            "own_in_flight": pending.in_flight,
            "own_waiting": pending.waiting,
        },
        "index_blocks": engines.iter().map(|e| e.index_blocks).sum::<usize>(),
        "engines": engines,
        "calibration": { "per_token_ms": cal.per_token_ms(), "overhead_ms": cal.overhead_ms(), "samples": cal.samples() },
    })
}

pub async fn workers(State(fleet): State<Arc<Fleet>>, State(picker): State<Arc<Picker>>, State(config): State<Arc<Config>>) -> Json<Value> {
    fleet.sweep(Instant::now());
    let now_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let entries = fleet.workers();
    let workers: Vec<Value> = entries.iter().map(|w| worker_view(&fleet, &config, w, now_unix_ms)).collect();
    Json(json!({
        "policy": picker.policy(),
        "assignments": fleet.assignments().len(),
        "pools": crate::pools::summary(&config.pools, entries.iter().map(|w| (&w.config.labels, w.load.lock().takes_picks()))),
        "workers": workers,
    }))
}

pub async fn assignments(State(fleet): State<Arc<Fleet>>) -> Json<Value> {
    let now = Instant::now();
    fleet.sweep(now);
    let table = fleet.assignments();
    let list: Vec<Value> = table
        .iter()
        .take(LIST_LIMIT)
        .map(|a| {
            json!({
                "assignment_id": a.id,
                "worker": a.worker.as_str(),
                "policy": a.policy,
                "prompt_tokens": a.prompt_tokens,
                "uncached_tokens": a.uncached_tokens,
                "predicted_ttft_ms": a.predicted_ttft_ms,
                "age_ms": now.saturating_duration_since(a.created_at).as_millis() as u64,
                "first_token": a.first_token_at.is_some(),
            })
        })
        .collect();
    Json(json!({ "count": table.len(), "assignments": list }))
}

/// Every tenant this replica knows (configured, overridden at runtime, or seen), each budget's
/// limits, usage over the current minute and what remains. With Redis the usage is every
/// replica's together.
pub async fn tenants(State(tenants): State<Arc<Tenants>>) -> Result<Json<Value>, super::ApiError> {
    let tenants = tenants.report().await.map_err(|e| super::ApiError::Unavailable(e.to_string()))?;
    Ok(Json(json!({ "window_s": crate::tenancy::WINDOW_MS / 1000, "tenants": tenants })))
}

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(State(fleet): State<Arc<Fleet>>, State(tokenization): State<Arc<Tokenization>>) -> (StatusCode, &'static str) {
    if tokenization.loading() {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready: loading tokenizers\n");
    }
    if fleet.ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: no healthy worker\n")
    }
}

pub async fn metrics(State(fleet): State<Arc<Fleet>>, State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    fleet.sweep(Instant::now());
    ([(CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], registry.encode())
}
