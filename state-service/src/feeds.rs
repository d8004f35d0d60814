//! What keeps a worker's view fresh: its metrics scraper and one KV-event ingestion thread
//! per engine. Started for every worker once the service runs ([`crate::membership`]),
//! stopped with the worker (the tasks and threads are the worker entry's).

use crate::config::WorkerConfig;
use crate::fleet::{FeedSnapshot, FeedStats, WorkerEntry};
use kvroute_kv::index::KvIndex;
use crate::ingest::{connect_endpoint, spawn_ingest, EventKind, IngestConfig, IngestStats, RejectKind};
use crate::load::{spawn_scraper, CapacityHook, Scraper};
use kvroute_kv::types::EngineSlot;
use crate::store::WarmStart;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct Feeds {
    pub scraper: Scraper,
    pub index: Arc<dyn KvIndex>,
    pub warm_start: Arc<dyn WarmStart>,
    /// `resilience.index_capacity_factor` (0: engines' indexes unbounded).
    pub index_capacity_factor: f64,
}

impl Feeds {
    pub fn start(&self, worker: &Arc<WorkerEntry>) {
        if let Some(mut target) = worker.scrape_target() {
            target.on_capacity = self.capacity_hook(worker);
            worker.add_task(spawn_scraper(self.scraper.clone(), target));
        }
        self.start_ingestion(worker);
    }

    /// Bounds each of `worker`'s engine indexes by the blocks the worker reports: its share
    /// times the factor, plus 256; set again only when the report changes.
    fn capacity_hook(&self, worker: &Arc<WorkerEntry>) -> Option<CapacityHook> {
        if self.index_capacity_factor <= 0.0 || worker.config.events_endpoint.is_none() {
            return None;
        }
        let (index, factor, id) = (self.index.clone(), self.index_capacity_factor, worker.id.clone());
        let slots: Vec<EngineSlot> = worker.slots().collect();
        let last = AtomicU64::new(u64::MAX);
        Some(CapacityHook(Arc::new(move |blocks: u64| {
            if last.swap(blocks, Ordering::Relaxed) == blocks {
                return;
            }
            let per_engine = blocks.div_ceil(slots.len().max(1) as u64) as f64;
            let cap = (per_engine * factor).ceil() as usize + 256;
            let dropped: u64 = slots.iter().map(|s| index.set_capacity(*s, Some(cap))).sum();
            tracing::info!(worker = %id, reported_blocks = blocks, cap_per_engine = cap, dropped, "index bounded by the worker's reported capacity");
        })))
    }

    /// One ingest thread per engine of `worker`; its stats are attached to the engine for the
    /// API and metrics, and its handle is kept as a worker guard so removing the worker stops it.
    fn start_ingestion(&self, worker: &Arc<WorkerEntry>) {
        let Some(events) = worker.config.events_endpoint.as_deref() else {
            tracing::info!(worker = %worker.id, "no events_endpoint: routing on load only");
            return;
        };
        for engine in &worker.engines {
            let stats = Arc::new(IngestStats::new());
            let resume_from = self.warm_start.engine_started(worker, engine.rank, &stats);
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
            let handle = spawn_ingest(cfg, self.index.clone(), stats.clone());
            *engine.feed.lock() = Some(stats);
            worker.add_guard(Box::new(handle));
        }
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
