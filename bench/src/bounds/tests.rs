use super::capacity::SimFlags;
use super::*;
use crate::workload::{multi_turn, production, shared_prefix, trace, PromptMode};

const BS: usize = 16;

/// A request of `prompt` tokens whose full blocks are `blocks` (lookup per the engine rule).
fn req(prompt: usize, blocks: &[u64]) -> BlockRequest {
    BlockRequest { prompt_tokens: prompt, blocks: blocks.to_vec(), lookup: (prompt - 1) / BS }
}

fn hits(f: &Figure) -> u64 {
    f.hit_tokens / BS as u64
}

#[test]
fn infinite_cache_counts_blocks_seen_before_within_lookup() {
    let reqs = [
        req(48, &[1, 2, 3]), // lookup 2: nothing seen yet
        req(50, &[1, 2, 4]), // lookup 3: blocks 1, 2 seen
        req(48, &[1, 2, 3]), // lookup 2 (the last block is never a hit): 1, 2
        req(64, &[1, 2, 3, 9]), // lookup 3: 1, 2, 3 (3 was inserted by the first request)
    ];
    let f = infinite_cache(&reqs, BS);
    assert_eq!(hits(&f), 7);
    assert_eq!(f.prompt_tokens, 210);
    assert_eq!(f.share, Some(7.0 * 16.0 / 210.0));
    assert_eq!(infinite_cache(&[], BS).share, None);
}

#[test]
fn oracle_is_belady_with_bypass() {
    // A B C A B C A B C, one block each, two slots: LRU never hits; MIN keeps two of the
    // three reuse intervals alive at any time -> 4 hits of the 6 possible.
    let seq: Vec<BlockRequest> = [1, 2, 3, 1, 2, 3, 1, 2, 3].iter().map(|&k| req(17, &[k])).collect();
    assert_eq!(hits(&infinite_cache(&seq, BS)), 6);
    assert_eq!(hits(&oracle(&seq, 2, BS)), 4);
    assert_eq!(hits(&pooled_lru(&seq, 2, BS)), 0);
    assert_eq!(hits(&oracle(&seq, 3, BS)), 6);
    assert_eq!(hits(&pooled_lru(&seq, 3, BS)), 6);
    assert_eq!(hits(&oracle(&seq, 1, BS)), 2, "one slot: A[0,3) then A[3,6)");
    assert_eq!(hits(&oracle(&seq, 0, BS)), 0);
    // Scan resistance: a block never used again is bypassed, the hot one survives.
    let scan: Vec<BlockRequest> = [7, 100, 7, 101, 7, 102, 7].iter().map(|&k| req(17, &[k])).collect();
    assert_eq!(hits(&oracle(&scan, 1, BS)), 3);
    assert_eq!(hits(&pooled_lru(&scan, 1, BS)), 0);
}

#[test]
fn answer_blocks_load_for_free_but_never_score_themselves() {
    // Turn 1: 20 prompt tokens (block a, lookup 1) then its answer fills block b; turn 2
    // carries both (40 tokens, lookup 2).
    let reqs = [BlockRequest { prompt_tokens: 20, blocks: vec![10, 11], lookup: 1 }, req(40, &[10, 11])];
    assert_eq!(hits(&infinite_cache(&reqs, BS)), 2);
    assert_eq!(hits(&oracle(&reqs, 2, BS)), 2);
    assert_eq!(hits(&oracle(&reqs, 1, BS)), 1);
    // Accessed in the first request beyond its lookup: not a hit there.
    let own = [BlockRequest { prompt_tokens: 20, blocks: vec![10, 10 + 1000], lookup: 1 }];
    assert_eq!(hits(&oracle(&own, 8, BS)), 0);
}

#[test]
fn pooled_lru_hits_leading_prefixes_and_evicts_tails_first() {
    // Capacity 3: r1 leaves a, b, c (c least recent); r2's d evicts c, not a.
    let reqs = [req(49, &[1, 2, 3]), req(17, &[4]), req(49, &[1, 2, 3])];
    assert_eq!(hits(&pooled_lru(&reqs, 3, BS)), 2);
    // A miss ends the prefix even if later blocks are cached.
    let gap = [req(49, &[1, 2, 3]), req(49, &[5, 2, 3])];
    assert_eq!(hits(&pooled_lru(&gap, 10, BS)), 0);
}

#[test]
fn trace_workload_blocks_follow_the_hash_ids() {
    let rec = |ts: f64, len: usize, ids: &[u64]| trace::TraceRecord { timestamp: ts, input_length: len, output_length: 8, hash_ids: ids.to_vec() };
    let spec = trace::ReplaySpec { speed: 1.0, max_input_tokens: 100_000, max_output_tokens: 64, seed: 3, mode: PromptMode::Tokens };
    // Listed out of order: the bounds take the send order (timestamps).
    let recs = [rec(2000.0, 1100, &[1, 2, 3]), rec(0.0, 1024, &[1, 2])];
    let w = trace::to_workload(&recs, &spec).unwrap();
    let (reqs, ordering, approx) = block_requests(&w, BS, 3);
    assert_eq!((ordering, approx), (Ordering::Arrival, false));
    assert_eq!(reqs.len(), 2);
    assert_eq!((reqs[0].prompt_tokens, reqs[0].blocks.len(), reqs[0].lookup), (1024, 64, 63));
    assert_eq!((reqs[1].prompt_tokens, reqs[1].blocks.len(), reqs[1].lookup), (1100, 68, 68));
    assert_eq!(reqs[0].blocks[..], reqs[1].blocks[..64]);
    let f = infinite_cache(&reqs, BS);
    assert_eq!(f.hit_tokens, 1024, "the second request's first two 512-token blocks");
    assert_eq!(f.prompt_tokens, 2124);
    // Block keys are chained: the same block after a different prefix is a different key.
    let other = [rec(0.0, 1024, &[9, 2])];
    let (o, _, _) = block_requests(&trace::to_workload(&other, &spec).unwrap(), BS, 3);
    assert!(o[0].blocks[32..].iter().all(|k| !reqs[0].blocks.contains(k)));
}

#[test]
fn multi_turn_and_shared_prefix_workloads() {
    let spec = multi_turn::MultiTurnSpec {
        sessions: 1,
        turns: 2,
        system_tokens: 32,
        message_tokens: 16,
        output_tokens: 16,
        seed: 1,
        mode: PromptMode::Tokens,
    };
    let (reqs, ordering, _) = block_requests(&multi_turn::generate(&spec).unwrap(), BS, 1);
    assert_eq!(ordering, Ordering::Estimated);
    // Turn 0: 48 prompt tokens (lookup 2) + a 16-token answer = 4 blocks left behind.
    assert_eq!((reqs[0].prompt_tokens, reqs[0].lookup, reqs[0].blocks.len()), (48, 2, 4));
    // Turn 1: 80 tokens, lookup 4, all 4 leading blocks (incl. the answer's) seen.
    assert_eq!((reqs[1].prompt_tokens, reqs[1].lookup, reqs[1].blocks.len()), (80, 4, 5));
    assert_eq!(infinite_cache(&reqs, BS).share, Some(0.5));

    let sp = shared_prefix::SharedPrefixSpec {
        groups: 2,
        prefix_tokens: 64,
        users: 3,
        question_tokens: 16,
        output_tokens: 4,
        requests: None,
        seed: 2,
        mode: PromptMode::Tokens,
    };
    let (reqs, ordering, _) = block_requests(&shared_prefix::generate(&sp).unwrap(), BS, 2);
    assert_eq!(ordering, Ordering::Arrival);
    // Each group's first request misses; the other four hit the 64-token prefix.
    assert_eq!(infinite_cache(&reqs, BS).hit_tokens, 4 * 64);
    assert_eq!(hits(&oracle(&reqs, 8, BS)), 16, "8 blocks hold both groups' prefixes");
    let one = hits(&oracle(&reqs, 4, BS));
    assert!((8..16).contains(&one), "4 blocks hold one group's prefix at a time: {one}");
    let chat = shared_prefix::generate(&shared_prefix::SharedPrefixSpec { mode: PromptMode::Chat, ..sp }).unwrap();
    let (creqs, _, approx) = block_requests(&chat, BS, 2);
    assert!(approx);
    assert_eq!(infinite_cache(&creqs, BS).hit_tokens, 4 * 64, "words stand in for tokens");
}

#[test]
fn bounds_are_ordered_on_a_production_trace() {
    let spec = production::ProductionSpec {
        conversations: 40,
        rate_per_s: 0.5,
        first_median_tokens: 300.0,
        max_model_len: 8192,
        max_output_tokens: 512,
        apps: 4,
        app_max_blocks: 2,
        seed: 9,
        ..production::ProductionSpec::default()
    };
    let recs = production::records(&production::generate(&spec).unwrap());
    let replay = trace::ReplaySpec { speed: 1.0, max_input_tokens: 8192, max_output_tokens: 512, seed: 9, mode: PromptMode::Tokens };
    let w = trace::to_workload(&recs, &replay).unwrap();
    let (reqs, _, _) = block_requests(&w, BS, 9);
    let inf = infinite_cache(&reqs, BS);
    let distinct: std::collections::HashSet<u64> = reqs.iter().flat_map(|r| r.blocks.iter().copied()).collect();
    assert_eq!(oracle(&reqs, distinct.len() as u64, BS), inf, "enough room for everything = no eviction");
    let mut last = 0;
    for cap in [0u64, 50, 200, 800, 3200] {
        let o = oracle(&reqs, cap, BS);
        let l = pooled_lru(&reqs, cap, BS);
        assert!(o.hit_tokens >= last, "monotone in capacity");
        assert!(o.hit_tokens <= inf.hit_tokens);
        assert!(l.hit_tokens <= o.hit_tokens, "cap {cap}: LRU {} > MIN {}", l.hit_tokens, o.hit_tokens);
        last = o.hit_tokens;
    }
    // Every request shares at least the universal block with an earlier one.
    assert!(inf.share.unwrap() > 0.3, "{inf:?}");
}

#[test]
fn capacity_from_flags_and_metrics() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let d = Capacity::from_sim_args(4, &[]);
    assert_eq!((d.gpu_blocks, d.cpu_blocks, d.block_size, d.total_tokens()), (22_400, 0, 16, 358_400));
    let c = Capacity::from_sim_args(4, &args(&["--num-gpu-blocks", "3000", "--eos-after", "5"]));
    assert_eq!(c.gpu_blocks, 12_000);
    let c = Capacity::from_sim_args(
        3,
        &args(&["--num-gpu-blocks=1000", "--block-size", "32", "--dp-size=2", "--worker-override", "1:step_overhead_ms=50,num_gpu_blocks=10", "--num-cpu-blocks", "7"]),
    );
    assert_eq!((c.gpu_blocks, c.cpu_blocks, c.block_size, c.engines), ((1000 + 10 + 1000) * 2, 7 * 3 * 2, 32, 6));
    assert_eq!(c.with_total_tokens(3200).total_blocks(), 100);

    let info = |gpu: &str, cpu: Option<&str>| {
        let cpu = cpu.map_or(String::new(), |c| format!(",num_cpu_blocks=\"{c}\""));
        format!("vllm:cache_config_info{{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"{gpu}\"{cpu}}} 1.0\nvllm:num_requests_running 0\n")
    };
    let m = Capacity::from_cache_config(&[info("100", None), info("50", Some("20"))], 0).unwrap();
    assert_eq!((m.gpu_blocks, m.cpu_blocks, m.engines, m.source.as_str()), (150, 20, 2, "metrics"));
    let m = Capacity::from_cache_config(&[info("100", Some("None"))], 9).unwrap();
    assert_eq!((m.cpu_blocks, m.source.as_str()), (9, "metrics+flags"));
    assert_eq!(Capacity::from_cache_config(&[info("100", None), "vllm:x 1\n".into()], 0), None);
    assert_eq!(Capacity::from_cache_config(&[], 0), None);
    assert_eq!(SimFlags::parse(&args(&["--cpu-blocks", "5"])).cpu_total(2), 10);
    let f = SimFlags::parse(&args(&["--cpu-blocks=5", "--worker-override=0:cpu_blocks=1", "--dp-size", "2"]));
    assert_eq!(f.cpu_total(2), (1 + 5) * 2);
}

#[test]
fn report_summary_names_the_figures() {
    let seq: Vec<BlockRequest> = [1, 2, 1].iter().map(|&k| req(17, &[k])).collect();
    let cap = Capacity { block_size: BS, gpu_blocks: 1, cpu_blocks: 0, engines: 1, source: "flags".into() };
    let b = compute(&seq, Ordering::Arrival, false, cap);
    assert_eq!(b.oracle.hit_tokens, 16);
    let s = b.summary();
    assert!(s.contains("infinite cache 31.4%") && s.contains("oracle 31.4%") && s.contains("16 tokens of KV"), "{s}");
    let back: ReuseBounds = serde_json::from_str(&serde_json::to_string(&b).unwrap()).unwrap();
    assert_eq!(back, b);
}
