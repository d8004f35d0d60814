use super::*;
use crate::types::{EngineHash, Tier};
use rmpv::Value;

fn enc(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).unwrap();
    out
}

fn s(x: &str) -> Value {
    Value::from(x)
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
}

fn batch(events: Vec<Value>, rank: Value) -> Vec<u8> {
    enc(&Value::Array(vec![Value::F64(1.5), Value::Array(events), rank]))
}

fn stored_map(hashes: Vec<Value>, parent: Value, tokens: u32, bs: u32) -> Value {
    map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", Value::Array(hashes)),
        ("parent_block_hash", parent),
        ("token_ids", Value::Array((0..tokens).map(Value::from).collect())),
        ("block_size", Value::from(bs)),
        ("lora_id", Value::Nil),
        ("medium", s("GPU")),
        ("lora_name", Value::Nil),
    ])
}

#[test]
fn map_events_with_big_negative_and_binary_hashes() {
    let big = u64::MAX - 1;
    let mut bin = vec![0xabu8; 24];
    bin.extend_from_slice(&0x8000_0000_0000_0001u64.to_be_bytes());
    let payload = batch(
        vec![
            stored_map(vec![Value::from(big), Value::from(-5i64)], Value::Binary(bin), 32, 16),
            map(vec![("type", s("BlockRemoved")), ("block_hashes", Value::Array(vec![Value::from(7)])), ("medium", s("CPU"))]),
            map(vec![("type", s("AllBlocksCleared"))]),
        ],
        Value::from(3),
    );
    let b = decode_batch(&payload).unwrap();
    assert_eq!(b.ts, 1.5);
    assert_eq!(b.data_parallel_rank, Some(3));
    assert!(b.rejected.is_empty());
    assert_eq!(
        b.events[0],
        KvEvent::Stored {
            hashes: vec![EngineHash(big), EngineHash((-5i64) as u64)],
            parent: Some(EngineHash(0x8000_0000_0000_0001)),
            token_ids: (0..32).collect(),
            block_size: 16,
            lora_name: None,
            cache_salt: None,
            tier: Tier::Gpu,
        }
    );
    assert_eq!(b.events[1], KvEvent::Removed { hashes: vec![EngineHash(7)], tier: Tier::Cpu });
    assert_eq!(b.events[2], KvEvent::AllCleared);
}

#[test]
fn unknown_keys_ignored_defaults_applied_key_order_free() {
    let ev = map(vec![
        ("group_idx", Value::from(0)),
        ("token_ids", Value::Array(vec![Value::from(1), Value::from(2)])),
        ("kv_cache_spec_kind", s("full_attention")),
        ("block_hashes", Value::Array(vec![Value::from(9)])),
        ("type", s("BlockStored")),
        ("block_size", Value::from(2)),
        ("lookahead_token_ids", Value::Array(vec![Value::Array(vec![Value::from(3)])])),
        ("brand_new_field", map(vec![("x", Value::Array(vec![]))])),
    ]);
    // 2-element batch: msgspec omits a None rank; extra trailing elements are ignored too.
    let two = enc(&Value::Array(vec![Value::from(7), Value::Array(vec![ev.clone()])]));
    let b = decode_batch(&two).unwrap();
    assert_eq!(b.data_parallel_rank, None);
    assert_eq!(b.ts, 7.0);
    let KvEvent::Stored { parent, tier, lora_name, .. } = &b.events[0] else { panic!() };
    assert_eq!((*parent, *tier, lora_name.as_deref()), (None, Tier::Gpu, None));
    let extra = enc(&Value::Array(vec![Value::F64(0.0), Value::Array(vec![ev]), Value::Nil, s("future")]));
    assert_eq!(decode_batch(&extra).unwrap().events.len(), 1);
}

#[test]
fn positional_events_are_accepted() {
    let stored = Value::Array(vec![
        s("BlockStored"),
        Value::Array(vec![Value::from(u64::MAX)]),
        Value::from(5),
        Value::Array((0..4).map(Value::from).collect()),
        Value::from(4),
        Value::from(1),
        s("STORAGE"),
        s("ad"),
        Value::Array(vec![Value::Array(vec![s("ad"), s("salty")])]),
    ]);
    let removed = Value::Array(vec![s("BlockRemoved"), Value::Array(vec![Value::from(3)]), Value::Nil]);
    let old = Value::Array(vec![s("BlockStored"), Value::Array(vec![]), Value::Nil, Value::Array(vec![]), Value::from(16)]);
    let b = decode_batch(&batch(vec![stored, removed, old, Value::Array(vec![s("AllBlocksCleared")])], Value::Nil)).unwrap();
    assert!(b.rejected.is_empty(), "{:?}", b.rejected);
    let KvEvent::Stored { hashes, parent, tier, lora_name, cache_salt, .. } = &b.events[0] else { panic!() };
    assert_eq!(hashes, &vec![EngineHash(u64::MAX)]);
    assert_eq!(*parent, Some(EngineHash(5)));
    assert_eq!(*tier, Tier::Storage);
    assert_eq!(lora_name.as_deref(), Some("ad"));
    assert_eq!(cache_salt.as_deref(), Some("salty"));
    assert_eq!(b.events[1], KvEvent::Removed { hashes: vec![EngineHash(3)], tier: Tier::Gpu });
    assert_eq!(b.events[3], KvEvent::AllCleared);
}

#[test]
fn cache_salt_follows_vllm_extra_keys_layout() {
    let with = |lora: Value, extra: Value| {
        let mut ev = stored_map(vec![Value::from(1)], Value::Nil, 16, 16);
        if let Value::Map(m) = &mut ev {
            m.retain(|(k, _)| k.as_str() != Some("lora_name"));
            m.push((s("lora_name"), lora));
            m.push((s("extra_keys"), extra));
        }
        match decode_batch(&batch(vec![ev], Value::Nil)).unwrap().events.remove(0) {
            KvEvent::Stored { cache_salt, .. } => cache_salt,
            _ => panic!(),
        }
    };
    let mm = Value::Array(vec![s("img-hash"), Value::from(0)]);
    // No LoRA: mm pair, then the salt, then an embeds digest.
    let e = Value::Array(vec![Value::Array(vec![mm.clone(), s("salt1"), Value::Binary(vec![1; 32])]), Value::Nil]);
    assert_eq!(with(Value::Nil, e).as_deref(), Some("salt1"));
    // LoRA name comes first and is not the salt.
    let e = Value::Array(vec![Value::Array(vec![s("lora-a"), mm.clone(), s("salt2")])]);
    assert_eq!(with(s("lora-a"), e).as_deref(), Some("salt2"));
    let e = Value::Array(vec![Value::Array(vec![s("lora-a")])]);
    assert_eq!(with(s("lora-a"), e), None);
    // Only the first block's entry counts; nil entries and nil lists mean no salt.
    let e = Value::Array(vec![Value::Nil, Value::Array(vec![s("late")])]);
    assert_eq!(with(Value::Nil, e), None);
    assert_eq!(with(Value::Nil, Value::Nil), None);
}

#[test]
fn a_bad_event_is_skipped_and_the_rest_applied() {
    let bad_type = map(vec![("type", s("BlockMoved"))]);
    let no_type = map(vec![("block_hashes", Value::Array(vec![]))]);
    let short_hash = map(vec![("type", s("BlockRemoved")), ("block_hashes", Value::Array(vec![Value::Binary(vec![1, 2])]))]);
    let bad_token = stored_map(vec![Value::from(1)], Value::Nil, 0, 1);
    let bad_token = match bad_token {
        Value::Map(mut m) => {
            m[3].1 = Value::Array(vec![Value::from(-1)]);
            Value::Map(m)
        }
        _ => unreachable!(),
    };
    let no_field = map(vec![("type", s("BlockStored")), ("block_hashes", Value::Array(vec![]))]);
    let bad_medium = map(vec![("type", s("BlockRemoved")), ("block_hashes", Value::Array(vec![])), ("medium", s("TAPE"))]);
    let not_an_event = Value::from(42);
    let good = map(vec![("type", s("AllBlocksCleared"))]);
    let b = decode_batch(&batch(
        vec![bad_type, no_type, short_hash, bad_token, no_field, bad_medium, not_an_event, good],
        Value::from(0),
    ))
    .unwrap();
    assert_eq!(b.events, vec![KvEvent::AllCleared]);
    let kinds: Vec<_> = b.rejected.iter().map(|e| e.kind()).collect();
    assert_eq!(
        kinds,
        ["unknown_event_type", "missing_type", "bad_hash", "bad_token_id", "missing_field", "unknown_medium", "unexpected_type"]
    );
    assert_eq!(b.data_parallel_rank, Some(0));
}

#[test]
fn broken_batches_are_typed_errors() {
    let good = batch(vec![map(vec![("type", s("AllBlocksCleared"))])], Value::from(0));
    for cut in 0..good.len() {
        assert!(decode_batch(&good[..cut]).is_err(), "cut at {cut}");
    }
    assert_eq!(decode_batch(&[0xc1]).unwrap_err().kind(), "unexpected_type");
    assert_eq!(decode_batch(&enc(&Value::Array(vec![Value::F64(1.0)]))).unwrap_err().kind(), "bad_batch");
    assert_eq!(decode_batch(&enc(&Value::Array(vec![s("x"), Value::Array(vec![])]))).unwrap_err().kind(), "unexpected_type");
}

/// Bytes vLLM 0.33.0's publisher actually wrote (tests/conformance/README.md, BlockRemoved of
/// hash 2^63+1 with group_idx, rank 0): no re-encoding in between.
#[test]
fn decodes_real_vllm_bytes() {
    let hex = "93cb41d954fc4080000091 84a474797065ac426c6f636b52656d6f766564 ac626c6f636b5f686173686573 91cf8000000000000001 a66d656469756d a3475055 a967726f75705f696478 00 00";
    let bytes: Vec<u8> = hex
        .split_whitespace()
        .collect::<String>()
        .as_bytes()
        .chunks(2)
        .map(|c| u8::from_str_radix(std::str::from_utf8(c).unwrap(), 16).unwrap())
        .collect();
    let b = decode_batch(&bytes).unwrap();
    assert_eq!(b.events, vec![KvEvent::Removed { hashes: vec![EngineHash(0x8000_0000_0000_0001)], tier: Tier::Gpu }]);
    assert_eq!(b.data_parallel_rank, Some(0));
}

#[test]
fn decode_into_reuses_buffers() {
    let mut out = EventBatch::default();
    let p = batch(vec![map(vec![("type", s("AllBlocksCleared"))])], Value::from(1));
    decode_batch_into(&p, &mut out).unwrap();
    decode_batch_into(&p, &mut out).unwrap();
    assert_eq!(out.events.len(), 1);
}
