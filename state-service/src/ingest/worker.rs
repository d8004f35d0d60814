//! The ingest thread's loop: receive, sequence-check, replay, decode, apply.

use super::replay::{replay, ReplayRequest};
use super::seq::{SeqAction, SeqTracker};
use super::stats::{EventKind, IngestStats, RejectKind};
use super::{connect_endpoint, IngestConfig};
use kvroute_kv::vllm::{decode_batch_into, EventBatch};
use kvroute_kv::index::KvIndex;
use kvroute_kv::types::{EngineSlot, KvEvent};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a blocked receive wakes up to look at the stop flag.
const POLL: Duration = Duration::from_millis(100);
/// A stream still silent this long after subscribing is caught up from the replay buffer.
const JOIN_CATCH_UP: Duration = Duration::from_secs(1);
/// Wait before retrying a socket that could not be set up.
const RETRY: Duration = Duration::from_secs(1);

pub(super) struct Worker {
    cfg: IngestConfig,
    index: Arc<dyn KvIndex>,
    stats: Arc<IngestStats>,
    stop: Arc<AtomicBool>,
    ctx: zmq::Context,
    seq: SeqTracker,
    batch: EventBatch,
}

impl Worker {
    pub(super) fn new(
        cfg: IngestConfig,
        index: Arc<dyn KvIndex>,
        stats: Arc<IngestStats>,
        stop: Arc<AtomicBool>,
        ctx: zmq::Context,
    ) -> Self {
        Worker { cfg, index, stats, stop, ctx, seq: SeqTracker::default(), batch: EventBatch::default() }
    }

    pub(super) fn engine(&self) -> EngineSlot {
        self.cfg.engine
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub(super) fn run(mut self) {
        let engine = self.cfg.engine.0;
        let _span = tracing::info_span!("ingest", engine, endpoint = %self.cfg.endpoint).entered();
        while !self.stopping() {
            match self.subscribe() {
                Ok(sub) => {
                    let catch_up_at = match self.cfg.resume_from.take() {
                        Some(from) => {
                            self.resume(from);
                            None
                        }
                        None => Some(Instant::now() + JOIN_CATCH_UP),
                    };
                    self.receive_loop(&sub, catch_up_at)
                }
                Err(e) => {
                    self.stats.socket_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "cannot subscribe; retrying");
                    self.stats.notify_progress();
                    std::thread::park_timeout(RETRY);
                }
            }
        }
    }

    fn subscribe(&self) -> Result<zmq::Socket, zmq::Error> {
        let sub = self.ctx.socket(zmq::SUB)?;
        sub.set_linger(0)?;
        sub.set_rcvtimeo(POLL.as_millis() as i32)?;
        sub.set_subscribe(self.cfg.topic.as_bytes())?;
        sub.connect(&connect_endpoint(&self.cfg.endpoint))?;
        Ok(sub)
    }

    /// Applies live batches until the socket fails or the thread stops; at `catch_up_at`, if no
    /// batch has arrived yet, catches up from the replay buffer (see [`Self::catch_up`]).
    fn receive_loop(&mut self, sub: &zmq::Socket, mut catch_up_at: Option<Instant>) {
        while !self.stopping() {
            match sub.recv_multipart(0) {
                Ok(frames) => {
                    catch_up_at = None;
                    self.on_message(&frames);
                    self.stats.notify_progress();
                }
                Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => {
                    if catch_up_at.is_some_and(|at| Instant::now() >= at) {
                        catch_up_at = None;
                        self.catch_up();
                        self.stats.notify_progress();
                    }
                }
                Err(e) => {
                    self.stats.socket_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "receive failed; resubscribing");
                    return;
                }
            }
        }
    }

    fn on_message(&mut self, frames: &[Vec<u8>]) {
        let Some((seq, payload)) = self.parse_live(frames) else {
            self.stats.reject(RejectKind::MalformedMessage, 1);
            return;
        };
        match self.seq.observe(seq) {
            SeqAction::Duplicate => {
                self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                return;
            }
            SeqAction::Apply => {}
            SeqAction::Reset => {
                tracing::info!(seq, "sequence went backwards: engine restarted, dropping its blocks");
                self.stats.resets.fetch_add(1, Ordering::Relaxed);
                self.index.clear_engine(self.cfg.engine);
            }
            SeqAction::Gap { from } => {
                self.stats.gaps.fetch_add(1, Ordering::Relaxed);
                if self.recover(from, seq) {
                    self.stats.gaps_recovered.fetch_add(1, Ordering::Relaxed);
                }
            }
            SeqAction::CatchUp => {
                tracing::info!(seq, "joined the stream mid-way: catching up from the replay buffer");
                self.recover(0, seq);
            }
        }
        self.apply_payload(payload);
        self.stats.set_last_seq(seq);
    }

    /// `[topic, seq8, payload]`, with the topic matching exactly when one is configured.
    fn parse_live<'f>(&self, frames: &'f [Vec<u8>]) -> Option<(u64, &'f [u8])> {
        let [topic, seq, payload] = frames else { return None };
        if !self.cfg.topic.is_empty() && topic.as_slice() != self.cfg.topic.as_bytes() {
            return None;
        }
        let seq: [u8; 8] = seq.as_slice().try_into().ok()?;
        Some((u64::from_be_bytes(seq), payload))
    }

    /// Replays batches `from..live` into the index; true when the replay completed.
    fn recover(&mut self, from: u64, live: u64) -> bool {
        let Some(endpoint) = self.cfg.replay_endpoint.clone() else {
            tracing::warn!(from, live, "missing batches and no replay endpoint: they are lost");
            return false;
        };
        self.stats.replays.fetch_add(1, Ordering::Relaxed);
        let ctx = self.ctx.clone();
        let stop = Arc::clone(&self.stop);
        let req = ReplayRequest {
            endpoint: &connect_endpoint(&endpoint),
            from,
            until: live,
            idle_timeout: self.cfg.replay_timeout,
            stop: &stop,
        };
        let result = replay(&ctx, req, |_, payload| {
            self.stats.replayed_batches.fetch_add(1, Ordering::Relaxed);
            self.apply_payload(payload);
        });
        match result {
            Ok(r) if r.complete => true,
            Ok(r) => {
                tracing::warn!(from, live, got = r.batches, "replay incomplete: some batches lost");
                false
            }
            Err(e) => {
                self.stats.replay_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(from, live, error = %e, "replay failed: batches lost");
                false
            }
        }
    }

    /// Warm start: replays everything the engine buffered from `from` (the mirror's seq) on.
    fn resume(&mut self, from: u64) {
        match self.replay_from(from) {
            Some(seq) => self.replayed_through(seq),
            None => self.seq.resume(from, false),
        }
        tracing::info!(from, "resumed from the mirror");
    }

    /// The stream stayed silent after subscribing: replays what the engine buffered after the
    /// last batch applied (everything, on a first join). Blocks stored before the subscription
    /// reached the publisher (ZMQ drops those), or by an engine that has been quiet since we
    /// started, are indexed now instead of at the next live batch, which may never come.
    fn catch_up(&mut self) {
        if let Some(seq) = self.replay_from(self.seq.next()) {
            tracing::info!(through = seq, "caught up from the replay buffer after joining a quiet stream");
            self.replayed_through(seq);
        }
    }

    /// Replays and applies every batch the engine still buffers from `from` on; the last seq
    /// applied, if any (none without a replay endpoint).
    fn replay_from(&mut self, from: u64) -> Option<u64> {
        let endpoint = self.cfg.replay_endpoint.clone()?;
        let (ctx, stop) = (self.ctx.clone(), Arc::clone(&self.stop));
        let req = ReplayRequest { endpoint: &connect_endpoint(&endpoint), from, until: u64::MAX, idle_timeout: self.cfg.replay_timeout, stop: &stop };
        let mut last = None;
        let result = replay(&ctx, req, |seq, payload| {
            last = Some(seq);
            self.stats.replayed_batches.fetch_add(1, Ordering::Relaxed);
            self.apply_payload(payload);
        });
        if let Err(e) = result {
            tracing::warn!(from, error = %e, "replay from the buffer failed");
        }
        last
    }

    /// Batches up to `seq` were applied from a replay: live ones up to it are duplicates.
    fn replayed_through(&mut self, seq: u64) {
        self.seq.resume(seq, true);
        self.stats.set_last_seq(seq);
    }

    fn apply_payload(&mut self, payload: &[u8]) {
        if let Err(e) = decode_batch_into(payload, &mut self.batch) {
            self.stats.reject(RejectKind::BadBatch, 1);
            tracing::debug!(kind = e.kind(), error = %e, "undecodable batch");
            return;
        }
        let b = &self.batch;
        if let Some(e) = b.rejected.first() {
            tracing::debug!(kind = e.kind(), error = %e, n = b.rejected.len(), "skipped bad events");
        }
        self.stats.reject(RejectKind::BadEvent, b.rejected.len() as u64);
        if b.data_parallel_rank.is_some_and(|r| r != i64::from(self.cfg.dp_rank)) {
            self.stats.dp_rank_mismatches.fetch_add(1, Ordering::Relaxed);
        }
        for ev in &b.events {
            self.stats.count_event(match ev {
                KvEvent::Stored { .. } => EventKind::BlockStored,
                KvEvent::Removed { .. } => EventKind::BlockRemoved,
                KvEvent::AllCleared => EventKind::AllBlocksCleared,
            });
        }
        let applied = self.index.apply(self.cfg.engine, &self.cfg.model, self.cfg.block_size, &b.events);
        self.stats.record_apply(&applied);
    }
}
