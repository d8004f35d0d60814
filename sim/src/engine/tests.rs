//! Deterministic engine tests: no clocks, steps are driven directly.

use super::*;
use crate::ids::RequestId;

fn cfg() -> EngineConfig {
    EngineConfig {
        block_size: 16,
        num_gpu_blocks: 65,
        max_num_seqs: 8,
        max_num_batched_tokens: 256,
        max_model_len: 4096,
        eos_after: 8,
        profile: StepProfile { overhead_s: 0.01, per_prefill_token_s: 0.001, per_running_seq_s: 0.002 },
        time_scale: 1.0,
    }
}

fn req(id: u64, prompt: Vec<u32>, max_tokens: usize) -> NewRequest {
    NewRequest { id: RequestId(id), prompt, max_tokens, ignore_eos: true, cache_salt: None, output: Vec::new() }
}

/// Step until `id` finishes; returns (finish, clock at the end).
fn run_to_finish(e: &mut Engine, id: u64, mut now: f64) -> (Finished, f64) {
    for _ in 0..10_000 {
        let out = e.step(now);
        now += out.duration_s;
        if let Some(f) = out.tokens.iter().find(|t| t.request.0 == id).and_then(|t| t.finished.clone()) {
            return (f, now);
        }
    }
    panic!("request {id} did not finish");
}

#[test]
fn second_identical_request_hits_all_full_blocks_and_is_faster() {
    let mut e = Engine::new(cfg());
    let prompt: Vec<u32> = (0..100).collect(); // 6 full blocks + 4 tokens
    e.add_request(req(1, prompt.clone(), 4), 0.0).unwrap();
    let (a, now) = run_to_finish(&mut e, 1, 0.0);
    assert_eq!(a.cached_tokens, 0);
    e.add_request(req(2, prompt, 4), now).unwrap();
    let (b, _) = run_to_finish(&mut e, 2, now);
    assert_eq!(b.cached_tokens, 96, "all 6 full blocks are cached");
    assert!(b.ttft_s < a.ttft_s, "{} !< {}", b.ttft_s, a.ttft_s);
    assert_eq!(e.stats().prefix_cache_hits, 96);
    assert_eq!(e.stats().prefix_cache_queries, 200);
}

#[test]
fn block_aligned_prompt_recomputes_last_block_like_vllm() {
    let mut e = Engine::new(cfg());
    let prompt: Vec<u32> = (0..64).collect();
    e.add_request(req(1, prompt.clone(), 1), 0.0).unwrap();
    let (_, now) = run_to_finish(&mut e, 1, 0.0);
    e.add_request(req(2, prompt, 1), now).unwrap();
    let (b, _) = run_to_finish(&mut e, 2, now);
    assert_eq!(b.cached_tokens, 48);
}

#[test]
fn ttft_is_prefill_of_uncached_tokens_plus_queue() {
    let mut e = Engine::new(cfg());
    e.add_request(req(1, (0..200).collect(), 1), 0.0).unwrap();
    let out = e.step(0.0);
    // one sequence, 200 prefill tokens: 0.01 + 0.2 + 0.002
    assert!((out.duration_s - 0.212).abs() < 1e-9);
    let t = &out.tokens[0];
    assert_eq!(t.finished.as_ref().unwrap().ttft_s, out.duration_s);
}

#[test]
fn chunked_prefill_respects_token_budget_and_itl_grows_with_batch() {
    let mut e = Engine::new(cfg());
    e.add_request(req(1, (0..600).collect(), 10), 0.0).unwrap();
    let steps: Vec<usize> = (0..3).map(|_| e.step(0.0).prefill_tokens).collect();
    assert_eq!(steps, vec![256, 256, 88]);
    let d1 = e.step(0.0).duration_s;
    for i in 2..6 {
        e.add_request(req(i, vec![i as u32 * 1000; 10], 50), 0.0).unwrap();
    }
    e.step(0.0); // prefill of the four short ones
    let d5 = e.step(0.0).duration_s;
    assert_eq!(e.num_running(), 5);
    assert!(d5 > d1);
}

#[test]
fn eviction_is_lru_of_unpinned_blocks() {
    let mut c = cfg();
    c.num_gpu_blocks = 9; // 8 usable blocks
    let mut e = Engine::new(c);
    let mut now = 0.0;
    // Three requests of 2 full blocks (+1 token, so 3 blocks each while running).
    for id in 1..=3u64 {
        e.add_request(req(id, vec![id as u32; 33], 1), now).unwrap();
        now = run_to_finish(&mut e, id, now).1;
    }
    let order = e.eviction_order();
    assert_eq!(order.len(), 6);
    // Touch request 1's prefix again: its blocks become most recently used.
    e.add_request(req(4, vec![1; 33], 1), now).unwrap();
    now = run_to_finish(&mut e, 4, now).1;
    let order2 = e.eviction_order();
    assert_eq!(&order2[..4], &order[2..6]);
    // A 4-block request must evict request 2's blocks (the LRU ones), not 1's or 3's.
    let before = e.cached_hashes();
    e.add_request(req(5, vec![9; 49], 1), now).unwrap();
    let out = e.step(now);
    let removed: Vec<_> = out
        .events
        .iter()
        .filter_map(|ev| match ev {
            KvEvent::BlockRemoved { block_hashes } => Some(block_hashes[0]),
            _ => None,
        })
        .collect();
    assert_eq!(removed, order2[..removed.len()].to_vec());
    assert!(removed.iter().all(|h| before.contains(h)));
    // Two uncached partial blocks go first, then request 2's pair (tail block first).
    assert_eq!(removed, order[2..4].to_vec());
}

#[test]
fn running_blocks_are_pinned_and_memory_pressure_preempts() {
    let mut c = cfg();
    c.num_gpu_blocks = 9;
    let mut e = Engine::new(c);
    e.add_request(req(1, vec![1; 60], 40), 0.0).unwrap();
    e.add_request(req(2, vec![2; 60], 40), 0.0).unwrap();
    let mut now = 0.0;
    let mut done = 0;
    for _ in 0..500 {
        let out = e.step(now);
        now += out.duration_s;
        done += out.tokens.iter().filter(|t| t.finished.is_some()).count();
        if done == 2 {
            break;
        }
    }
    assert_eq!(done, 2);
    assert!(e.stats().preemptions > 0);
    assert_eq!(e.num_free_blocks(), 8);
}

#[test]
fn eos_and_validation() {
    let mut e = Engine::new(cfg());
    let mut r = req(1, vec![5; 20], 100);
    r.ignore_eos = false;
    e.add_request(r, 0.0).unwrap();
    let (f, _) = run_to_finish(&mut e, 1, 0.0);
    assert_eq!((f.reason, f.completion_tokens), (FinishReason::Stop, 8));
    assert_eq!(e.add_request(req(2, vec![], 1), 0.0), Err(EngineError::EmptyPrompt));
    assert!(matches!(e.add_request(req(3, vec![1; 4000], 200), 0.0), Err(EngineError::TooLong { .. })));
    assert!(matches!(e.add_request(req(4, vec![1; 1024], 1), 0.0), Err(EngineError::CacheTooSmall { .. })));
    // Generation is capped at the cache's capacity (64 blocks * 16 tokens).
    e.add_request(req(5, vec![1; 1000], 1000), 0.0).unwrap();
    let (f, _) = run_to_finish(&mut e, 5, 0.0);
    assert_eq!((f.reason, f.completion_tokens), (FinishReason::Length, 24));
}

#[test]
fn salt_isolates_prefixes() {
    let mut e = Engine::new(cfg());
    let mut a = req(1, (0..40).collect(), 1);
    a.cache_salt = Some("tenant-a".into());
    e.add_request(a, 0.0).unwrap();
    let (_, now) = run_to_finish(&mut e, 1, 0.0);
    e.add_request(req(2, (0..40).collect(), 1), now).unwrap();
    assert_eq!(run_to_finish(&mut e, 2, now).0.cached_tokens, 0);
}
