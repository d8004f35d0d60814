//! Golden vectors produced by msgspec with the Struct options of vLLM 0.33's
//! `kv_events.py` (array_like batch; tagged, omit_defaults events).

use super::*;
use crate::engine::event::Medium;
use crate::ids::EngineHash;

const BIG: u64 = u64::MAX - 5;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn sample(with_keys: bool) -> Vec<KvEvent> {
    let keys = |k: Vec<Option<Vec<String>>>| Some(if with_keys { k } else { Vec::new() });
    vec![
        KvEvent::BlockStored {
            block_hashes: vec![EngineHash(1), EngineHash(BIG)],
            parent_block_hash: None,
            token_ids: vec![0, 1, 2, 70000],
            block_size: 2,
            extra_keys: keys(vec![Some(vec!["salt".into()]), None]),
            medium: Medium::Gpu,
            kv_cache_spec_kind: None,
        },
        KvEvent::BlockStored {
            block_hashes: vec![EngineHash(300)],
            parent_block_hash: Some(EngineHash(BIG)),
            token_ids: vec![1, 2],
            block_size: 2,
            extra_keys: keys(vec![None]),
            medium: Medium::Gpu,
            kv_cache_spec_kind: None,
        },
        KvEvent::BlockRemoved { block_hashes: vec![EngineHash(BIG)], medium: Medium::Gpu },
        KvEvent::AllBlocksCleared,
    ]
}

#[test]
fn map_encoding_matches_msgspec() {
    let got = encode_batch(1234.5, &sample(true), 0, EventEncoding::Map);
    assert_eq!(hex(&got), "93cb40934a000000000094de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739201cffffffffffffffffab1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647394000102ce00011170aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579739291a473616c74c0a967726f75705f69647800de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cd012cb1706172656e745f626c6f636b5f68617368cffffffffffffffffaa9746f6b656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f6964780084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cffffffffffffffffaa66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400");
}

#[test]
fn legacy_encoding_matches_msgspec() {
    let mut evs = sample(false);
    evs.remove(1);
    let got = encode_batch(1234.5, &evs, 0, EventEncoding::Legacy);
    assert_eq!(hex(&got), "93cb40934a00000000009398ab426c6f636b53746f7265649201cffffffffffffffffac094000102ce0001117002c0a3475055c093ac426c6f636b52656d6f76656491cffffffffffffffffaa347505591b0416c6c426c6f636b73436c656172656400");
}

/// The CPU tier's events, as `OffloadingEventsTracker` builds them: a placeholder
/// `BlockStored` (the default: one hash, no parent, no tokens, block_size 0, no extra keys),
/// a `BlockRemoved` listing every evicted chunk, and a self-describing `BlockStored`
/// (`self_describing_kv_events`). Golden bytes from msgspec with vLLM 0.33's own
/// `kv_events.py` classes.
#[test]
fn cpu_tier_events_match_vllm() {
    let evs = vec![
        KvEvent::BlockStored {
            block_hashes: vec![EngineHash(BIG)],
            parent_block_hash: None,
            token_ids: Vec::new(),
            block_size: 0,
            extra_keys: None,
            medium: Medium::Cpu,
            kv_cache_spec_kind: None,
        },
        KvEvent::BlockRemoved { block_hashes: vec![EngineHash(1), EngineHash(BIG)], medium: Medium::Cpu },
        KvEvent::BlockStored {
            block_hashes: vec![EngineHash(300)],
            parent_block_hash: Some(EngineHash(BIG)),
            token_ids: vec![1, 2],
            block_size: 2,
            extra_keys: None,
            medium: Medium::Cpu,
            kv_cache_spec_kind: Some("full_attention"),
        },
    ];
    let got = encode_batch(1234.5, &evs, 0, EventEncoding::Map);
    assert_eq!(hex(&got), "93cb40934a000000000093de0009a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cffffffffffffffffab1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a6500a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0a967726f75705f6964780084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739201cffffffffffffffffaa66d656469756da3435055a967726f75705f69647800de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cd012cb1706172656e745f626c6f636b5f68617368cffffffffffffffffaa9746f6b656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00");
}
