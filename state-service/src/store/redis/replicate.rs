//! Replicating assignments between replicas.
//!
//! Out: the pick and report paths push [`Op`]s onto a bounded queue (`try_send`: a full
//! queue drops the op and counts it, the pick never waits). One writer task drains the
//! queue, groups ops by the shard owning the assignment, and sends each group as one
//! pipeline: `SET {prefix}:asg:{id} PX ttl` / `DEL` plus `PUBLISH {prefix}:events`. Ops for a
//! shard marked down are dropped and counted at once, so a dead shard never backs the queue
//! up behind its timeouts.
//!
//! In: one subscriber task per shard turns other replicas' events into [`FleetEvent`]s and
//! sends them to the service (`Inbound`), which applies them to its fleet exactly like its
//! own. On every (re)subscription it first loads the shard's runtime-registered workers and
//! live assignment records (SCAN), so a starting replica, or one that missed messages while a
//! shard was away, catches up; applying a known assignment again changes nothing.

use super::shards::ShardId;
use super::wire::{Event, Message, Record};
use super::{RedisStore, StoreStats};
use crate::assign::AssignmentId;
use crate::fleet::{FleetEvent, Usage};
use crate::store::Inbound;
use crate::types::WorkerId;
use kvroute_core::wire::UpstreamFailure;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;

/// One replicated write.
#[derive(Debug)]
pub enum Op {
    /// Store (or refresh) the record with this TTL and publish `event`.
    Put { record: Box<Record>, ttl: Duration, event: Option<Event> },
    /// Delete the record and publish `event`.
    Delete { id: u64, event: Event },
    /// A plain key/value with a TTL (calibration snapshots).
    Set { key: String, value: String },
    /// Only publish `event`, on the shard owning `key`.
    Publish { key: String, event: Event },
}

/// Most ops sent in one pipeline.
const BATCH: usize = 256;

pub async fn writer(store: Arc<RedisStore>, mut rx: mpsc::Receiver<Op>) {
    let mut buf = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut buf, BATCH).await > 0 {
        let mut by_shard: HashMap<ShardId, redis::Pipeline> = HashMap::new();
        let mut counts: HashMap<ShardId, u64> = HashMap::new();
        for op in buf.drain(..) {
            let key = store.op_key(&op);
            let shard = store.shards.owner(&key);
            if !store.shards.is_up(shard) {
                store.stats.writes_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let pipe = by_shard.entry(shard).or_insert_with(redis::pipe);
            store.add_op(pipe, key, op);
            *counts.entry(shard).or_default() += 1;
        }
        for (shard, pipe) in by_shard {
            let n = counts.get(&shard).copied().unwrap_or(0);
            match store.shards.pipe::<()>(shard, &pipe).await {
                Ok(()) => store.stats.writes.fetch_add(n, Ordering::Relaxed),
                Err(e) => {
                    tracing::debug!(error = %e, shard = %store.shards.node(shard).url, "replicated writes dropped");
                    store.stats.writes_dropped.fetch_add(n, Ordering::Relaxed)
                }
            };
        }
    }
}

/// Subscribes to `shard`'s event channel for as long as the state lives, reconnecting.
pub async fn subscriber(store: Arc<RedisStore>, inbound: Inbound, shard: ShardId) {
    let retry = Duration::from_millis(store.config.probe_interval_ms.max(10));
    while !inbound.is_closed() {
        if let Err(e) = subscribe_once(&store, &inbound, shard).await {
            tracing::debug!(error = %e, shard = %store.shards.node(shard).url, "event subscription lost");
        }
        store.shards.mark_down(shard);
        tokio::time::sleep(retry).await;
    }
}

async fn subscribe_once(store: &RedisStore, inbound: &Inbound, shard: ShardId) -> Result<(), super::StoreError> {
    let timeout = store.shards.timeout();
    let client = store.shards.client(shard);
    let mut pubsub = tokio::time::timeout(timeout, client.get_async_pubsub()).await.map_err(|_| super::StoreError::Timeout(timeout))??;
    tokio::time::timeout(timeout, pubsub.subscribe(&store.channel)).await.map_err(|_| super::StoreError::Timeout(timeout))??;
    let loaded = resync(store, inbound, shard).await?;
    store.stats.resyncs.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(shard = %store.shards.node(shard).url, loaded, "subscribed to replica events");
    let mut messages = pubsub.on_message();
    while let Some(msg) = messages.next().await {
        let payload = msg.get_payload_bytes();
        let Some(split) = payload.iter().position(|b| *b == b'\n') else {
            store.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if &payload[..split] == store.replica.as_bytes() {
            continue;
        }
        match serde_json::from_slice::<Message>(&payload[split + 1..]) {
            Ok(m) => receive(store, inbound, m.event),
            Err(_) => {
                store.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// Loads every live assignment record of `shard` (the fleet skips those it knows), and
/// brings the runtime-registered workers whose keys live there up to date.
async fn resync(store: &RedisStore, inbound: &Inbound, shard: ShardId) -> Result<usize, super::StoreError> {
    // Known before the scan: a worker shared after this point may be missing from it.
    let known = store.shared_on(shard);
    let workers = store.load_workers(shard).await?;
    let here: Vec<String> = workers.iter().map(|w| w.id.clone()).collect();
    for gone in known.into_iter().filter(|id| !here.contains(id)) {
        store.drop_worker(inbound, &gone);
    }
    for worker in workers {
        store.adopt_worker(inbound, worker);
    }
    let mut loaded = 0;
    let now = Instant::now();
    for value in store.scan_values(shard, &format!("{}:asg:*", store.config.key_prefix)).await? {
        match serde_json::from_slice::<Record>(&value) {
            Ok(r) if r.replica != store.replica => {
                loaded += 1;
                let _ = inbound.send(FleetEvent::Assigned { assignment: r.assignment(now), credit: Arc::from([]) });
            }
            Ok(_) => {}
            Err(_) => {
                store.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(loaded)
}

/// Turns another replica's event into the fleet event it stands for.
pub fn receive(store: &RedisStore, inbound: &Inbound, event: Event) {
    store.stats.received.fetch_add(1, Ordering::Relaxed);
    let event = match event {
        Event::Assigned(r) => FleetEvent::Assigned { assignment: r.assignment(Instant::now()), credit: r.keys().into() },
        Event::FirstToken { id, elapsed_ms } => FleetEvent::FirstToken { id: AssignmentId(id), elapsed_ms },
        // Completion and cancellation free alike; the usage was observed where it was reported.
        Event::Freed { id } => FleetEvent::Completed { id: AssignmentId(id), usage: Usage::default() },
        Event::WorkerAdded(worker) => return store.adopt_worker(inbound, *worker),
        Event::WorkerRemoved { id } => return store.drop_worker(inbound, &id),
        Event::WorkerSuspect { id, reason } => FleetEvent::Suspected {
            worker: WorkerId::new(&id),
            reason: UpstreamFailure::try_from(reason).unwrap_or(UpstreamFailure::UpstreamReset),
        },
        Event::WorkerDraining { id } => FleetEvent::Draining(WorkerId::new(&id)),
    };
    let _ = inbound.send(event);
}

impl StoreStats {
    pub fn dropped(&self) -> u64 {
        self.writes_dropped.load(Ordering::Relaxed)
    }
}
