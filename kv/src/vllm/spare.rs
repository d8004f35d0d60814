//! Buffers kept from one batch's events for the next batch to decode into.
//!
//! `decode_batch_into` is called once per payload with the same [`super::EventBatch`]; the
//! block-hash and token-id lists of the events it held are kept here (cleared) and reused,
//! so a steady stream of batches allocates nothing per event. Bounded: at most
//! [`MAX_KEPT`] lists of each kind, none larger than [`MAX_ELEMS`] elements, so one huge
//! event does not pin its buffer for the life of the feed.

use crate::types::{EngineHash, KvEvent};

const MAX_KEPT: usize = 256;
const MAX_ELEMS: usize = 1 << 14;

#[derive(Default)]
pub(crate) struct Spare {
    hashes: Vec<Vec<EngineHash>>,
    tokens: Vec<Vec<u32>>,
}

impl Spare {
    /// Takes `events`' lists (leaving `events` empty).
    pub(crate) fn recycle(&mut self, events: &mut Vec<KvEvent>) {
        for ev in events.drain(..) {
            match ev {
                KvEvent::Stored { hashes, token_ids, .. } => {
                    keep(&mut self.hashes, hashes);
                    keep(&mut self.tokens, token_ids);
                }
                KvEvent::Removed { hashes, .. } => keep(&mut self.hashes, hashes),
                KvEvent::AllCleared => {}
            }
        }
    }

    /// An empty hash list (a kept one when there is one).
    pub(crate) fn hashes(&mut self) -> Vec<EngineHash> {
        self.hashes.pop().unwrap_or_default()
    }

    /// An empty token list (a kept one when there is one).
    pub(crate) fn tokens(&mut self) -> Vec<u32> {
        self.tokens.pop().unwrap_or_default()
    }
}

fn keep<T>(pool: &mut Vec<Vec<T>>, mut v: Vec<T>) {
    if pool.len() < MAX_KEPT && v.capacity() <= MAX_ELEMS && v.capacity() > 0 {
        v.clear();
        pool.push(v);
    }
}

/// Buffers are not part of a batch's value: a batch equals, and clones as, its decoded
/// contents alone.
impl PartialEq for Spare {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Clone for Spare {
    fn clone(&self) -> Self {
        Spare::default()
    }
}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spare").field("hashes", &self.hashes.len()).field("tokens", &self.tokens.len()).finish()
    }
}
