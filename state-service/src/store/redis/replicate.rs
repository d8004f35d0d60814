//! Replicating assignments between replicas.
//!
//! Out: the pick and report paths push [`Op`]s onto the bounded queue of the shard owning
//! the op's key (`try_send`: a full queue drops the op and counts it, the pick never waits).
//! Every shard has its own queue and writer task, which sends what is queued as one
//! pipeline: `SET {prefix}:asg:{id} PX ttl` / `DEL` plus `PUBLISH {prefix}:events`. So a slow
//! shard delays only its own writes (its queue fills and drops), never another shard's. Ops
//! for a shard marked down are dropped and counted at once, so a dead shard never backs its
//! queue up behind its timeouts. A record's TTL is what is left of its life when the pipeline
//! is built (a record that waited past it is not written; its event still is).
//!
//! In: one subscriber task per shard turns other replicas' events into [`FleetEvent`]s and
//! sends them to the service (`Inbound`), which applies them to its fleet exactly like its
//! own. On every (re)subscription it first loads the shard's runtime-registered workers, its
//! tombstones and live assignment records (SCAN), so a starting replica, or one that
//! missed messages while a shard was away or it was frozen, catches up; applying a known
//! assignment or end again changes nothing. Records
//! and events older than their TTL are not adopted (counted as stale).
//!
//! Tombstones (`{prefix}:cxl:{id}`, `{prefix}:fin:{id}`) carry an end that the replica holding
//! the pick must hear even if it is not listening at that moment: a cancel or completion of
//! an id the reporting replica does not hold, a free of another replica's pick, and a free
//! that was dropped because its shard was away (held and written again when it is back).
//! A resync frees what they name, own picks included, before it adopts records.
//!
//! Liveness: every replica publishes a heartbeat on every shard's channel each
//! `heartbeat_ms`. A subscription that receives nothing, not even its own heartbeat, for
//! three of them (and one more, in case the process itself was stopped) is half-open: the shard is marked down and unsubscribed (picks degraded,
//! `subscription_timeouts` counted) and the subscriber resubscribes, with the resync.

use super::shards::ShardId;
use super::wire::{Event, Message, Record};
use super::{RedisStore, StoreStats};
use crate::assign::AssignmentId;
use crate::fleet::{End, FleetEvent};
use crate::tenancy::Ending;
use crate::store::Inbound;
use kvroute_kv::types::WorkerId;
use kvroute_core::wire::UpstreamFailure;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;

/// One replicated write.
#[derive(Debug)]
pub enum Op {
    /// Store (or refresh) the record until `expires` (not at all once that passed) and
    /// publish `event`.
    Put { record: Box<Record>, expires: Instant, event: Option<Event> },
    /// Delete the record and publish `event`.
    Delete { id: u64, event: Event },
    /// An end the replica that recorded the pick must hear even if it is not listening now:
    /// delete the record, keep a tombstone (read by every resync) and publish the end. For
    /// a cancel of an id not recorded here, the end of an id not held here, a free of
    /// another replica's pick, and a free whose shard was away when it happened.
    Tombstone { id: u64, end: End, ending: Option<Ending> },
    /// A plain key/value (calibration snapshots), with a TTL in ms when `px` is set
    /// (response owners).
    Set { key: String, value: String, px: Option<u64> },
    /// Only publish `event`, on the shard owning `key`.
    Publish { key: String, event: Event },
}

/// Most ops sent in one pipeline.
const BATCH: usize = 256;

/// Sends the ops queued for `shard`, one pipeline per batch.
pub async fn writer(store: Arc<RedisStore>, shard: ShardId, mut rx: mpsc::Receiver<(String, Op)>) {
    let mut buf = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut buf, BATCH).await > 0 {
        let n = buf.len() as u64;
        // The frees in this batch, held to be sent again if it is lost with its shard.
        let frees: Vec<Free> = buf.iter().filter_map(|(_, op)| op.free()).collect();
        if !store.shards.is_up(shard) {
            store.stats.writes_dropped.fetch_add(n, Ordering::Relaxed);
            store.hold_frees(shard, &frees);
            buf.clear();
            continue;
        }
        let mut pipe = redis::pipe();
        let now = Instant::now();
        for (key, op) in buf.drain(..) {
            store.add_op(&mut pipe, key, op, now);
        }
        match store.shards.pipe::<()>(shard, &pipe).await {
            Ok(()) => store.stats.writes.fetch_add(n, Ordering::Relaxed),
            Err(e) => {
                tracing::debug!(error = %e, shard = %store.shards.node(shard).url, "replicated writes dropped");
                store.hold_frees(shard, &frees);
                store.stats.writes_dropped.fetch_add(n, Ordering::Relaxed)
            }
        };
    }
}

/// Frees a shard missed: assignment id -> the free, and when.
pub type HeldFrees = std::collections::HashMap<u64, (Free, Instant)>;

impl RedisStore {
    /// Where the end of assignment `id` (`*`: every one) is kept for resyncs.
    pub(super) fn tombstone_key(&self, id: impl std::fmt::Display, end: End) -> String {
        let kind = match end {
            End::Cancelled => "cxl",
            End::Completed => "fin",
        };
        format!("{}:{kind}:{id}", self.config.key_prefix)
    }

    /// Keeps `frees` that `shard` did not take, to send when it is back (see
    /// [`RedisStore::send_held_frees`]).
    pub(super) fn hold_frees(&self, shard: ShardId, frees: &[Free]) {
        if frees.is_empty() {
            return;
        }
        let now = tokio::time::Instant::now();
        let mut held = self.held_frees.lock();
        let on = held.entry(shard).or_default();
        on.extend(frees.iter().map(|&f| (f.id, (f, now))));
    }

    /// Sends the frees `shard` missed while it was away, each with a tombstone: a replica
    /// that holds the pick hears it now or finds it when it resyncs. Those older than the
    /// assignment TTL are dropped (every replica let the pick go by then). Called when the
    /// shard is back (probe) and after each resync of it.
    pub(crate) fn send_held_frees(&self, shard: ShardId) {
        if !self.shards.is_up(shard) {
            return;
        }
        let frees = self.held_frees.lock().remove(&shard).unwrap_or_default();
        for (free, at) in frees.into_values() {
            if at.elapsed() < self.assignment_ttl {
                self.stats.frees_resent.fetch_add(1, Ordering::Relaxed);
                self.send(free.tombstone());
            }
        }
    }
}

/// A tombstone's value: the id alone, or with how the request ended (JSON).
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Tombstone {
    pub id: u64,
    #[serde(default)]
    pub ending: Option<Ending>,
}

impl Tombstone {
    pub fn parse(value: &[u8]) -> Option<Tombstone> {
        let text = std::str::from_utf8(value).ok()?;
        match text.parse::<u64>() {
            Ok(id) => Some(Tombstone { id, ending: None }),
            Err(_) => serde_json::from_str(text).ok(),
        }
    }

    /// The value to store: the id alone when there is no ending.
    pub fn value(&self) -> String {
        match self.ending {
            None => self.id.to_string(),
            Some(_) => serde_json::to_string(self).unwrap_or_else(|_| self.id.to_string()),
        }
    }
}

impl Op {
    /// The assignment this op frees, and how.
    pub fn free(&self) -> Option<Free> {
        match *self {
            Op::Delete { id, .. } => Some(Free { id, end: End::Completed, ending: None }),
            Op::Tombstone { id, end, ending } => Some(Free { id, end, ending }),
            _ => None,
        }
    }
}

/// A free to write (again, if its shard was away when it happened).
#[derive(Clone, Copy, Debug)]
pub struct Free {
    pub id: u64,
    pub end: End,
    pub ending: Option<Ending>,
}

impl Free {
    /// The op that writes it with a tombstone.
    pub fn tombstone(self) -> Op {
        Op::Tombstone { id: self.id, end: self.end, ending: self.ending }
    }
}

/// Publishes this replica's heartbeat on `shard`'s channel every `heartbeat_ms` (module docs).
pub async fn heartbeat(store: Arc<RedisStore>, shard: ShardId) {
    let mut tick = tokio::time::interval(Duration::from_millis(store.config.heartbeat_ms.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let payload = store.payload(&Event::Heartbeat);
    loop {
        tick.tick().await;
        if let Some(p) = &payload {
            // A failure marks the shard down like any call; the probe brings it back.
            let _ = store.shards.cmd::<()>(shard, redis::cmd("PUBLISH").arg(&store.channel).arg(p)).await;
        }
    }
}

/// Subscribes to `shard`'s event channel for as long as the state lives, reconnecting.
pub async fn subscriber(store: Arc<RedisStore>, inbound: Inbound, shard: ShardId) {
    let retry = Duration::from_millis(store.config.probe_interval_ms.max(10));
    while !inbound.is_closed() {
        let why = match subscribe_once(&store, &inbound, shard).await {
            Ok(()) => "event subscription closed".to_string(),
            Err(e) => format!("event subscription lost: {e}"),
        };
        tracing::debug!(shard = %store.shards.node(shard).url, "{why}");
        store.shards.set_subscribed(shard, false);
        store.shards.mark_down_because(shard, &why);
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
    store.shards.set_subscribed(shard, true);
    store.send_held_frees(shard);
    tracing::debug!(shard = %store.shards.node(shard).url, loaded, "subscribed to replica events");
    let heartbeat = Duration::from_millis(store.config.heartbeat_ms.max(1));
    let silence = heartbeat.saturating_mul(3);
    let mut messages = pubsub.on_message();
    loop {
        // Anything, our own heartbeat included, proves the connection alive. A silence is
        // given one more heartbeat: a process that was stopped (SIGSTOP, a VM pause) wakes
        // with its timers past due before its socket is read, and what waits there (the
        // cancels it must hear) is lost if the subscription is dropped unread.
        let next = match tokio::time::timeout(silence, messages.next()).await {
            Err(_) => tokio::time::timeout(heartbeat, messages.next()).await,
            read => read,
        };
        let msg = match next {
            Ok(Some(msg)) => msg,
            Ok(None) => return Ok(()),
            Err(_) => {
                store.stats.subscription_timeouts.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(shard = %store.shards.node(shard).url, ?silence, "event subscription silent (half-open?): resubscribing");
                return Err(super::StoreError::Timeout(silence));
            }
        };
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
    // Ends first (tombstones): a pick recorded by a replica after its proxy gave up (its
    // record may still be on the shard) is discarded, not adopted, and our own picks whose
    // end we did not hear are freed.
    let mut cancelled = std::collections::HashSet::new();
    for end in [End::Cancelled, End::Completed] {
        for value in store.scan_values(shard, &store.tombstone_key("*", end)).await? {
            match Tombstone::parse(&value) {
                Some(Tombstone { id, ending }) => {
                    cancelled.insert(id);
                    let id = AssignmentId(id);
                    let _ = inbound.send(match end {
                        End::Cancelled => FleetEvent::Cancelled { id, ending },
                        End::Completed => FleetEvent::Completed { id, ending },
                    });
                }
                None => {
                    store.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    let mut loaded = 0;
    let now = Instant::now();
    let mut found = std::collections::HashSet::new();
    for value in store.scan_values(shard, &format!("{}:asg:*", store.config.key_prefix)).await? {
        match serde_json::from_slice::<Record>(&value) {
            Ok(r) if r.replica != store.replica && !cancelled.contains(&r.id) => match r.assignment(now, store.ttls()) {
                Some(assignment) => {
                    loaded += 1;
                    found.insert(r.id);
                    store.track_adopted(r.id, true);
                    let _ = inbound.send(FleetEvent::Assigned { assignment, credit: Arc::from([]) });
                }
                None => stale(store, &r),
            },
            Ok(_) => {}
            Err(_) => {
                store.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    // Adopted before, gone from the shard now: freed while we could not hear it (or the shard
    // restarted empty). Keeping them would park their load here until a TTL.
    let lost = store.reconcile(inbound, shard, &found);
    if lost > 0 {
        store.stats.reconciled.fetch_add(lost as u64, Ordering::Relaxed);
        tracing::info!(shard = %store.shards.node(shard).url, lost, "resync freed assignments the shard no longer holds");
    }
    Ok(loaded)
}

/// Turns another replica's event into the fleet event it stands for.
pub fn receive(store: &RedisStore, inbound: &Inbound, event: Event) {
    if matches!(event, Event::Heartbeat) {
        return;
    }
    store.stats.received.fetch_add(1, Ordering::Relaxed);
    let event = match event {
        Event::Assigned(r) => match r.assignment(Instant::now(), store.ttls()) {
            Some(assignment) => {
                store.track_adopted(r.id, true);
                FleetEvent::Assigned { assignment, credit: r.keys().into() }
            }
            None => return stale(store, &r),
        },
        Event::FirstToken { id, elapsed_ms } => FleetEvent::FirstToken { id: AssignmentId(id), elapsed_ms },
        // Completion and cancellation free alike; the usage was observed where it was reported.
        Event::Freed { id, ending } => {
            store.track_adopted(id, false);
            FleetEvent::Completed { id: AssignmentId(id), ending }
        }
        // Remembered where the pick is not recorded yet, so it is discarded when it is.
        Event::Cancelled { id, ending } => {
            store.track_adopted(id, false);
            FleetEvent::Cancelled { id: AssignmentId(id), ending }
        }
        Event::WorkerAdded(worker) => return store.adopt_worker(inbound, *worker),
        Event::WorkerRemoved { id } => return store.drop_worker(inbound, &id),
        Event::WorkerSuspect { id, reason } => FleetEvent::Suspected {
            worker: WorkerId::new(&id),
            reason: UpstreamFailure::try_from(reason).unwrap_or(UpstreamFailure::UpstreamReset),
        },
        Event::WorkerDraining { id } => FleetEvent::Draining(WorkerId::new(&id)),
        Event::Heartbeat => return,
    };
    let _ = inbound.send(event);
}

/// A record (or `assigned` event) older than its TTL: not adopted, counted.
fn stale(store: &RedisStore, r: &Record) {
    store.stats.stale_records.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(id = r.id, replica = %r.replica, age = ?r.age(), "stale assignment record not adopted");
}

impl StoreStats {
    pub fn dropped(&self) -> u64 {
        self.writes_dropped.load(Ordering::Relaxed)
    }
}
