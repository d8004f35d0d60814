//! Replicating assignments between replicas.
//!
//! Out: the pick and report paths push [`Op`]s onto a bounded queue (`try_send`: a full
//! queue drops the op and counts it, the pick never waits). One writer task drains the
//! queue, groups ops by the shard owning the assignment, and sends each group as one
//! pipeline: `SET {prefix}:asg:{id} PX ttl` / `DEL` plus `PUBLISH {prefix}:events`. Ops for a
//! shard marked down are dropped and counted at once, so a dead shard never backs the queue
//! up behind its timeouts.
//!
//! In: one subscriber task per shard applies other replicas' events to the local
//! assignment table, speculative credit, calibration and worker registry. On every
//! (re)subscription it first loads the shard's runtime-registered workers and live
//! assignment records (SCAN), so a starting replica, or one that missed messages while a
//! shard was away, catches up.

use super::shards::ShardId;
use super::wire::{Event, Message, Record};
use super::{RedisStore, StoreStats};
use crate::assign::{AssignmentId, ReportOutcome};
use crate::state::AppState;
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
pub async fn subscriber(store: Arc<RedisStore>, state: AppState, shard: ShardId) {
    let retry = Duration::from_millis(store.config.probe_interval_ms.max(10));
    loop {
        if let Err(e) = subscribe_once(&store, &state, shard).await {
            tracing::debug!(error = %e, shard = %store.shards.node(shard).url, "event subscription lost");
        }
        store.shards.mark_down(shard);
        tokio::time::sleep(retry).await;
    }
}

async fn subscribe_once(store: &RedisStore, state: &AppState, shard: ShardId) -> Result<(), super::StoreError> {
    let timeout = store.shards.timeout();
    let client = store.shards.client(shard);
    let mut pubsub = tokio::time::timeout(timeout, client.get_async_pubsub()).await.map_err(|_| super::StoreError::Timeout(timeout))??;
    tokio::time::timeout(timeout, pubsub.subscribe(&store.channel)).await.map_err(|_| super::StoreError::Timeout(timeout))??;
    let loaded = resync(store, state, shard).await?;
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
            Ok(m) => apply(store, state, m.event),
            Err(_) => {
                store.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// Loads every live assignment record of `shard` that the local table lacks, and brings the
/// runtime-registered workers whose keys live there up to date.
async fn resync(store: &RedisStore, state: &AppState, shard: ShardId) -> Result<usize, super::StoreError> {
    // Known before the scan: a worker shared after this point may be missing from it.
    let known = store.shared_on(shard);
    let workers = store.load_workers(shard).await?;
    let here: Vec<String> = workers.iter().map(|w| w.id.clone()).collect();
    for gone in known.into_iter().filter(|id| !here.contains(id)) {
        store.drop_worker(state, &gone);
    }
    for worker in workers {
        store.adopt_worker(state, worker);
    }
    let mut loaded = 0;
    for value in store.scan_values(shard, &format!("{}:asg:*", store.config.key_prefix)).await? {
        match serde_json::from_slice::<Record>(&value) {
            Ok(r) if r.replica != store.replica => loaded += usize::from(insert(state, &r, false)),
            Ok(_) => {}
            Err(_) => {
                store.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(loaded)
}

/// Applies another replica's event to local state.
pub fn apply(store: &RedisStore, state: &AppState, event: Event) {
    store.stats.received.fetch_add(1, Ordering::Relaxed);
    match event {
        Event::Assigned(r) => {
            insert(state, &r, true);
        }
        Event::FirstToken { id, elapsed_ms } => {
            let outcome = state.assignments.lock().first_token(AssignmentId(id), Instant::now());
            if let ReportOutcome::FirstToken(a) = outcome {
                if elapsed_ms.is_finite() && elapsed_ms > 0.0 {
                    if let Some(worker) = state.registry.read().get(a.worker.as_str()) {
                        worker.calibration.lock().observe(&a.features, elapsed_ms);
                    }
                }
            }
        }
        Event::Freed { id } => {
            state.assignments.lock().finish(AssignmentId(id));
            state.update_in_flight();
        }
        Event::WorkerAdded(worker) => store.adopt_worker(state, *worker),
        Event::WorkerRemoved { id } => store.drop_worker(state, &id),
    }
}

/// Inserts a remote assignment unless it is known; `credit` also gives its worker the
/// speculative credit the pick gave it on the other replica.
fn insert(state: &AppState, r: &Record, credit: bool) -> bool {
    let now = Instant::now();
    let a = r.assignment(now);
    {
        let mut table = state.assignments.lock();
        if table.contains(a.id) {
            return false;
        }
        table.insert(a.clone());
    }
    if credit && !r.keys.is_empty() {
        state.speculative.lock().credit(&r.keys(), &a.worker, now);
    }
    state.update_in_flight();
    true
}

impl StoreStats {
    pub fn dropped(&self) -> u64 {
        self.writes_dropped.load(Ordering::Relaxed)
    }
}
