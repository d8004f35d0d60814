//! Stores: where the state that must be shared between replicas, or survive a restart, lives.
//!
//! - `memory` (default): nothing is shared; every hook is a no-op. One instance, no Redis.
//! - `redis`: several state services act as one (see `store/redis.rs` and the README's
//!   "Replicas and Redis" section): workers registered at runtime, assignments, pending
//!   load, speculative credit and calibration are replicated through Redis, and the lease
//!   holder of each engine mirrors its block set to Redis for warm starts.
//!
//! The pick path only ever calls [`SharedStore::assigned`], which must not wait: a store
//! that talks to a network queues the write and returns. Every replica keeps its own
//! in-memory index, assignment table and speculative credit; a store feeds other replicas'
//! decisions into them, so the pick code reads one local view whatever the store.

pub mod config;
pub mod memory;
pub mod redis;

pub use config::{RedisConfig, StoreKind};

use crate::assign::Assignment;
use crate::config::WorkerConfig;
use crate::ingest::IngestStats;
use crate::registry::WorkerEntry;
use crate::state::AppState;
use crate::types::BlockKey;
use std::sync::Arc;

/// What a report did to an assignment, as other replicas must replay it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReportEvent {
    /// First token after `elapsed_ms` (feeds calibration).
    FirstToken { elapsed_ms: f64 },
    /// Complete or cancel.
    Freed,
}

/// Why an admin change to the shared state was not made.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// The shared store did not take it (on a timeout it may still have landed: retry).
    #[error("shared store unavailable: {0}")]
    Unavailable(String),
    /// Another replica registered this id first.
    #[error("worker {0:?} is already registered on another replica")]
    Exists(String),
}

/// What an admin change to the shared state resolves to.
pub type StoreFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ShareError>> + Send>>;

/// The hooks the service calls; see the module docs. Every method returns at once (the
/// admin-only worker sharing returns a future the admin handler awaits).
pub trait SharedStore: Send + Sync + 'static {
    /// Starts background tasks (replication, health). Called once the state exists.
    fn attach(&self, _state: &AppState) {}

    /// A pick on this replica created `assignment`, crediting its worker with `keys`.
    fn assigned(&self, _assignment: &Assignment, _keys: &[BlockKey]) {}

    /// A report about `assignment` arrived on this replica and was applied locally.
    fn reported(&self, _state: &AppState, _assignment: &Assignment, _event: ReportEvent) {}

    /// Ingestion of `worker`'s engine `rank` is about to start with `stats`: restores its
    /// warm-start mirror into the index if there is one and returns the sequence number the
    /// mirror is current to, so ingestion resumes from there (replaying what it missed).
    fn engine_started(&self, _state: &AppState, _worker: &Arc<WorkerEntry>, _rank: u32, _stats: &Arc<IngestStats>) -> Option<u64> {
        None
    }

    /// Shares a worker about to be registered through this replica's admin API; resolves once
    /// it is stored for the other replicas. On an error the admin call changes nothing.
    fn share_worker(&self, _worker: &WorkerConfig) -> StoreFuture {
        Box::pin(async { Ok(()) })
    }

    /// Whether `id` is a worker registered through some replica's admin API (not a config one).
    fn is_shared(&self, _id: &str) -> bool {
        false
    }

    /// Unshares a shared worker about to be removed through this replica's admin API.
    fn unshare_worker(&self, _id: &str) -> StoreFuture {
        Box::pin(async { Ok(()) })
    }

    /// Some shared state is unreachable: picks still answer from local state, marked degraded.
    fn degraded(&self) -> bool {
        false
    }

    /// Metrics of the store, read at scrape time.
    fn collector(&self) -> Option<Box<dyn prometheus_client::collector::Collector>> {
        None
    }

    /// Mixed into assignment ids so replicas (which may share a seed) never collide.
    fn id_salt(&self) -> u64 {
        0
    }
}
