//! KV cache events as the engine produces them, before wire encoding (see `events/`).

use crate::ids::EngineHash;

/// Where a block lives: vLLM's `MEDIUM_GPU` / `MEDIUM_CPU` (`kv_events.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Medium {
    #[serde(rename = "GPU")]
    Gpu,
    #[serde(rename = "CPU")]
    Cpu,
}

impl Medium {
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Newly cached full blocks, in prefix order.
    BlockStored {
        block_hashes: Vec<EngineHash>,
        parent_block_hash: Option<EngineHash>,
        /// All tokens of the listed blocks, concatenated (empty in a CPU placeholder).
        token_ids: Vec<u32>,
        /// Tokens per block (0 in a CPU placeholder).
        block_size: u32,
        /// One entry per block: the untagged extra keys (`[salt]` on a salted first block).
        /// GPU events always carry the list; CPU events never do (vLLM leaves it None).
        extra_keys: Option<Vec<Option<Vec<String>>>>,
        medium: Medium,
        /// `kv_cache_spec_kind`: set only by self-describing CPU events (`"full_attention"`).
        kv_cache_spec_kind: Option<&'static str>,
    },
    /// Evicted blocks: one hash per GPU event (vLLM emits one per evicted block); a CPU
    /// event lists every chunk one store allocation evicted.
    BlockRemoved { block_hashes: Vec<EngineHash>, medium: Medium },
    /// Prefix cache reset.
    AllBlocksCleared,
}

impl KvEvent {
    pub fn medium(&self) -> Option<Medium> {
        match self {
            KvEvent::BlockStored { medium, .. } | KvEvent::BlockRemoved { medium, .. } => Some(*medium),
            KvEvent::AllBlocksCleared => None,
        }
    }
}
