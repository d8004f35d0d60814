//! Stores: where the state that must be shared between replicas, or survive a restart, lives.
//!
//! - `memory` (default): nothing is shared; every contract is answered locally. One instance,
//!   no Redis.
//! - `redis`: several state services act as one (see `store/redis.rs` and the README's
//!   "Replicas and Redis" section).
//!
//! What a store does is split into the few contracts its users need, each held by the
//! component that uses it (a [`Store`] is just the bundle a store kind hands over):
//! - [`Replication`] (the fleet's): changes out, other replicas' changes in, degraded, id salt;
//! - [`WarmStart`] (the feeds'): an engine's mirrored block set before its events resume;
//! - [`WorkerSharing`] (the membership's): workers registered at runtime, on every replica;
//! - [`ResponseDirectory`] (the picker's and reporter's): where each stored response lives;
//! - [`Ledger`] (the tenants'): the budget ledger.
//!
//! Every replica keeps its own in-memory index and fleet model, so the pick reads one local
//! view whatever the store.

pub mod memory;
pub mod redis;

pub use crate::config::{RedisConfig, StoreKind};
pub use crate::fleet::replication::{Inbound, Replication};

use crate::config::WorkerConfig;
use crate::fleet::WorkerEntry;
use crate::ingest::IngestStats;
use crate::stored::Owner;
use crate::tenancy::Ledger;
use kvroute_kv::index::KvIndex;
use prometheus_client::collector::Collector;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

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
pub type ResponseFuture = Pin<Box<dyn Future<Output = Option<Owner>> + Send>>;

/// What an admin change to the shared state resolves to.
pub type StoreFuture = Pin<Box<dyn Future<Output = Result<(), ShareError>> + Send>>;

/// An engine's block set kept for a restart.
pub trait WarmStart: Send + Sync + 'static {
    /// Ingestion of `worker`'s engine `rank` is about to start with `stats`: restores its
    /// warm-start mirror into the index if there is one and returns the sequence number the
    /// mirror is current to, so ingestion resumes from there (replaying what it missed).
    fn engine_started(&self, worker: &Arc<WorkerEntry>, rank: u32, stats: &Arc<IngestStats>) -> Option<u64>;
}

/// Workers registered at runtime, on every replica.
pub trait WorkerSharing: Send + Sync + 'static {
    /// Shares a worker about to be registered through this replica's admin API; resolves once
    /// it is stored for the other replicas. On an error the admin call changes nothing.
    fn share_worker(&self, worker: &WorkerConfig) -> StoreFuture;

    /// Whether `id` is a worker registered through some replica's admin API (not a config one).
    fn is_shared(&self, id: &str) -> bool;

    /// Unshares a shared worker about to be removed through this replica's admin API.
    fn unshare_worker(&self, id: &str) -> StoreFuture;

    /// A shared worker sent through `Inbound` was refused by this replica (invalid here).
    fn worker_rejected(&self, id: &str);
}

/// Where each stored Responses API response lives, for every replica.
pub trait ResponseDirectory: Send + Sync + 'static {
    /// Shares where response `id` is stored, for `ttl` (must not wait).
    fn share_response(&self, id: &str, owner: &Owner, ttl: Duration);

    /// Where response `id` is stored, as another replica shared it; `None` when nobody did
    /// (or the store cannot say).
    fn find_response(&self, id: &str) -> ResponseFuture;
}

/// What a store kind hands the service: one handle per contract, the index it keeps (the
/// Redis store's mirrors its writes), the budget ledger it shares (`None`: each replica
/// keeps its own) and its scrape-time metrics.
pub struct Store {
    pub index: Arc<dyn KvIndex>,
    pub replication: Arc<dyn Replication>,
    pub warm_start: Arc<dyn WarmStart>,
    pub workers: Arc<dyn WorkerSharing>,
    pub responses: Arc<dyn ResponseDirectory>,
    pub ledger: Option<Arc<dyn Ledger>>,
    pub collector: Option<Box<dyn Collector>>,
}
