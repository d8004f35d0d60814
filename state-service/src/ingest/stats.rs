//! Per-engine ingestion counters, shared with metrics and the `/v1/workers` endpoint.
//!
//! Plain atomics so readers never block the ingest thread. One mutex+condvar pair exists only
//! so tests (and a readiness check) can wait for progress without sleeping: the ingest thread
//! bumps a generation after every message it handled, and waiters re-check their condition.

use kvroute_kv::index::ApplyStats;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Why a message, event or block was not applied. Labels are stable metric values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectKind {
    /// Not `[topic, seq(8 bytes), payload]`, or another topic.
    MalformedMessage,
    /// The payload is not a readable batch; the whole batch is dropped.
    BadBatch,
    /// One event of a batch could not be decoded; the rest of the batch applied.
    BadEvent,
    /// A stored block's parent is unknown to this engine's map.
    UnknownParent,
    /// A removal of a (hash, tier) the engine does not hold.
    UnknownHash,
    /// A partial block, or a block size other than the configured one.
    BadBlock,
    /// A held block dropped, oldest first, because the engine reported more blocks than its
    /// worker's capacity allows (`resilience.index_capacity_factor`).
    OverCapacity,
}

impl RejectKind {
    pub const ALL: [RejectKind; 7] = [
        RejectKind::MalformedMessage,
        RejectKind::BadBatch,
        RejectKind::BadEvent,
        RejectKind::UnknownParent,
        RejectKind::UnknownHash,
        RejectKind::BadBlock,
        RejectKind::OverCapacity,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RejectKind::MalformedMessage => "malformed_message",
            RejectKind::BadBatch => "bad_batch",
            RejectKind::BadEvent => "bad_event",
            RejectKind::UnknownParent => "unknown_parent",
            RejectKind::UnknownHash => "unknown_hash",
            RejectKind::BadBlock => "bad_block",
            RejectKind::OverCapacity => "over_capacity",
        }
    }
}

/// Event kinds, for "events applied by kind".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    BlockStored,
    BlockRemoved,
    AllBlocksCleared,
}

impl EventKind {
    pub const ALL: [EventKind; 3] = [EventKind::BlockStored, EventKind::BlockRemoved, EventKind::AllBlocksCleared];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::BlockStored => "BlockStored",
            EventKind::BlockRemoved => "BlockRemoved",
            EventKind::AllBlocksCleared => "AllBlocksCleared",
        }
    }
}

const NO_SEQ: u64 = u64::MAX;

/// Counters for one engine's event stream. All monotonic except `last_seq`.
#[derive(Default)]
pub struct IngestStats {
    /// Batches applied (live or replayed).
    pub batches: AtomicU64,
    events: [AtomicU64; 3],
    pub blocks_stored: AtomicU64,
    pub blocks_removed: AtomicU64,
    rejected: [AtomicU64; 7],
    /// Sequence gaps seen on the live stream, and how many replay closed completely.
    pub gaps: AtomicU64,
    pub gaps_recovered: AtomicU64,
    /// Replay requests made, and those that failed (timeout, socket error, no endpoint).
    pub replays: AtomicU64,
    pub replay_failures: AtomicU64,
    /// Batches recovered through replay.
    pub replayed_batches: AtomicU64,
    /// Engine restarts detected (sequence went backwards): the engine's blocks were dropped.
    pub resets: AtomicU64,
    /// Live messages skipped as duplicates of the last sequence number.
    pub duplicates: AtomicU64,
    /// Batches whose data-parallel rank differs from the configured one (still applied).
    pub dp_rank_mismatches: AtomicU64,
    /// Socket setup failures (bad endpoint, ...); the thread retries.
    pub socket_errors: AtomicU64,
    last_seq: AtomicU64Opt,
    /// Wall-clock time of the last applied batch, ms since the epoch (0 = never).
    pub last_event_unix_ms: AtomicU64,
    progress: Mutex<u64>,
    progressed: Condvar,
}

/// An `AtomicU64` whose `u64::MAX` means "none".
struct AtomicU64Opt(AtomicU64);

impl Default for AtomicU64Opt {
    fn default() -> Self {
        AtomicU64Opt(AtomicU64::new(NO_SEQ))
    }
}

impl IngestStats {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn events(&self, kind: EventKind) -> u64 {
        self.events[kind as usize].load(Relaxed)
    }

    pub fn rejected(&self, kind: RejectKind) -> u64 {
        self.rejected[kind as usize].load(Relaxed)
    }

    /// Sequence number of the last message handled on this stream (None before the first).
    pub fn last_seq(&self) -> Option<u64> {
        Some(self.last_seq.0.load(Relaxed)).filter(|&s| s != NO_SEQ)
    }

    pub(crate) fn count_event(&self, kind: EventKind) {
        self.events[kind as usize].fetch_add(1, Relaxed);
    }

    pub(crate) fn reject(&self, kind: RejectKind, n: u64) {
        if n > 0 {
            self.rejected[kind as usize].fetch_add(n, Relaxed);
        }
    }

    pub(crate) fn record_apply(&self, s: &ApplyStats) {
        self.batches.fetch_add(1, Relaxed);
        self.blocks_stored.fetch_add(s.blocks_stored, Relaxed);
        self.blocks_removed.fetch_add(s.blocks_removed, Relaxed);
        self.reject(RejectKind::UnknownParent, s.rejected_unknown_parent);
        self.reject(RejectKind::UnknownHash, s.rejected_unknown_hash);
        self.reject(RejectKind::BadBlock, s.rejected_bad_block);
        self.reject(RejectKind::OverCapacity, s.evicted);
        let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        self.last_event_unix_ms.store(ms, Relaxed);
    }

    pub(crate) fn set_last_seq(&self, seq: u64) {
        self.last_seq.0.store(seq, Relaxed);
    }

    /// Called by the ingest thread after each message it handled (applied or not).
    pub(crate) fn notify_progress(&self) {
        *self.progress.lock() += 1;
        self.progressed.notify_all();
    }

    /// Waits until `cond` holds, re-checking after every handled message. False on timeout.
    pub fn wait_until(&self, timeout: Duration, cond: impl Fn(&IngestStats) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut gen = self.progress.lock();
        loop {
            if cond(self) {
                return true;
            }
            if self.progressed.wait_until(&mut gen, deadline).timed_out() {
                return cond(self);
            }
        }
    }

    /// Waits until a message with sequence number >= `seq` has been handled.
    pub fn wait_for_seq(&self, seq: u64, timeout: Duration) -> bool {
        self.wait_until(timeout, |s| s.last_seq().is_some_and(|l| l >= seq))
    }
}
