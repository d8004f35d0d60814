//! Where the fleet's changes go: the sink (and source) that makes several replicas one.
//!
//! Defined here, implemented by the stores: the fleet does not know whether anyone listens.
//! With the memory store nobody does; the Redis store replicates each change.

use super::{Change, FleetEvent};
use tokio::sync::mpsc;

/// Where a store sends what other replicas changed (and what a warm start found), in order.
pub type Inbound = mpsc::UnboundedSender<FleetEvent>;

pub trait Replication: Send + Sync + 'static {
    /// Starts what listens to the other replicas; their changes (and a warm start's) go to
    /// `inbound`. What is known already is sent before this returns.
    fn attach(&self, inbound: Inbound);

    /// This replica changed the fleet: share it. Must not wait (the pick path calls it).
    fn publish(&self, change: Change<'_>);

    /// Some shared state is unreachable: picks still answer from local state, marked degraded.
    fn degraded(&self) -> bool;

    /// Mixed into assignment ids so replicas (which may share a seed) never collide.
    fn id_salt(&self) -> u64;
}
