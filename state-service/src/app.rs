//! Wiring: turns a validated config and an index into the running service: state, metrics
//! scrapers, KV-event ingestion per engine, and the periodic sweep of expired assignments.
//! `main` calls [`start`] and serves [`crate::api::app`]; tests build [`AppState`] directly
//! and drive it without background tasks.

use crate::config::{Config, WorkerConfig};
use crate::index::KvIndex;
use crate::ingest::{connect_endpoint, spawn_ingest, EventKind, IngestConfig, IngestStats, RejectKind};
use crate::load::spawn_scraper;
use crate::registry::{FeedSnapshot, FeedStats, WorkerEntry};
use std::sync::atomic::{AtomicU64, Ordering};
use crate::state::{AddWorkerError, AppState, WorkerTasks};
use crate::store::{memory::MemoryStore, SharedStore};
use std::sync::Arc;
use std::time::Duration;

/// How often expired assignments and speculative credit are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Builds the state, starts every worker's tasks and the sweeper. Needs a tokio runtime.
pub fn start(config: Config, index: Arc<dyn KvIndex>) -> Result<AppState, AddWorkerError> {
    start_with_store(config, index, Arc::new(MemoryStore))
}

/// [`start`] with a shared store (the Redis store passes its mirrored index as `index`).
pub fn start_with_store(config: Config, index: Arc<dyn KvIndex>, store: Arc<dyn SharedStore>) -> Result<AppState, AddWorkerError> {
    let state = AppState::with_store(config, index, store)?;
    state.tokenization.preload(state.registry.read().all().iter().map(|w| w.config.model.clone()).collect());
    state.set_worker_tasks(Arc::new(Feeds));
    let sweeper = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        loop {
            tick.tick().await;
            sweeper.sweep();
        }
    });
    Ok(state)
}

/// Starts what keeps a worker's view fresh: its metrics scraper and its engines' ingestion.
struct Feeds;

impl WorkerTasks for Feeds {
    fn start(&self, state: &AppState, worker: &Arc<WorkerEntry>) {
        spawn_scraper(state.scraper.clone(), worker.clone());
        start_ingestion(state, worker);
    }
}

/// One ingest thread per engine of `worker`; its stats are attached to the engine for the
/// API and metrics, and its handle is kept as a worker guard so removing the worker stops it.
fn start_ingestion(state: &AppState, worker: &Arc<WorkerEntry>) {
    let Some(events) = worker.config.events_endpoint.as_deref() else {
        tracing::info!(worker = %worker.id, "no events_endpoint: routing on load only");
        return;
    };
    for engine in &worker.engines {
        let stats = Arc::new(IngestStats::new());
        let resume_from = state.store.engine_started(state, worker, engine.rank, &stats);
        let cfg = IngestConfig {
            engine: engine.slot,
            endpoint: connect_endpoint(&rank_endpoint(events, engine.rank)),
            replay_endpoint: worker.config.replay_endpoint.as_deref().map(|r| connect_endpoint(&rank_endpoint(r, engine.rank))),
            topic: worker.config.topic.clone(),
            model: worker.config.model.clone(),
            block_size: worker.block_size,
            dp_rank: engine.rank,
            resume_from,
            ..IngestConfig::default()
        };
        tracing::info!(worker = %worker.id, rank = engine.rank, endpoint = %cfg.endpoint, "starting KV-event ingestion");
        let handle = spawn_ingest(cfg, state.index.clone(), stats.clone());
        *engine.feed.lock() = Some(stats);
        worker.add_guard(Box::new(handle));
    }
}

/// Rank `rank`'s endpoint (validated at config time; rank 0 is the endpoint itself).
fn rank_endpoint(endpoint: &str, rank: u32) -> String {
    if rank == 0 {
        return endpoint.to_string();
    }
    WorkerConfig::rank_endpoint(endpoint, rank).unwrap_or_else(|| endpoint.to_string())
}

impl FeedStats for IngestStats {
    fn snapshot(&self) -> FeedSnapshot {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FeedSnapshot {
            batches: n(&self.batches),
            events_stored: self.events(EventKind::BlockStored),
            events_removed: self.events(EventKind::BlockRemoved),
            events_cleared: self.events(EventKind::AllBlocksCleared),
            blocks_stored: n(&self.blocks_stored),
            blocks_removed: n(&self.blocks_removed),
            rejected: RejectKind::ALL.iter().map(|k| (k.as_str(), self.rejected(*k))).collect(),
            gaps: n(&self.gaps),
            gaps_recovered: n(&self.gaps_recovered),
            replays: n(&self.replays),
            replay_failures: n(&self.replay_failures),
            resets: n(&self.resets),
            last_seq: self.last_seq(),
            last_event_unix_ms: Some(n(&self.last_event_unix_ms)).filter(|&t| t != 0),
        }
    }
}
