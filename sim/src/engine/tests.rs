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
        profile: StepProfile { overhead_s: 0.01, per_prefill_token_s: 0.001, per_running_seq_s: 0.002, ..StepProfile::default() },
        time_scale: 1.0,
        offload: OffloadConfig::default(),
    }
}

fn req(id: u64, prompt: Vec<u32>, max_tokens: usize) -> NewRequest {
    NewRequest { id: RequestId(id), prompt, max_tokens, ignore_eos: true, cache_salt: None, output: Vec::new() }
}

/// One step whose outputs all reach a listening frontend, which counts them (the worker
/// does so when it delivers them).
fn step(e: &mut Engine, now: f64) -> StepOutput {
    let out = e.step(now);
    for t in &out.tokens {
        e.record_output(t);
    }
    out
}

/// Step until `id` finishes; returns (finish, clock at the end).
fn run_to_finish(e: &mut Engine, id: u64, mut now: f64) -> (Finished, f64) {
    for _ in 0..10_000 {
        let out = step(e, now);
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
    let out = step(&mut e, 0.0);
    // one sequence, 200 prefill tokens: 0.01 + 0.2 + 0.002
    assert!((out.duration_s - 0.212).abs() < 1e-9);
    let t = &out.tokens[0];
    assert_eq!(t.finished.as_ref().unwrap().ttft_s, out.duration_s);
}

#[test]
fn chunked_prefill_respects_token_budget_and_itl_grows_with_batch() {
    let mut e = Engine::new(cfg());
    e.add_request(req(1, (0..600).collect(), 10), 0.0).unwrap();
    let steps: Vec<usize> = (0..3).map(|_| step(&mut e, 0.0).prefill_tokens).collect();
    assert_eq!(steps, vec![256, 256, 88]);
    let d1 = step(&mut e, 0.0).duration_s;
    for i in 2..6 {
        e.add_request(req(i, vec![i as u32 * 1000; 10], 50), 0.0).unwrap();
    }
    step(&mut e, 0.0); // prefill of the four short ones
    let d5 = step(&mut e, 0.0).duration_s;
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
    let out = step(&mut e, now);
    let removed: Vec<_> = out
        .events
        .iter()
        .filter_map(|ev| match ev {
            KvEvent::BlockRemoved { block_hashes, .. } => Some(block_hashes[0]),
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
        let out = step(&mut e, now);
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

// ---- CPU offload tier (vLLM's OffloadingConnector) ----

fn cpu_cfg(num_gpu_blocks: usize, cpu_blocks: usize) -> EngineConfig {
    let mut c = cfg();
    c.num_gpu_blocks = num_gpu_blocks;
    c.offload.cpu_blocks = cpu_blocks;
    c
}

/// Step until the engine is idle (copies landed, `gone` requests finished); returns the
/// clock and every event, with the TTFT of `id` if it produced a first token.
fn drain(e: &mut Engine, mut now: f64, events: &mut Vec<KvEvent>) -> f64 {
    for _ in 0..10_000 {
        if !e.has_work() {
            return now;
        }
        let out = step(e, now);
        now += out.duration_s;
        events.extend(out.events);
    }
    panic!("engine never went idle");
}

fn run(e: &mut Engine, id: u64, prompt: Vec<u32>, max_tokens: usize, now: f64, events: &mut Vec<KvEvent>) -> (Finished, f64) {
    e.add_request(req(id, prompt, max_tokens), now).unwrap();
    let mut t = now;
    let mut fin = None;
    for _ in 0..10_000 {
        if !e.has_work() {
            break;
        }
        let out = step(e, t);
        t += out.duration_s;
        events.extend(out.events);
        if let Some(f) = out.tokens.iter().find(|x| x.request.0 == id).and_then(|x| x.finished.clone()) {
            fin = Some(f);
        }
    }
    (fin.expect("request finished"), t)
}

fn hashes(prompt: &[u32]) -> Vec<crate::ids::EngineHash> {
    hashing::hash_blocks(prompt, 16, None).iter().map(|d| d.engine_hash()).collect()
}

fn cpu_stored(events: &[KvEvent]) -> Vec<crate::ids::EngineHash> {
    events
        .iter()
        .filter_map(|e| match e {
            KvEvent::BlockStored { block_hashes, medium: Medium::Cpu, .. } => Some(block_hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn removed(events: &[KvEvent], medium: Medium) -> Vec<Vec<crate::ids::EngineHash>> {
    events
        .iter()
        .filter_map(|e| match e {
            KvEvent::BlockRemoved { block_hashes, medium: m } if *m == medium => Some(block_hashes.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn prompt_blocks_are_stored_to_cpu_as_computed_and_cpu_evicts_lru() {
    let mut e = Engine::new(cpu_cfg(65, 4));
    let mut ev = Vec::new();
    let a: Vec<u32> = (0..33).collect();
    let (_, now) = run(&mut e, 1, a.clone(), 20, 0.0, &mut ev);
    let ha = hashes(&a);
    // Write-through: the two full prompt blocks, GPU first, then the CPU's copies once the
    // device-to-host copy lands, as placeholders (vLLM's default event payload).
    let first_cpu = ev.iter().position(|e| e.medium() == Some(Medium::Cpu)).unwrap();
    let first_gpu = ev.iter().position(|e| e.medium() == Some(Medium::Gpu)).unwrap();
    assert!(first_gpu < first_cpu);
    assert_eq!(cpu_stored(&ev), ha);
    for e in ev.iter().filter(|e| e.medium() == Some(Medium::Cpu)) {
        assert_eq!(
            e,
            &KvEvent::BlockStored {
                block_hashes: e_hashes(e),
                parent_block_hash: None,
                token_ids: vec![],
                block_size: 0,
                extra_keys: None,
                medium: Medium::Cpu,
                kv_cache_spec_kind: None,
            }
        );
    }
    // Generated blocks stay GPU-only (`offload_prompt_only`); 33 + 20 tokens fill 3 blocks.
    assert_eq!(e.cached_hashes().len(), 3);
    let mut sorted = ha.clone();
    sorted.sort();
    assert_eq!(e.cpu_cached_hashes(), sorted);
    // Two more requests of two blocks: the pool (4) is full after the first, the second
    // evicts the LRU request's blocks, tail first, in one CPU removal.
    let b: Vec<u32> = (1000..1033).collect();
    let c: Vec<u32> = (2000..2033).collect();
    let (_, now) = run(&mut e, 2, b.clone(), 1, now, &mut ev);
    assert!(removed(&ev, Medium::Cpu).is_empty());
    ev.clear();
    let (_, _) = run(&mut e, 3, c.clone(), 1, now, &mut ev);
    assert_eq!(removed(&ev, Medium::Cpu), vec![vec![ha[1], ha[0]]]);
    assert!(removed(&ev, Medium::Gpu).is_empty(), "the GPU still holds everything");
    let mut want: Vec<_> = hashes(&b).into_iter().chain(hashes(&c)).collect();
    want.sort();
    assert_eq!(e.cpu_cached_hashes(), want);
    let hb = hashes(&b);
    assert_eq!(&e.cpu_eviction_order()[..2], &[hb[1], hb[0]], "b is now the least recently used");
    assert_eq!(e.offload_stats().unwrap().evicted_blocks, 2);
}

fn e_hashes(e: &KvEvent) -> Vec<crate::ids::EngineHash> {
    match e {
        KvEvent::BlockStored { block_hashes, .. } | KvEvent::BlockRemoved { block_hashes, .. } => block_hashes.clone(),
        KvEvent::AllBlocksCleared => vec![],
    }
}

#[test]
fn prefix_evicted_from_gpu_but_held_in_cpu_is_reloaded() {
    // 8 usable GPU blocks: an 8-block filler evicts the prompt's blocks from the GPU.
    let mut e = Engine::new(cpu_cfg(9, 64));
    let mut ev = Vec::new();
    let p: Vec<u32> = (0..100).collect(); // 6 full blocks + 4 tokens
    let hp = hashes(&p);
    let (cold, now) = run(&mut e, 1, p.clone(), 1, 0.0, &mut ev);
    let (warm, now) = run(&mut e, 2, p.clone(), 1, now, &mut ev);
    assert_eq!((cold.cached_tokens, warm.cached_tokens), (0, 96));
    let (_, now) = run(&mut e, 3, (5000..5120).collect(), 1, now, &mut ev);
    assert!(hp.iter().all(|h| !e.cached_hashes().contains(h)), "evicted from the GPU");
    assert!(hp.iter().all(|h| e.cpu_cached_hashes().contains(h)), "held by the CPU tier");
    ev.clear();
    let (reload, _) = run(&mut e, 4, p.clone(), 1, now, &mut ev);
    // Served from the CPU: vLLM counts loaded tokens as cached (num_cached_tokens =
    // local + external).
    assert_eq!(reload.cached_tokens, 96);
    let load_s = 96.0 * e.config().offload.reload_s_per_token(e.config().profile.kv_bytes_per_token);
    assert!(warm.ttft_s < reload.ttft_s && reload.ttft_s < cold.ttft_s, "{} {} {}", warm.ttft_s, reload.ttft_s, cold.ttft_s);
    assert!((reload.ttft_s - warm.ttft_s - load_s).abs() < 1e-9, "TTFT = copy + the GPU-hit prefill");
    // The loaded blocks become GPU-resident again: one GPU BlockStored for all six.
    let gpu_stored: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            KvEvent::BlockStored { block_hashes, medium: Medium::Gpu, parent_block_hash, .. } => {
                Some((block_hashes.clone(), *parent_block_hash))
            }
            _ => None,
        })
        .collect();
    assert_eq!(gpu_stored[0], (hp.clone(), None));
    assert!(hp.iter().all(|h| e.cached_hashes().contains(h)));
    let st = e.stats();
    assert_eq!(st.prompt_tokens_first_scheduled, 420);
    assert_eq!(st.cached_tokens_first_scheduled_gpu, 96);
    assert_eq!(st.cached_tokens_first_scheduled_cpu, 96);
    assert_eq!((st.external_prefix_cache_hits, st.prefix_cache_hits), (96, 96));
    assert_eq!(st.external_prefix_cache_queries, 100 + 4 + 120 + 100);
    assert_eq!(e.offload_stats().unwrap().loaded_blocks, 6);
}

#[test]
fn a_whole_block_aligned_prompt_loads_every_block_and_recomputes_the_last_token() {
    let mut e = Engine::new(cpu_cfg(9, 64));
    let mut ev = Vec::new();
    let p: Vec<u32> = (0..64).collect();
    let (_, now) = run(&mut e, 1, p.clone(), 1, 0.0, &mut ev);
    let (_, now) = run(&mut e, 2, (5000..5120).collect(), 1, now, &mut ev);
    e.add_request(req(3, p, 1), now).unwrap();
    let load = step(&mut e, now);
    assert_eq!((load.prefill_tokens, e.num_waiting(), e.num_running()), (0, 1, 0), "loading, counted as waiting");
    let mut t = now + load.duration_s;
    let out = loop {
        let out = step(&mut e, t);
        t += out.duration_s;
        if out.batch_size > 0 {
            break out;
        }
    };
    // GPU lookups stop one token short; the CPU tier's covers all 64, reported cached.
    assert_eq!(out.prefill_tokens, 1);
    assert_eq!(out.tokens[0].finished.as_ref().unwrap().cached_tokens, 64);
    assert_eq!(e.stats().cached_tokens_first_scheduled_cpu, 64);
}

#[test]
fn first_scheduling_counters_ignore_preemption_and_cpu_off_emits_no_cpu_events() {
    let mut c = cfg();
    c.num_gpu_blocks = 9;
    let mut e = Engine::new(c.clone());
    e.add_request(req(1, vec![1; 60], 40), 0.0).unwrap();
    e.add_request(req(2, vec![2; 60], 40), 0.0).unwrap();
    let mut ev = Vec::new();
    drain(&mut e, 0.0, &mut ev);
    let st = e.stats();
    assert!(st.preemptions > 0);
    assert!(st.prefix_cache_queries > 120, "vLLM's counter sees every admission");
    assert_eq!(st.prompt_tokens_first_scheduled, 120);
    assert_eq!(st.cached_tokens_first_scheduled_cpu + st.external_prefix_cache_queries, 0);
    assert!(ev.iter().all(|e| e.medium() != Some(Medium::Cpu)));
    assert!(!e.has_cpu_tier() && e.cpu_cached_hashes().is_empty());
    // The offload knobs are inert while cpu_blocks is 0.
    c.offload = OffloadConfig { cpu_blocks: 0, h2d_gb_per_s: 1.0, d2h_gb_per_s: 1.0, self_describing_events: true };
    let mut f = Engine::new(c);
    f.add_request(req(1, vec![1; 60], 40), 0.0).unwrap();
    f.add_request(req(2, vec![2; 60], 40), 0.0).unwrap();
    let mut ev2 = Vec::new();
    drain(&mut f, 0.0, &mut ev2);
    assert_eq!(ev, ev2);
    assert_eq!(e.stats().ttft.sum, f.stats().ttft.sum);
}

#[test]
fn self_describing_cpu_events_carry_tokens_and_parent() {
    let mut c = cpu_cfg(65, 8);
    c.offload.self_describing_events = true;
    let mut e = Engine::new(c);
    let mut ev = Vec::new();
    let p: Vec<u32> = (0..40).collect();
    run(&mut e, 1, p.clone(), 1, 0.0, &mut ev);
    let h = hashes(&p);
    let cpu: Vec<_> = ev.into_iter().filter(|e| e.medium() == Some(Medium::Cpu)).collect();
    let want = |j: usize| KvEvent::BlockStored {
        block_hashes: vec![h[j]],
        parent_block_hash: j.checked_sub(1).map(|p| h[p]),
        token_ids: p[j * 16..(j + 1) * 16].to_vec(),
        block_size: 16,
        extra_keys: None,
        medium: Medium::Cpu,
        kv_cache_spec_kind: Some("full_attention"),
    };
    assert_eq!(cpu, vec![want(0), want(1)]);
}

#[test]
fn a_pending_store_defers_a_lookup_and_the_reset_can_empty_the_cpu_tier() {
    // Slow copies (1 GB/s): a block takes 2.6 ms to reach the CPU.
    let mut c = cpu_cfg(9, 64);
    c.offload.d2h_gb_per_s = 1.0;
    let mut e = Engine::new(c);
    let mut ev = Vec::new();
    let p: Vec<u32> = (0..100).collect();
    e.add_request(req(1, p.clone(), 1), 0.0).unwrap();
    let out = step(&mut e, 0.0); // prefill + finish; the store starts with the next step
    assert!(out.tokens[0].finished.is_some());
    assert!(e.has_work(), "stores in flight keep the engine stepping");
    let now = drain(&mut e, out.duration_s, &mut ev);
    assert_eq!(cpu_stored(&ev).len(), 6);
    assert!(now > out.duration_s + 6.0 * 16.0 * 163_840.0 / 1e9 - 1e-9);
    // /reset_prefix_cache?reset_external=true empties both tiers; only the GPU says so.
    ev.clear();
    assert!(e.reset_prefix_cache(true));
    ev.extend(e.take_pending_events());
    assert_eq!(ev, vec![KvEvent::AllBlocksCleared]);
    assert!(e.cpu_cached_hashes().is_empty() && e.num_cpu_blocks_used() == 0);
    // Without reset_external the CPU tier keeps its blocks.
    let (_, now) = run(&mut e, 2, p.clone(), 1, now, &mut ev);
    assert!(e.reset_prefix_cache(false));
    assert_eq!(e.cpu_cached_hashes().len(), 6);
    let (f, _) = run(&mut e, 3, p, 1, now, &mut ev);
    assert_eq!(f.cached_tokens, 96, "reloaded from the CPU after a GPU-only reset");
}
