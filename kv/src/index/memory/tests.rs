use super::*;
use kvroute_core::keys::token_block_keys;

const M: &str = "m";

fn stored(hashes: &[u64], parent: Option<u64>, tokens: std::ops::Range<u32>, tier: Tier) -> KvEvent {
    KvEvent::Stored {
        hashes: hashes.iter().map(|&h| EngineHash(h)).collect(),
        parent: parent.map(EngineHash),
        token_ids: tokens.collect(),
        block_size: 4,
        lora_name: None,
        cache_salt: None,
        tier,
    }
}

fn keys(n: u32) -> Vec<BlockKey> {
    token_block_keys(&KeyRoot::new(M, ""), &(0..n).collect::<Vec<_>>(), 4)
}

fn matches(idx: &MemoryIndex, keys: &[BlockKey]) -> Vec<(u32, u32)> {
    let mut v: Vec<_> = idx.match_prefix(keys).into_iter().map(|m| (m.engine.0, m.matched_blocks)).collect();
    v.sort();
    v
}

#[test]
fn chains_across_events_and_engines() {
    let idx = MemoryIndex::new();
    let e0 = EngineSlot(0);
    let e1 = EngineSlot(200);
    let big = u64::MAX - 3;
    idx.apply(e0, M, 4, &[stored(&[big, 2], None, 0..8, Tier::Gpu)]);
    let s = idx.apply(e0, M, 4, &[stored(&[3], Some(2), 8..12, Tier::Gpu)]);
    assert_eq!(s.blocks_stored, 1);
    idx.apply(e1, M, 4, &[stored(&[9], None, 0..4, Tier::Cpu)]);
    assert_eq!(matches(&idx, &keys(16)), vec![(0, 3), (200, 1)]);
    assert_eq!(matches(&idx, &keys(12)), vec![(0, 3), (200, 1)]);
    assert_eq!(matches(&idx, &keys(16)[1..]), vec![(0, 2)]);
    assert!(idx.match_prefix(&[]).is_empty());
    assert_eq!(idx.engine_blocks(e0), 3);
    assert_eq!(idx.distinct_keys(), 3);
}

#[test]
fn tiers_unknowns_partials_and_clears() {
    let idx = MemoryIndex::new();
    let e = EngineSlot(5);
    idx.apply(e, M, 4, &[stored(&[1, 2], None, 0..8, Tier::Gpu), stored(&[2], Some(1), 4..8, Tier::Cpu)]);
    let s = idx.apply(e, M, 4, &[KvEvent::Removed { hashes: vec![EngineHash(2), EngineHash(77)], tier: Tier::Gpu }]);
    assert_eq!((s.blocks_removed, s.rejected_unknown_hash), (1, 1));
    assert_eq!(matches(&idx, &keys(8)), vec![(5, 2)], "still held on CPU");
    idx.apply(e, M, 4, &[KvEvent::Removed { hashes: vec![EngineHash(2)], tier: Tier::Cpu }]);
    assert_eq!(matches(&idx, &keys(8)), vec![(5, 1)]);

    let s = idx.apply(e, M, 4, &[stored(&[3], Some(99), 4..8, Tier::Gpu)]);
    assert_eq!(s.rejected_unknown_parent, 1);
    // Two hashes, tokens for one and a half blocks: key the full one only.
    let s = idx.apply(e, M, 4, &[stored(&[2, 3], Some(1), 4..10, Tier::Gpu)]);
    assert_eq!((s.blocks_stored, s.rejected_bad_block), (1, 1));
    // vLLM's partial-block event: block_size smaller than configured.
    let partial = KvEvent::Stored {
        hashes: vec![EngineHash(4)],
        parent: Some(EngineHash(2)),
        token_ids: vec![1, 2],
        block_size: 2,
        lora_name: None,
        cache_salt: None,
        tier: Tier::Gpu,
    };
    assert_eq!(idx.apply(e, M, 4, &[partial]).rejected_bad_block, 1);
    assert_eq!(idx.engine_blocks(e), 2);
    let s = idx.apply(e, M, 4, &[KvEvent::AllCleared]);
    assert_eq!(s.clears, 1);
    assert_eq!(idx.engine_blocks(e), 0);
    assert!(idx.match_prefix(&keys(8)).is_empty());
    assert_eq!(idx.distinct_keys(), 0);
}

#[test]
fn lora_and_salt_select_the_root() {
    let idx = MemoryIndex::new();
    let ev = KvEvent::Stored {
        hashes: vec![EngineHash(1)],
        parent: None,
        token_ids: vec![0, 1, 2, 3],
        block_size: 4,
        lora_name: Some("sql".into()),
        cache_salt: Some("tenant".into()),
        tier: Tier::Gpu,
    };
    idx.apply(EngineSlot(0), M, 4, &[ev]);
    let want = token_block_keys(&KeyRoot::new("sql", "tenant"), &[0, 1, 2, 3], 4);
    assert_eq!(matches(&idx, &want), vec![(0, 1)]);
    assert!(idx.match_prefix(&keys(4)).is_empty());
}

#[test]
fn clear_engine_leaves_other_engines() {
    let idx = MemoryIndex::new();
    idx.apply(EngineSlot(0), M, 4, &[stored(&[1], None, 0..4, Tier::Gpu)]);
    idx.apply(EngineSlot(1), M, 4, &[stored(&[1], None, 0..4, Tier::Gpu)]);
    idx.clear_engine(EngineSlot(0));
    idx.clear_engine(EngineSlot(9));
    assert_eq!(matches(&idx, &keys(4)), vec![(1, 1)]);
}

#[test]
fn equals_reference_on_random_streams() {
    let make = || Box::new(MemoryIndex::new()) as Box<dyn KvIndex>;
    if let Err(e) = crate::index::reference::differential::check(&make, 0..8, 150) {
        panic!("{e}");
    }
    // The full run (many seeds, coverage asserted) is tests/index_differential.rs.
}

#[test]
fn token_keys_equal_core_keys() {
    let mut rng = 7u64;
    let (mut buf, mut got) = (Vec::new(), Vec::new());
    for bs in [1usize, 2, 3, 4, 16, 17, 64] {
        let tokens: Vec<u32> = (0..bs * 5 + bs / 2)
            .map(|_| {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (rng >> 32) as u32
            })
            .collect();
        for root in [KeyRoot::new(M, "").token_root(), BlockKey(u64::MAX), BlockKey(0)] {
            let mut want = Vec::new();
            kvroute_core::keys::extend_token_keys(root, &tokens, bs, &mut want);
            got.clear();
            super::token_keys(root, &tokens, bs, &mut buf, &mut got);
            assert_eq!(got, want, "block size {bs}");
        }
    }
}

#[test]
fn a_pair_held_by_one_engine_costs_under_44_bytes() {
    // The layout's budget (see the module docs; index_bench measures ~36-38 B at fleet
    // scale): 12-byte slots and entries plus two 4-byte-bucket indexes. A padded entry (16
    // bytes) or a doubling growth would break it.
    let idx = MemoryIndex::new();
    let (engines, per_engine) = (8u32, 24_000u32);
    for e in 0..engines {
        for chunk in 0..per_engine / 48 {
            let base = (e * per_engine + chunk * 48) as u64;
            let hashes: Vec<u64> = (0..48).map(|i| (base + i).wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
            let first = (e * per_engine + chunk * 48) * 4;
            idx.apply(EngineSlot(e), M, 4, &[stored(&hashes, None, first..first + 48 * 4, Tier::Gpu)]);
        }
    }
    let pairs = (engines * per_engine) as usize;
    assert_eq!(idx.distinct_keys(), pairs);
    let (shards, maps) = idx.heap_bytes();
    let per_pair = (shards + maps) as f64 / pairs as f64;
    eprintln!("{per_pair:.1} B per pair ({shards} B shards, {maps} B engine maps)");
    assert!(per_pair < 44.0, "{per_pair:.1} B per pair");
}

#[test]
fn a_bounded_engine_drops_its_oldest_blocks_and_releases_their_keys() {
    let idx = MemoryIndex::new();
    let (e, other) = (EngineSlot(1), EngineSlot(2));
    idx.apply(other, M, 4, &[stored(&[1, 2], None, 0..8, Tier::Gpu)]);
    assert_eq!(idx.set_capacity(e, Some(4)), 0);
    // Ten blocks in one chain: the six oldest (the chain's head) go.
    let hashes: Vec<u64> = (100..110).collect();
    let s = idx.apply(e, M, 4, &[stored(&hashes, None, 0..40, Tier::Gpu)]);
    assert_eq!((s.blocks_stored, s.evicted), (10, 6));
    assert_eq!(idx.engine_blocks(e), 4);
    assert_eq!(matches(&idx, &keys(8)), vec![(2, 2)], "its head is gone: no prefix match from the first key");
    assert_eq!(matches(&idx, &keys(40)[6..]), vec![(1, 4)], "the four newest stay");
    assert_eq!(idx.distinct_keys(), 4 + 2, "evicted keys no engine holds are released");
    // The engine's own removals free room: nothing more is evicted for them.
    let s = idx.apply(e, M, 4, &[KvEvent::Removed { hashes: vec![EngineHash(108), EngineHash(109)], tier: Tier::Gpu }]);
    assert_eq!((s.blocks_removed, s.evicted), (2, 0));
    let s = idx.apply(e, M, 4, &[stored(&[200, 201], None, 0..8, Tier::Gpu)]);
    assert_eq!((s.evicted, idx.engine_blocks(e)), (0, 4));
    // Lowering the bound drops the oldest at once; lifting it keeps what is there.
    assert_eq!(idx.set_capacity(e, Some(1)), 3);
    assert_eq!(idx.engine_blocks(e), 1);
    assert_eq!(matches(&idx, &keys(8)[1..]), vec![(1, 1), (2, 1)], "the newest block stays");
    assert_eq!(idx.set_capacity(e, None), 0);
    let s = idx.apply(e, M, 4, &[stored(&(300..320).collect::<Vec<_>>(), None, 100..180, Tier::Gpu)]);
    assert_eq!((s.evicted, idx.engine_blocks(e)), (0, 21));
}

#[test]
fn a_flood_past_the_bound_keeps_memory_bounded() {
    let idx = MemoryIndex::new();
    let e = EngineSlot(3);
    idx.set_capacity(e, Some(1000));
    let mut evicted = 0;
    for round in 0..200u64 {
        // 100 fresh roots of one block each, 20,000 in all, none ever removed by the engine.
        let events: Vec<KvEvent> = (0..100u64)
            .map(|i| {
                let t = (round * 100 + i) as u32 * 4;
                stored(&[1_000_000 + round * 100 + i], None, t..t + 4, Tier::Gpu)
            })
            .collect();
        evicted += idx.apply(e, M, 4, &events).evicted;
    }
    assert_eq!((idx.engine_blocks(e), evicted), (1000, 19_000));
    assert_eq!(idx.distinct_keys(), 1000);
}
