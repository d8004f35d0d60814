//! msgpack encoding that mirrors msgspec's encoding of vLLM's event classes.
//!
//! `KVEventBatch` is `array_like`: `[ts: float64, events, data_parallel_rank]` (the rank is
//! always set by the publisher, so it is never an omitted trailing default). Each event is a
//! tagged struct with `omit_defaults=True`: a map whose first key is `"type"`, followed by
//! the fields in declaration order; fields without a default (`block_hashes`,
//! `parent_block_hash`, `token_ids`, `block_size`, `lora_id`, `medium`, `lora_name`) are
//! always present, defaulted ones only when not None. vLLM always sets `group_idx` (0); GPU
//! events always carry `extra_keys` (one entry per block, None when the block has none).
//! CPU-tier events (the offloading connector's, `offloading/events.py`) carry `medium: "CPU"`
//! and no `extra_keys`; a self-describing one adds `kv_cache_spec_kind`.
//! Golden bytes in the tests come from msgspec itself with the same Struct options (the CPU
//! ones from vLLM 0.33's own `kv_events.py` classes).
//! `Legacy` is the pre-0.26 positional form `["BlockStored", hashes, parent, tokens,
//! block_size, lora_id, medium, lora_name]`.

use crate::engine::KvEvent;
use rmp::encode as mp;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EventEncoding {
    #[default]
    Map,
    Legacy,
}

/// Encode one batch payload (the third ZMQ frame).
pub fn encode_batch(ts: f64, events: &[KvEvent], dp_rank: u32, enc: EventEncoding) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 64);
    // Writes into a Vec cannot fail; the Results are infallible here.
    let _ = mp::write_array_len(&mut out, 3);
    let _ = mp::write_f64(&mut out, ts);
    let _ = mp::write_array_len(&mut out, events.len() as u32);
    for ev in events {
        match enc {
            EventEncoding::Map => write_map_event(&mut out, ev),
            EventEncoding::Legacy => write_legacy_event(&mut out, ev),
        }
    }
    let _ = mp::write_uint(&mut out, u64::from(dp_rank));
    out
}

fn s(out: &mut Vec<u8>, v: &str) {
    let _ = mp::write_str(out, v);
}

fn uints(out: &mut Vec<u8>, vals: impl ExactSizeIterator<Item = u64>) {
    let _ = mp::write_array_len(out, vals.len() as u32);
    for v in vals {
        let _ = mp::write_uint(out, v);
    }
}

fn opt_uint(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => {
            let _ = mp::write_uint(out, v);
        }
        None => {
            let _ = mp::write_nil(out);
        }
    }
}

fn write_map_event(out: &mut Vec<u8>, ev: &KvEvent) {
    match ev {
        KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size, extra_keys, medium, kv_cache_spec_kind } => {
            // msgspec reserves a map16 header when a struct has more than 15 possible
            // fields (BlockStored has 15 + the tag), even if fewer are written.
            let n = 9 + u8::from(extra_keys.is_some()) + u8::from(kv_cache_spec_kind.is_some());
            out.extend_from_slice(&[0xde, 0x00, n]);
            s(out, "type");
            s(out, "BlockStored");
            s(out, "block_hashes");
            uints(out, block_hashes.iter().map(|h| h.0));
            s(out, "parent_block_hash");
            opt_uint(out, parent_block_hash.map(|h| h.0));
            s(out, "token_ids");
            uints(out, token_ids.iter().map(|&t| u64::from(t)));
            s(out, "block_size");
            let _ = mp::write_uint(out, u64::from(*block_size));
            s(out, "lora_id");
            let _ = mp::write_nil(out);
            s(out, "medium");
            s(out, medium.as_str());
            s(out, "lora_name");
            let _ = mp::write_nil(out);
            if let Some(extra_keys) = extra_keys {
                s(out, "extra_keys");
                let _ = mp::write_array_len(out, extra_keys.len() as u32);
                for keys in extra_keys {
                    match keys {
                        None => {
                            let _ = mp::write_nil(out);
                        }
                        Some(keys) => {
                            let _ = mp::write_array_len(out, keys.len() as u32);
                            keys.iter().for_each(|k| s(out, k));
                        }
                    }
                }
            }
            s(out, "group_idx");
            let _ = mp::write_uint(out, 0);
            if let Some(kind) = kv_cache_spec_kind {
                s(out, "kv_cache_spec_kind");
                s(out, kind);
            }
        }
        KvEvent::BlockRemoved { block_hashes, medium } => {
            let _ = mp::write_map_len(out, 4);
            s(out, "type");
            s(out, "BlockRemoved");
            s(out, "block_hashes");
            uints(out, block_hashes.iter().map(|h| h.0));
            s(out, "medium");
            s(out, medium.as_str());
            s(out, "group_idx");
            let _ = mp::write_uint(out, 0);
        }
        KvEvent::AllBlocksCleared => {
            let _ = mp::write_map_len(out, 1);
            s(out, "type");
            s(out, "AllBlocksCleared");
        }
    }
}

fn write_legacy_event(out: &mut Vec<u8>, ev: &KvEvent) {
    match ev {
        KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size, medium, .. } => {
            let _ = mp::write_array_len(out, 8);
            s(out, "BlockStored");
            uints(out, block_hashes.iter().map(|h| h.0));
            opt_uint(out, parent_block_hash.map(|h| h.0));
            uints(out, token_ids.iter().map(|&t| u64::from(t)));
            let _ = mp::write_uint(out, u64::from(*block_size));
            let _ = mp::write_nil(out);
            s(out, medium.as_str());
            let _ = mp::write_nil(out);
        }
        KvEvent::BlockRemoved { block_hashes, medium } => {
            let _ = mp::write_array_len(out, 3);
            s(out, "BlockRemoved");
            uints(out, block_hashes.iter().map(|h| h.0));
            s(out, medium.as_str());
        }
        KvEvent::AllBlocksCleared => {
            let _ = mp::write_array_len(out, 1);
            s(out, "AllBlocksCleared");
        }
    }
}

#[cfg(test)]
mod tests;
