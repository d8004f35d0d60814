//! KV cache events as the engine produces them, before wire encoding (see `events/`).

use crate::ids::EngineHash;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Newly cached full blocks of one request, in prefix order.
    BlockStored {
        block_hashes: Vec<EngineHash>,
        parent_block_hash: Option<EngineHash>,
        /// All tokens of the listed blocks, concatenated.
        token_ids: Vec<u32>,
        block_size: u32,
        /// One entry per block: the untagged extra keys (`[salt]` on a salted first block).
        extra_keys: Vec<Option<Vec<String>>>,
    },
    /// One evicted block (vLLM emits one event per evicted hash).
    BlockRemoved { block_hashes: Vec<EngineHash> },
    /// Prefix cache reset.
    AllBlocksCleared,
}
