//! vLLM KV-event payloads, as ingestion receives them on the ZMQ feed (any peer that can reach
//! the socket can publish): `kvroute_kv::vllm::decode_batch` on arbitrary bytes, then the
//! decoded events applied to the real index, as ingestion does.
//!
//! Oracles beyond "no panic":
//! - the ingest hot path (`decode_batch_into`, reusing the previous batch's buffers) decodes
//!   exactly what `decode_batch` decodes;
//! - the memory index equals the clean-room reference index on the decoded events (apply
//!   statistics, blocks held, prefix matches), on two engines, applied twice, then after one
//!   engine is cleared.
#![no_main]

use kvroute_core::keys::{chain, KeyRoot};
use kvroute_kv::vllm::{decode_batch, decode_batch_into, EventBatch};
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_kv::index::reference::ReferenceIndex;
use kvroute_kv::index::{KvIndex, PrefixMatch};
use kvroute_kv::types::{BlockKey, EngineHash, EngineSlot, KvEvent};
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use std::collections::HashMap;

const MODEL: &str = "m";
const ENGINES: [EngineSlot; 2] = [EngineSlot(0), EngineSlot(1)];

thread_local! {
    /// Reused across inputs, as the ingest worker reuses its batch across payloads.
    static REUSED: RefCell<EventBatch> = RefCell::new(EventBatch::default());
}

fuzz_target!(|data: &[u8]| {
    let fresh = decode_batch(data);
    REUSED.with(|reused| {
        let mut reused = reused.borrow_mut();
        let hot = decode_batch_into(data, &mut reused);
        match (&fresh, &hot) {
            (Ok(a), Ok(())) => {
                assert_eq!(a.ts.to_bits(), reused.ts.to_bits());
                assert_eq!(a.events, reused.events);
                assert_eq!(a.rejected, reused.rejected);
                assert_eq!(a.data_parallel_rank, reused.data_parallel_rank);
            }
            (Err(a), Err(b)) => assert_eq!(a, b),
            _ => panic!("decode_batch {fresh:?} but decode_batch_into {hot:?}"),
        }
    });
    let batch = match fresh {
        Ok(batch) => batch,
        Err(e) => {
            let _ = (e.kind(), e.to_string());
            return;
        }
    };
    for e in &batch.rejected {
        let _ = (e.kind(), e.to_string());
    }
    if batch.events.is_empty() {
        return;
    }
    differential(&batch.events);
});

/// The block size the engine is configured with: the first stored event's when it is small
/// (so short fuzzed events still hold full blocks), else vLLM's default.
fn configured_block_size(events: &[KvEvent]) -> u32 {
    events
        .iter()
        .find_map(|e| match e {
            KvEvent::Stored { block_size, .. } if (1..=64).contains(block_size) => Some(*block_size),
            _ => None,
        })
        .unwrap_or(16)
}

fn differential(events: &[KvEvent]) {
    let block_size = configured_block_size(events);
    let memory = MemoryIndex::new();
    let reference = ReferenceIndex::new();
    let queries = queries(events, block_size);
    for round in 0..2 {
        for engine in ENGINES {
            let a = memory.apply(engine, MODEL, block_size, events);
            let b = reference.apply(engine, MODEL, block_size, events);
            assert_eq!(a, b, "apply stats differ (round {round}, engine {engine:?})\n{events:?}");
        }
        same_view(&memory, &reference, &queries, events);
    }
    memory.clear_engine(ENGINES[0]);
    reference.clear_engine(ENGINES[0]);
    assert_eq!(memory.engine_blocks(ENGINES[0]), 0);
    same_view(&memory, &reference, &queries, events);
}

fn same_view(memory: &MemoryIndex, reference: &ReferenceIndex, queries: &[Vec<BlockKey>], events: &[KvEvent]) {
    for engine in ENGINES {
        assert_eq!(memory.engine_blocks(engine), reference.engine_blocks(engine), "engine_blocks({engine:?})\n{events:?}");
    }
    for q in queries {
        assert_eq!(sorted(memory.match_prefix(q)), sorted(reference.match_prefix(q)), "match_prefix({q:?})\n{events:?}");
    }
}

fn sorted(mut v: Vec<PrefixMatch>) -> Vec<(u32, u32, u32)> {
    v.sort_by_key(|m| m.engine);
    v.into_iter().map(|m| (m.engine.0, m.matched_blocks, m.gpu_blocks)).collect()
}

/// Key chains a request would send for the stored prompts: from the root of the event's LoRA
/// (else the model) and cache salt, or continuing the parent's chain, one key per full block.
/// Only a way to reach held blocks: both indexes answer the same queries, right or wrong.
fn queries(events: &[KvEvent], block_size: u32) -> Vec<Vec<BlockKey>> {
    let mut chains: HashMap<EngineHash, Vec<BlockKey>> = HashMap::new();
    let mut out = vec![Vec::new()];
    for ev in events {
        let KvEvent::Stored { hashes, parent, token_ids, block_size: bs, lora_name, cache_salt, .. } = ev else { continue };
        if *bs != block_size {
            continue;
        }
        let mut prefix = match parent {
            None => vec![],
            Some(p) => match chains.get(p) {
                Some(c) => c.clone(),
                None => continue,
            },
        };
        let root = KeyRoot::new(lora_name.as_deref().unwrap_or(MODEL), cache_salt.as_deref().unwrap_or(""));
        for (hash, block) in hashes.iter().zip(token_ids.chunks_exact(block_size as usize)) {
            let prev = prefix.last().copied().unwrap_or(root.token_root());
            prefix.push(chain(prev, block));
            chains.insert(*hash, prefix.clone());
        }
        if out.len() < 64 {
            // A wrong first key and a prefix that diverges late.
            let mut diverged = prefix.clone();
            if let Some(last) = diverged.last_mut() {
                last.0 ^= 1;
            }
            out.push(prefix);
            out.push(diverged);
        }
    }
    out
}
