//! Identity and event types shared by every module of the state service.
//!
//! Ids and hashes are newtypes so a worker index, an engine hash and a kvroute block key can
//! never be mixed up across a module boundary.

use std::fmt;
use std::sync::Arc;

pub use kvroute_core::BlockKey;

/// A worker as configured (one vLLM server, one routable address).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub Arc<str>);

impl WorkerId {
    pub fn new(id: &str) -> Self {
        WorkerId(Arc::from(id))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Workers by small index, for tables with an entry per key (speculative credit, learned
/// routes): a `u32` per entry instead of a `WorkerId`. A released slot is reused, so worker
/// churn does not grow the table; release a worker only once no entry refers to it.
#[derive(Debug, Default)]
pub struct WorkerSlots {
    slots: Vec<Option<WorkerId>>,
}

impl WorkerSlots {
    pub fn find(&self, worker: &WorkerId) -> Option<u32> {
        self.slots.iter().position(|w| w.as_ref() == Some(worker)).map(|i| i as u32)
    }

    pub fn intern(&mut self, worker: &WorkerId) -> u32 {
        if let Some(i) = self.find(worker) {
            return i;
        }
        match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = Some(worker.clone());
                i as u32
            }
            None => {
                self.slots.push(Some(worker.clone()));
                (self.slots.len() - 1) as u32
            }
        }
    }

    pub fn release(&mut self, slot: u32) {
        if let Some(w) = self.slots.get_mut(slot as usize) {
            *w = None;
        }
    }

    /// Slots in use or free: the length of a per-slot table.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// `(worker, count)` for every slot whose count in `per_slot` is not zero.
    pub fn named(&self, per_slot: Vec<u32>) -> Vec<(WorkerId, u32)> {
        self.slots.iter().zip(per_slot).filter_map(|(w, n)| Some((w.clone()?, n)).filter(|_| n > 0)).collect()
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One engine = one (worker, data-parallel rank): the unit that publishes events and owns a
/// KV cache. Engines are numbered densely by the registry so the index can store a `u32`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineSlot(pub u32);

/// vLLM's own block hash (the low 8 bytes of its digest). Only meaningful per engine.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineHash(pub u64);

/// Where a cached block lives (vLLM's `medium`; `None` means GPU).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Tier {
    #[default]
    Gpu,
    Cpu,
    Storage,
}

/// One decoded vLLM KV-cache event, independent of its wire encoding.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    /// `token_ids` holds the tokens of all listed blocks, concatenated.
    Stored {
        hashes: Vec<EngineHash>,
        parent: Option<EngineHash>,
        token_ids: Vec<u32>,
        block_size: u32,
        lora_name: Option<String>,
        /// The request's `cache_salt` when vLLM put it in the first block's `extra_keys`.
        cache_salt: Option<String>,
        tier: Tier,
    },
    Removed { hashes: Vec<EngineHash>, tier: Tier },
    AllCleared,
}
