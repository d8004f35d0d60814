//! A bounded engine ([`crate::index::KvIndex::set_capacity`]): dropping a block in every
//! tier, and the oldest blocks past the engine's capacity.

use super::{gslot, EngineMap, MemoryIndex, GPU};
use crate::types::EngineSlot;

impl MemoryIndex {
    /// Forgets the block at `pos` in every tier.
    pub(super) fn drop_block(&self, engine: EngineSlot, e: &mut EngineMap, pos: u32) {
        let block = e.blocks.block(pos);
        e.blocks.remove(pos);
        if block & GPU == 0 {
            // Before the release: the slot (and so the key) may go with it.
            let key = self.key_of(block);
            e.warm(key);
        }
        self.unhold(engine, &mut e.extra_refs, gslot(block));
    }

    /// Drops `e`'s oldest blocks until it holds no more than its capacity; how many.
    pub(super) fn enforce_capacity(&self, engine: EngineSlot, e: &mut EngineMap) -> u64 {
        let Some(cap) = e.capacity else { return 0 };
        let mut evicted = 0;
        while e.blocks.len() > cap {
            let Some(hash) = e.order.pop_front() else { break };
            if let Some(pos) = e.blocks.get(hash) {
                self.drop_block(engine, e, pos);
                evicted += 1;
            }
        }
        // Hashes removed by the engine linger in the order until popped: compact when they
        // outnumber the blocks held.
        if e.order.len() > 2 * e.blocks.len() + 1024 {
            let blocks = &e.blocks;
            e.order.retain(|h| blocks.get(*h).is_some());
        }
        evicted
    }
}
