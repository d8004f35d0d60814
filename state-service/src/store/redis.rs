//! The Redis store: several state services act as one.
//!
//! What goes through Redis (see the README's "Replicas and Redis" for the trade-offs):
//! - assignments (and so per-worker pending load and speculative credit): each pick is
//!   queued for a writer task that stores a record with a TTL and publishes it; every other
//!   replica's subscriber applies it to its own table ([`replicate`]);
//! - calibration: first-token reports are replicated like assignments and every replica
//!   refits; the latest fit is also stored for a warm start;
//! - a mirror of every engine's block set, written by the engine's lease holder ([`lease`],
//!   [`mirror`]), loaded at start so a new replica answers correctly before any new event;
//! - workers registered or removed through any replica's admin API (`redis/workers.rs`): stored
//!   without TTL and published; other replicas register or remove them too, and a starting
//!   replica registers the stored ones (with their mirrors) as if they were in its config.
//!
//! Nothing on the pick path waits for Redis. Shards are probed, and every subscription hears
//! a heartbeat; while a shard is down (or its subscription silent) picks are marked degraded
//! (`state_unavailable`), its writes are dropped and counted, and its mirrors are rewritten
//! once it is back. Each shard has its own write queue, so a slow one delays only itself.
//!
//! The budget ledger ([`ledger`]) lives here too: one sliding log per tenant scope on the
//! shard that owns it, changed only by atomic scripts, so every replica charges one budget.

pub mod lease;
pub mod ledger;
pub mod mirror;
pub mod replicate;
pub mod shards;
mod stats;
pub mod wire;
mod workers;

pub use ledger::RedisLedger;
pub use mirror::{Mirror, MirrorKey, MirroredIndex};
pub use stats::StoreStats;

use super::{Inbound, RedisConfig, Replication, ResponseDirectory, ResponseFuture, ShareError, Store, WarmStart};
use crate::config::{Config, WorkerConfig};
use crate::fleet::{Change, End, FleetEvent, WorkerEntry};
use crate::stored::Owner;
use crate::ingest::IngestStats;
use kvroute_score::Calibration;
use kvroute_kv::types::WorkerId;
use parking_lot::Mutex;
use rand::Rng;
use replicate::Op;
use shards::{ShardId, Shards};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use wire::{Event, Record, Ttls};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store configuration: {0}")]
    Config(String),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis call timed out after {0:?}")]
    Timeout(Duration),
    #[error("redis shard {url}: {message}")]
    Auth { url: String, message: String },
}

/// What a warm start found in Redis, consumed as engines and workers start.
#[derive(Default)]
struct Found {
    mirrors: HashMap<(String, u32), Mirror>,
    calibrations: HashMap<String, Calibration>,
    /// Workers registered at runtime on some replica, registered here on attach.
    workers: Vec<WorkerConfig>,
}


pub struct RedisStore {
    pub config: RedisConfig,
    pub replica: String,
    pub shards: Arc<Shards>,
    pub index: Arc<MirroredIndex>,
    pub stats: Arc<StoreStats>,
    /// The tenants' budgets, on the same shards.
    pub ledger: Arc<RedisLedger>,
    channel: String,
    assignment_ttl: Duration,
    first_token_ttl: Duration,
    /// One write queue per shard (index = shard), drained by that shard's writer.
    queues: Vec<mpsc::Sender<(String, Op)>>,
    pending_rx: Mutex<Vec<mpsc::Receiver<(String, Op)>>>,
    warm: Mutex<Found>,
    /// Ids of the workers registered at runtime (here or on another replica).
    shared: Mutex<HashSet<String>>,
    /// Ids of this replica's config workers: a shared worker of the same id never replaces one.
    config_workers: HashSet<String>,
    /// Other replicas' assignments adopted here, and when: a resync frees those its shard no
    /// longer holds (their `freed` event was lost while the shard was away).
    adopted: Mutex<HashMap<u64, tokio::time::Instant>>,
    /// Frees that could not be written (their shard was away), per shard: sent again, as
    /// tombstones, once it is back, so the replica holding the pick hears of them.
    held_frees: Mutex<HashMap<ShardId, replicate::HeldFrees>>,
    salt: u64,
}

impl RedisStore {
    /// Prepares the shards and loads what a warm start needs for the configured workers
    /// (their engines' mirrors, calibration). Unreachable shards are skipped: those engines
    /// start cold and the shard is marked down.
    ///
    /// Fails on a bad `[redis]` table (URLs, `#insecure`, an unreadable `password_file` or
    /// `ca_file`) and when a shard refuses the credentials: those are configuration errors,
    /// not outages.
    pub async fn connect(config: &Config) -> Result<Arc<RedisStore>, StoreError> {
        let rc = config.redis.clone();
        rc.validate().map_err(StoreError::Config)?;
        let password = rc.password().map_err(StoreError::Config)?;
        let ca_pem = match &rc.ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|e| StoreError::Config(format!("redis.ca_file {}: {e}", path.display())))?),
            None => None,
        };
        let opts = shards::ConnectOptions { password, ca_pem };
        let shards = Arc::new(Shards::with_options(&rc.urls, Duration::from_millis(rc.timeout_ms.max(1)), &opts)?);
        check_credentials(&shards).await?;
        let replica = rc.replica_id.clone().unwrap_or_else(|| format!("replica-{:016x}", rand::thread_rng().gen::<u64>()));
        let (queues, pending): (Vec<_>, Vec<_>) = shards.ids().map(|_| mpsc::channel(rc.queue.max(1))).unzip();
        let store = Arc::new(RedisStore {
            channel: format!("{}:events", rc.key_prefix),
            salt: xxhash_rust::xxh3::xxh3_64(replica.as_bytes()),
            replica,
            ledger: Arc::new(RedisLedger::new(shards.clone(), &rc.key_prefix)),
            shards,
            index: Arc::new(MirroredIndex::new()),
            stats: Arc::new(StoreStats::default()),
            assignment_ttl: Duration::from_millis(config.timeouts.assignment_ttl_ms),
            first_token_ttl: Duration::from_millis(config.timeouts.first_token_ttl_ms),
            queues,
            pending_rx: Mutex::new(pending),
            warm: Mutex::new(Found::default()),
            shared: Mutex::new(HashSet::new()),
            config_workers: config.workers.iter().map(|w| w.id.clone()).collect(),
            adopted: Mutex::new(HashMap::new()),
            held_frees: Mutex::new(HashMap::new()),
            config: rc,
        });
        store.load_warm_start(config).await;
        Ok(store)
    }

    /// The store bundle: every contract answered by this store, its mirrored index, its
    /// ledger and its metrics.
    pub fn store(self: &Arc<Self>) -> Store {
        let handle = Arc::new(Handle(self.clone()));
        Store {
            index: self.index.clone(),
            replication: handle.clone(),
            warm_start: handle.clone(),
            workers: handle.clone(),
            responses: handle,
            ledger: Some(self.ledger.clone()),
            collector: Some(Box::new(stats::StoreCollector { store: Arc::downgrade(self) })),
        }
    }

    async fn load_warm_start(&self, config: &Config) {
        let mut warm = Found::default();
        for shard in self.shards.ids() {
            match self.load_workers(shard).await {
                Ok(found) => warm.workers.extend(found.into_iter().filter(|w| !config.workers.iter().any(|c| c.id == w.id))),
                Err(e) => tracing::warn!(shard = shard.0, error = %e, "runtime-registered workers not loaded from this shard"),
            }
        }
        for w in config.workers.iter().chain(&warm.workers) {
            for rank in 0..w.dp_ranks {
                let key = MirrorKey::new(&self.config.key_prefix, &w.id, rank);
                match mirror::load(&self.shards, self.shards.owner(&key.blocks), &key).await {
                    Ok(m) if m.seq.is_some() || !m.blocks.is_empty() => {
                        warm.mirrors.insert((w.id.clone(), rank), m);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(worker = %w.id, rank, error = %e, "no warm start for this engine"),
                }
            }
            let key = self.calibration_key(&w.id);
            match self.shards.cmd::<Option<String>>(self.shards.owner(&key), redis::cmd("GET").arg(&key)).await {
                Ok(Some(json)) => match serde_json::from_str::<Calibration>(&json) {
                    Ok(c) => {
                        warm.calibrations.insert(w.id.clone(), c);
                    }
                    Err(e) => tracing::warn!(worker = %w.id, error = %e, "stored calibration unreadable"),
                },
                Ok(None) => {}
                Err(e) => tracing::warn!(worker = %w.id, error = %e, "calibration not loaded"),
            }
        }
        tracing::info!(mirrors = warm.mirrors.len(), calibrations = warm.calibrations.len(), workers = warm.workers.len(), "warm start loaded");
        *self.warm.lock() = warm;
    }

    /// A shard is down or its subscription silent: picks answer from local state, degraded.
    pub fn degraded(&self) -> bool {
        !self.shards.all_up() || !self.shards.all_subscribed()
    }

    fn response_key(&self, id: &str) -> String {
        format!("{}:resp:{id}", self.config.key_prefix)
    }

    fn calibration_key(&self, worker: &str) -> String {
        // `steps`: the fit of the step model; fits of the earlier per-request model (under
        // `calib:`) must not seed it.
        format!("{}:calib-steps:{worker}", self.config.key_prefix)
    }

    fn assignment_key(&self, id: u64) -> String {
        format!("{}:asg:{id}", self.config.key_prefix)
    }

    /// The values of every key on `shard` matching `pattern` (SCAN + MGET; keys that expire
    /// between the two are skipped).
    pub(crate) async fn scan_values(&self, shard: ShardId, pattern: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        let (mut cursor, mut out) = (0u64, Vec::new());
        loop {
            let (next, keys): (u64, Vec<String>) =
                self.shards.cmd(shard, redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000)).await?;
            if !keys.is_empty() {
                let values: Vec<Option<Vec<u8>>> = self.shards.cmd(shard, redis::cmd("MGET").arg(&keys)).await?;
                out.extend(values.into_iter().flatten());
            }
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
    }

    /// Queues `op` for the shard owning its key; dropped (and counted) when that shard is
    /// down or its queue is full.
    fn send(&self, op: Op) {
        let key = self.op_key(&op);
        let shard = self.shards.owner(&key);
        let free = op.free();
        if !self.shards.is_up(shard) || self.queues[shard.0].try_send((key, op)).is_err() {
            self.stats.writes_dropped.fetch_add(1, Ordering::Relaxed);
            self.hold_frees(shard, free.as_slice());
        }
    }

    /// Another replica's assignment `id` was adopted (or, `false`, freed).
    fn track_adopted(&self, id: u64, live: bool) {
        let mut adopted = self.adopted.lock();
        if live {
            adopted.insert(id, tokio::time::Instant::now());
        } else {
            adopted.remove(&id);
        }
    }

    /// Frees the adopted assignments owned by `shard` that its resync did not find (`found`),
    /// and forgets adopted ids past the assignment TTL (the fleet expired them itself).
    fn reconcile(&self, inbound: &Inbound, shard: ShardId, found: &HashSet<u64>) -> usize {
        let ttl = self.assignment_ttl;
        let mut adopted = self.adopted.lock();
        adopted.retain(|_, at| at.elapsed() < ttl);
        let lost: Vec<u64> =
            adopted.keys().copied().filter(|id| !found.contains(id) && self.shards.owner(&self.assignment_key(*id)) == shard).collect();
        for id in &lost {
            adopted.remove(id);
            let _ = inbound.send(FleetEvent::Completed { id: crate::assign::AssignmentId(*id), ending: None });
        }
        lost.len()
    }

    fn ttls(&self) -> Ttls {
        Ttls { assignment: self.assignment_ttl, first_token: self.first_token_ttl }
    }

    /// The key that decides an op's shard.
    fn op_key(&self, op: &Op) -> String {
        match op {
            Op::Put { record, .. } => self.assignment_key(record.id),
            Op::Delete { id, .. } | Op::Tombstone { id, .. } => self.assignment_key(*id),
            Op::Set { key, .. } | Op::Publish { key, .. } => key.clone(),
        }
    }

    /// What this replica publishes for `event`: the origin first, so a replica skips its own
    /// messages without parsing.
    fn payload(&self, event: &Event) -> Option<String> {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            from: &'a str,
            event: &'a Event,
        }
        let json = serde_json::to_string(&Out { from: &self.replica, event }).ok()?;
        Some(format!("{}\n{json}", self.replica))
    }

    /// Adds the PUBLISH of `event` on this store's channel to `pipe`.
    fn publish(&self, pipe: &mut redis::Pipeline, event: Event) {
        if let Some(payload) = self.payload(&event) {
            pipe.publish(&self.channel, payload).ignore();
        }
    }

    fn add_op(&self, pipe: &mut redis::Pipeline, key: String, op: Op, now: Instant) {
        match op {
            Op::Put { record, expires, event } => {
                // What is left of the record's life, never more; nothing once it is over.
                let ttl = expires.saturating_duration_since(now).as_millis() as u64;
                if ttl > 0 {
                    if let Ok(json) = serde_json::to_string(&record) {
                        pipe.pset_ex(&key, json, ttl).ignore();
                    }
                }
                if let Some(event) = event {
                    self.publish(pipe, event);
                }
            }
            Op::Delete { event, .. } => {
                pipe.del(&key).ignore();
                self.publish(pipe, event);
            }
            Op::Tombstone { id, end, ending } => {
                // A cancel matters until the pick's first-token TTL, an end for its whole life.
                let (ttl, event) = match end {
                    End::Cancelled => (self.first_token_ttl, Event::Cancelled { id, ending }),
                    End::Completed => (self.assignment_ttl, Event::Freed { id, ending }),
                };
                pipe.del(&key).ignore();
                pipe.pset_ex(self.tombstone_key(id, end), replicate::Tombstone { id, ending }.value(), ttl.as_millis() as u64).ignore();
                self.publish(pipe, event);
            }
            Op::Set { value, px: None, .. } => {
                pipe.set(&key, value).ignore();
            }
            Op::Set { value, px: Some(ms), .. } => {
                pipe.pset_ex(&key, value, ms).ignore();
            }
            Op::Publish { event, .. } => self.publish(pipe, event),
        }
    }

    /// Probes `shard` (one task per shard, so a slow one does not delay the others'); a
    /// shard that comes back gets its mirrors rewritten (the lease tasks see it up again and
    /// flush the full rewrite they requested while it was down).
    async fn probe_loop(self: Arc<Self>, shard: ShardId) {
        let every = Duration::from_millis(self.config.probe_interval_ms.max(10));
        loop {
            if self.shards.probe(shard).await {
                self.stats.recoveries.fetch_add(1, Ordering::Relaxed);
                tracing::info!(shard = %self.shards.node(shard).url, "redis shard back");
                self.send_held_frees(shard);
            }
            tokio::time::sleep(every).await;
        }
    }
}

/// PINGs every shard once: refused credentials (wrong password, unknown ACL user, missing
/// AUTH) fail the start with the server's answer; an unreachable shard is only marked down.
async fn check_credentials(shards: &Shards) -> Result<(), StoreError> {
    for id in shards.ids() {
        match shards.cmd::<String>(id, &redis::cmd("PING")).await {
            Err(StoreError::Redis(e)) if is_auth_error(&e) => {
                let url = shards.node(id).url.clone();
                return Err(StoreError::Auth { url, message: format!("credentials refused ({e}); check the URL's user and redis.password_file / password_env") });
            }
            Err(e) => tracing::warn!(shard = %shards.node(id).url, error = %e, "redis shard unreachable at start: picks degraded until it answers"),
            Ok(_) => {}
        }
    }
    Ok(())
}

fn is_auth_error(e: &redis::RedisError) -> bool {
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        return true;
    }
    let text = e.to_string();
    ["WRONGPASS", "NOAUTH", "NOPERM"].iter().any(|code| text.contains(code))
}

fn unavailable(shard: ShardId, e: StoreError) -> ShareError {
    ShareError::Unavailable(format!("redis shard {}: {e}", shard.0))
}

/// The contracts' handle: tasks and futures it starts hold the store itself.
struct Handle(Arc<RedisStore>);

impl Replication for Handle {
    fn attach(&self, inbound: Inbound) {
        let me = &self.0;
        let workers = std::mem::take(&mut me.warm.lock().workers);
        for worker in workers {
            me.adopt_worker(&inbound, worker);
        }
        for (worker, calibration) in std::mem::take(&mut me.warm.lock().calibrations) {
            let _ = inbound.send(FleetEvent::CalibrationRestored { worker: WorkerId::new(&worker), calibration });
        }
        for (i, rx) in std::mem::take(&mut *me.pending_rx.lock()).into_iter().enumerate() {
            tokio::spawn(replicate::writer(me.clone(), ShardId(i), rx));
        }
        for shard in me.shards.ids() {
            tokio::spawn(replicate::subscriber(me.clone(), inbound.clone(), shard));
            tokio::spawn(replicate::heartbeat(me.clone(), shard));
            tokio::spawn(me.clone().probe_loop(shard));
        }
    }

    fn publish(&self, change: Change<'_>) {
        let me = &self.0;
        match change {
            Change::Assigned { assignment: a, credit } => {
                // Keys travel in the event only: the stored record is for load and calibration.
                let record = Box::new(Record::new(a, &[], &me.replica));
                let event = Some(Event::Assigned(Record::new(a, credit, &me.replica)));
                me.send(Op::Put { record, expires: a.created_at + me.first_token_ttl, event });
            }
            Change::FirstToken { assignment: a, elapsed_ms, calibration } => {
                // Refreshed until the end of its whole life (assignment TTL from its creation,
                // never from now): `add_op` writes what is left of it, or nothing.
                let record = Box::new(Record::new(a, &[], &me.replica));
                let event = Some(Event::FirstToken { id: a.id.0, elapsed_ms });
                me.send(Op::Put { record, expires: a.created_at + me.assignment_ttl, event });
                if let Some(json) = calibration.and_then(|c| serde_json::to_string(c).ok()) {
                    me.send(Op::Set { key: me.calibration_key(a.worker.as_str()), value: json, px: None });
                }
            }
            Change::Freed { id } => {
                // Another replica's pick: that replica holds it, so it must hear of the end
                // even if it is not listening now (frozen, resubscribing).
                let op = match me.adopted.lock().remove(&id.0) {
                    Some(_) => Op::Tombstone { id: id.0, end: End::Completed, ending: None },
                    None => Op::Delete { id: id.0, event: Event::Freed { id: id.0, ending: None } },
                };
                me.send(op);
            }
            Change::CancelledUnknown { id, ending } => me.send(Op::Tombstone { id: id.0, end: End::Cancelled, ending: Some(ending) }),
            Change::CompletedUnknown { id, ending } => me.send(Op::Tombstone { id: id.0, end: End::Completed, ending: Some(ending) }),
            Change::Suspected { worker, reason } => {
                let event = Event::WorkerSuspect { id: worker.to_string(), reason: reason as i32 };
                me.send(Op::Publish { key: me.worker_key(worker.as_str()), event });
            }
            Change::Draining { worker } => {
                let event = Event::WorkerDraining { id: worker.to_string() };
                me.send(Op::Publish { key: me.worker_key(worker.as_str()), event });
            }
        }
    }

    fn degraded(&self) -> bool {
        self.0.degraded()
    }

    fn id_salt(&self) -> u64 {
        self.0.salt
    }
}

impl WarmStart for Handle {
    fn engine_started(&self, worker: &Arc<WorkerEntry>, rank: u32, stats: &Arc<IngestStats>) -> Option<u64> {
        let me = &self.0;
        let slot = worker.engines.iter().find(|e| e.rank == rank)?.slot;
        let warm = me.warm.lock().mirrors.remove(&(worker.id.to_string(), rank));
        let resume = warm.and_then(|m| {
            let n = me.index.memory().restore(slot, &m.blocks);
            tracing::info!(worker = %worker.id, rank, blocks = n, seq = ?m.seq, "engine restored from the mirror");
            if let Some(seq) = m.seq {
                stats.set_last_seq(seq);
            }
            m.seq
        });
        let engine = lease::EngineMirror {
            slot,
            lease_key: format!("{}:lease:{}:{rank}", me.config.key_prefix, worker.id),
            key: MirrorKey::new(&me.config.key_prefix, worker.id.as_str(), rank),
            stats: stats.clone(),
        };
        let task = tokio::spawn(lease::run(me.clone(), engine));
        worker.add_task(task.abort_handle());
        resume
    }
}

impl ResponseDirectory for Handle {
    fn share_response(&self, id: &str, owner: &Owner, ttl: Duration) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        self.0.send(Op::Set { key: self.0.response_key(id), value: owner.encode(), px: Some(ms) });
    }

    fn find_response(&self, id: &str) -> ResponseFuture {
        let (me, key) = (self.0.clone(), self.0.response_key(id));
        Box::pin(async move {
            let shard = me.shards.owner(&key);
            if !me.shards.is_up(shard) {
                return None;
            }
            let value: Option<String> = me.shards.cmd(shard, redis::cmd("GET").arg(&key)).await.ok()?;
            value.as_deref().and_then(Owner::decode)
        })
    }
}
