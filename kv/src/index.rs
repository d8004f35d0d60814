//! The KV index: which engine holds which kvroute block keys.
//!
//! Behind a trait so the memory index and the Redis store's mirrored index answer the
//! same questions; a clean-room reference model and a seeded differential test keep every
//! implementation honest.
//!
//! Invariants every implementation keeps:
//! - applying an event twice has the effect of applying it once (vLLM repeats stores and
//!   removes unknown hashes);
//! - a stored block whose parent the engine does not hold (unknown engine hash) is not
//!   indexed, and is counted, because its kvroute key cannot be computed;
//! - `clear_engine` forgets everything of that engine, including its engine-hash map.

pub mod memory;
pub mod reference;

use crate::types::{BlockKey, EngineSlot, KvEvent};

/// What applying a batch did, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyStats {
    pub blocks_stored: u64,
    pub blocks_removed: u64,
    pub clears: u64,
    /// Events (or blocks) skipped: unknown parent, removal of an unknown hash, bad block size.
    pub rejected_unknown_parent: u64,
    pub rejected_unknown_hash: u64,
    pub rejected_bad_block: u64,
    /// Blocks dropped, oldest first, because the engine held more than its capacity
    /// ([`KvIndex::set_capacity`]): an engine reporting more blocks than it has.
    pub evicted: u64,
}

/// How many leading keys of a request one engine holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixMatch {
    pub engine: EngineSlot,
    /// Leading keys held in any tier (GPU, CPU, storage).
    pub matched_blocks: u32,
    /// Of those, the leading keys held on the GPU: vLLM's prefix cache hits; the rest up to
    /// `matched_blocks` would be loaded from the offloading tier (at reload cost) rather
    /// than recomputed. `gpu_blocks <= matched_blocks`.
    pub gpu_blocks: u32,
}

pub trait KvIndex: Send + Sync + 'static {
    /// Applies one batch of events from `engine`. `model` and `block_size` come from the
    /// engine's configuration: they fix the key root (with the event's LoRA name) and which
    /// blocks are full.
    fn apply(&self, engine: EngineSlot, model: &str, block_size: u32, events: &[KvEvent]) -> ApplyStats;

    /// Forgets every block of `engine` (engine restart, sequence reset, AllBlocksCleared).
    fn clear_engine(&self, engine: EngineSlot);

    /// For every engine holding at least the first key, how many leading `keys` it holds in
    /// any tier, and how many of those leading keys on its GPU. Order unspecified.
    fn match_prefix(&self, keys: &[BlockKey]) -> Vec<PrefixMatch>;

    /// Number of blocks `engine` holds.
    fn engine_blocks(&self, engine: EngineSlot) -> usize;

    /// Bounds what `engine` may hold (`None`: unbounded, the default). Past it, its oldest
    /// stored blocks are dropped (counted in [`ApplyStats::evicted`]); lowering it drops them
    /// at once. Returns how many were dropped now.
    fn set_capacity(&self, engine: EngineSlot, blocks: Option<usize>) -> u64 {
        let _ = (engine, blocks);
        0
    }
}
