//! What the API shows about an engine's KV-event feed, independent of how ingestion counts it.
//! Ingestion implements [`FeedStats`] for its per-engine counters; the registry holds one per
//! engine once ingestion runs.

/// A point-in-time copy of one engine's ingestion counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FeedSnapshot {
    pub batches: u64,
    pub events_stored: u64,
    pub events_removed: u64,
    pub events_cleared: u64,
    pub blocks_stored: u64,
    pub blocks_removed: u64,
    /// Rejections by kind (decode error, unknown parent, unknown hash, bad block, ...).
    pub rejected: Vec<(&'static str, u64)>,
    pub gaps: u64,
    pub gaps_recovered: u64,
    pub replays: u64,
    pub replay_failures: u64,
    pub resets: u64,
    pub last_seq: Option<u64>,
    /// Wall-clock time of the last applied batch (ms since the Unix epoch), if any.
    pub last_event_unix_ms: Option<u64>,
}

pub trait FeedStats: Send + Sync + 'static {
    fn snapshot(&self) -> FeedSnapshot;
}
