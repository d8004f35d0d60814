//! A deliberately naive reference model of [`KvIndex`], for tests only.
//!
//! Written from the trait's contract, not from any implementation: one ordered set of
//! `(engine, engine hash, tier) -> kvroute key` facts, keys computed block by block with
//! `chain` from the parent's recorded key, lookups by scanning everything. Slow and obviously
//! right; the differential test (`tests/index_differential.rs`) holds every real index to it.
//!
//! Semantics pinned here (and in the trait docs):
//! - a store of a hash the engine already holds (any tier) keeps its key and adds the tier;
//! - a stored block whose parent hash the engine does not hold: the whole event is skipped,
//!   counted once in `rejected_unknown_parent`;
//! - event `block_size` != configured: every listed block counts in `rejected_bad_block`;
//!   hashes without a full block of tokens likewise;
//! - removing a (hash, tier) not held counts one `rejected_unknown_hash`;
//! - a store without tokens (vLLM's offloading-connector placeholder: one hash, no parent,
//!   block size 0) adds its tier to a block the engine holds; a hash it does not hold counts
//!   one `rejected_unknown_hash` (no key can be computed for it);
//! - an engine holds a key while any of its (hash, tier) facts maps to it, and holds it on
//!   the GPU while any of its GPU facts does.

pub mod differential;

use super::{ApplyStats, KvIndex, PrefixMatch};
use crate::types::{BlockKey, EngineHash, EngineSlot, KvEvent, Tier};
use kvroute_core::keys::{chain, KeyRoot};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Default)]
pub struct ReferenceIndex {
    facts: Mutex<BTreeMap<(EngineSlot, EngineHash, Tier), BlockKey>>,
}

impl ReferenceIndex {
    pub fn new() -> Self {
        Self::default()
    }
}

type Facts = BTreeMap<(EngineSlot, EngineHash, Tier), BlockKey>;

fn key_of(facts: &Facts, engine: EngineSlot, hash: EngineHash) -> Option<BlockKey> {
    [Tier::Gpu, Tier::Cpu, Tier::Storage].iter().find_map(|t| facts.get(&(engine, hash, *t)).copied())
}

fn clear(facts: &mut Facts, engine: EngineSlot) {
    facts.retain(|(e, _, _), _| *e != engine);
}

impl KvIndex for ReferenceIndex {
    fn apply(&self, engine: EngineSlot, model: &str, block_size: u32, events: &[KvEvent]) -> ApplyStats {
        let mut facts = self.facts.lock();
        let mut stats = ApplyStats::default();
        for ev in events {
            match ev {
                KvEvent::AllCleared => {
                    stats.clears += 1;
                    clear(&mut facts, engine);
                }
                KvEvent::Removed { hashes, tier } => {
                    for h in hashes {
                        match facts.remove(&(engine, *h, *tier)) {
                            Some(_) => stats.blocks_removed += 1,
                            None => stats.rejected_unknown_hash += 1,
                        }
                    }
                }
                KvEvent::Stored { hashes, token_ids, tier, .. } if token_ids.is_empty() => {
                    // A placeholder (vLLM's offloading connector): the block keeps its key and
                    // gains the tier; a block the engine does not hold cannot be keyed.
                    for h in hashes {
                        match key_of(&facts, engine, *h) {
                            Some(key) => {
                                facts.insert((engine, *h, *tier), key);
                                stats.blocks_stored += 1;
                            }
                            None => stats.rejected_unknown_hash += 1,
                        }
                    }
                }
                KvEvent::Stored { hashes, parent, token_ids, block_size: bs, lora_name, cache_salt, tier } => {
                    if *bs != block_size || block_size == 0 {
                        stats.rejected_bad_block += hashes.len() as u64;
                        continue;
                    }
                    let mut prev = match parent {
                        None => {
                            let root_model = lora_name.as_deref().unwrap_or(model);
                            KeyRoot::new(root_model, cache_salt.as_deref().unwrap_or("")).token_root()
                        }
                        Some(p) => match key_of(&facts, engine, *p) {
                            Some(k) => k,
                            None => {
                                stats.rejected_unknown_parent += 1;
                                continue;
                            }
                        },
                    };
                    let bs = block_size as usize;
                    for (i, h) in hashes.iter().enumerate() {
                        let Some(block) = token_ids.get(i * bs..(i + 1) * bs) else {
                            stats.rejected_bad_block += 1;
                            continue;
                        };
                        prev = chain(prev, block);
                        let key = key_of(&facts, engine, *h).unwrap_or(prev);
                        facts.insert((engine, *h, *tier), key);
                        stats.blocks_stored += 1;
                    }
                }
            }
        }
        stats
    }

    fn clear_engine(&self, engine: EngineSlot) {
        clear(&mut self.facts.lock(), engine);
    }

    fn match_prefix(&self, keys: &[BlockKey]) -> Vec<PrefixMatch> {
        let facts = self.facts.lock();
        let mut held: BTreeMap<EngineSlot, (BTreeSet<BlockKey>, BTreeSet<BlockKey>)> = BTreeMap::new();
        for ((e, _, tier), k) in facts.iter() {
            let (any, gpu) = held.entry(*e).or_default();
            any.insert(*k);
            if *tier == Tier::Gpu {
                gpu.insert(*k);
            }
        }
        held.into_iter()
            .map(|(engine, (any, gpu))| PrefixMatch {
                engine,
                matched_blocks: keys.iter().take_while(|k| any.contains(k)).count() as u32,
                gpu_blocks: keys.iter().take_while(|k| gpu.contains(k)).count() as u32,
            })
            .filter(|m| m.matched_blocks > 0)
            .collect()
    }

    fn engine_blocks(&self, engine: EngineSlot) -> usize {
        let facts = self.facts.lock();
        facts.keys().filter(|(e, _, _)| *e == engine).map(|(_, h, _)| *h).collect::<BTreeSet<_>>().len()
    }
}
