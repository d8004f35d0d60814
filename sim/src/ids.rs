//! Newtypes for the identifiers that cross module boundaries, so a block id can never be
//! passed where an engine hash is expected.

use std::fmt;

/// vLLM's external block hash: the last 8 bytes of the block digest, big-endian. This is
/// the value published in `BlockStored` / `BlockRemoved` events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct EngineHash(pub u64);

/// Full 32-byte sha256 digest of a block (what vLLM chains from block to block).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockDigest(pub [u8; 32]);

impl BlockDigest {
    /// The event value: last 8 bytes big-endian (`maybe_convert_block_hash`).
    pub fn engine_hash(&self) -> EngineHash {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[24..]);
        EngineHash(u64::from_be_bytes(b))
    }
}

impl fmt::Debug for BlockDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockDigest({:016x})", self.engine_hash().0)
    }
}

/// Index of a physical KV block inside one engine's pool. Block 0 is vLLM's null block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockId(pub u32);

/// Engine-local request id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Index of a simulated worker inside one `kvroute-sim` process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct WorkerId(pub u32);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
