//! Stores: where the state that must be shared between replicas, or survive a restart, lives.
//!
//! - `memory` (default): nothing is shared; every hook is a no-op. One instance, no Redis.
//! - `redis`: several state services act as one (see `store/redis.rs` and the README's
//!   "Replicas and Redis" section): workers registered at runtime, assignments, pending
//!   load, speculative credit and calibration are replicated through Redis, and the lease
//!   holder of each engine mirrors its block set to Redis for warm starts.
//!
//! A store is a sink and a source of [`FleetEvent`]s: the service offers it every change it
//! applied ([`SharedStore::publish`], which must not wait: a store that talks to a network
//! queues the write and returns), and the store sends other replicas' changes back
//! ([`Inbound`]), which the service applies to its fleet exactly like its own. Every replica
//! keeps its own in-memory index and fleet model, so the pick reads one local view whatever
//! the store.

pub mod memory;
pub mod redis;

pub use crate::config::{RedisConfig, StoreKind};

use crate::fleet::{Applied, FleetEvent, WorkerEntry};
use crate::config::WorkerConfig;
use crate::ingest::IngestStats;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Where a store sends what other replicas changed (and what a warm start found), in order.
/// The receiver applies each to the local fleet exactly as a local change.
pub type Inbound = mpsc::UnboundedSender<FleetEvent>;

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

/// What a lookup of a response's owner resolves to.
pub type ResponseFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<crate::responses::Owner>> + Send>>;

/// What an admin change to the shared state resolves to.
pub type StoreFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ShareError>> + Send>>;

/// A sink and source of fleet events; see the module docs. Every method returns at once
/// (the admin-only worker sharing returns a future the admin handler awaits). A store never
/// sees the application state: it gets events out and sends events in.
pub trait SharedStore: Send + Sync + 'static {
    /// Starts background tasks (replication, health); what they learn goes to `inbound`.
    /// What is known already (a warm start) is sent before this returns.
    fn attach(&self, _inbound: Inbound) {}

    /// This replica applied `event` to its fleet with outcome `applied`: share it if other
    /// replicas need it. Must not wait (the pick path calls it).
    fn publish(&self, _event: &FleetEvent, _applied: &Applied) {}

    /// Ingestion of `worker`'s engine `rank` is about to start with `stats`: restores its
    /// warm-start mirror into the index if there is one and returns the sequence number the
    /// mirror is current to, so ingestion resumes from there (replaying what it missed).
    fn engine_started(&self, _worker: &Arc<WorkerEntry>, _rank: u32, _stats: &Arc<IngestStats>) -> Option<u64> {
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

    /// A shared worker sent through `inbound` was refused by this replica (invalid here).
    fn worker_rejected(&self, _id: &str) {}

    /// Some shared state is unreachable: picks still answer from local state, marked degraded.
    fn degraded(&self) -> bool {
        false
    }

    /// Metrics of the store, read at scrape time.
    fn collector(&self) -> Option<Box<dyn prometheus_client::collector::Collector>> {
        None
    }

    /// Shares where response `id` is stored, for `ttl` (must not wait).
    fn share_response(&self, _id: &str, _owner: &crate::responses::Owner, _ttl: std::time::Duration) {}

    /// Where response `id` is stored, as another replica shared it; `None` when nobody did
    /// (or the store cannot say).
    fn find_response(&self, _id: &str) -> ResponseFuture {
        Box::pin(async { None })
    }

    /// Mixed into assignment ids so replicas (which may share a seed) never collide.
    fn id_salt(&self) -> u64 {
        0
    }

    /// The budget ledger shared by every replica on this store; `None`: nothing is shared,
    /// the service keeps its own ([`crate::tenancy::window::MemoryLedger`]).
    fn ledger(&self) -> Option<Arc<dyn crate::tenancy::Ledger>> {
        None
    }
}
