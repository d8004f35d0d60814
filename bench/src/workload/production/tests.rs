use super::*;
use std::collections::HashMap;

fn spec(seed: u64) -> ProductionSpec {
    ProductionSpec { conversations: 400, seed, ..ProductionSpec::default() }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    crate::stats::percentile(&v, 50.0).unwrap()
}

#[test]
fn seeded_and_deterministic() {
    let a = generate(&spec(1)).unwrap();
    assert_eq!(a, generate(&spec(1)).unwrap());
    assert_ne!(records(&a), records(&generate(&spec(2)).unwrap()));
    assert!(a.windows(2).all(|w| w[0].record.timestamp <= w[1].record.timestamp));
    assert!(a.iter().all(|r| r.record.timestamp.fract() == 0.0), "integer milliseconds");
    // More conversations keep the first ones' content (per-conversation streams).
    let more = generate(&ProductionSpec { conversations: 500, ..spec(1) }).unwrap();
    let first: Vec<_> = a.iter().filter(|r| r.conversation == 0).collect();
    let again: Vec<_> = more.iter().filter(|r| r.conversation == 0).collect();
    assert_eq!(first, again);
}

#[test]
fn every_follow_up_extends_its_predecessor_and_every_request_starts_universal() {
    let s = spec(3);
    let reqs = generate(&s).unwrap();
    let mut last: HashMap<u64, &ProductionRequest> = HashMap::new();
    let mut followups = 0;
    for r in &reqs {
        let rec = &r.record;
        assert_eq!(rec.hash_ids[0], UNIVERSAL_BLOCK, "every request starts with the universal block");
        assert!(rec.input_length > TRACE_BLOCK, "the universal block is always whole");
        assert_eq!(rec.hash_ids.len(), rec.input_length.div_ceil(TRACE_BLOCK), "Mooncake: one id per 512 tokens");
        assert!(rec.input_length + rec.output_length as usize <= s.max_model_len);
        assert!((1..=s.max_output_tokens).contains(&rec.output_length));
        match last.get(&r.conversation) {
            None => assert_eq!(r.turn, 0),
            Some(prev) => {
                followups += 1;
                assert_eq!(r.turn, prev.turn + 1);
                let p = &prev.record;
                assert!(rec.timestamp >= p.timestamp);
                assert_eq!(rec.hash_ids[..p.hash_ids.len()], p.hash_ids[..], "the prefix is exactly the history");
                assert!(rec.input_length > p.input_length + p.output_length as usize, "history + answer + a new message");
                // The new ids are fresh: no other conversation ever used them.
                for id in &rec.hash_ids[p.hash_ids.len()..] {
                    assert!(reqs.iter().filter(|o| o.conversation != r.conversation).all(|o| !o.record.hash_ids.contains(id)));
                }
            }
        }
        last.insert(r.conversation, r);
    }
    assert!(followups > reqs.len() / 3, "{followups} follow-ups of {}", reqs.len());
    // The records round-trip through the Mooncake parser the replay uses.
    let recs = records(&reqs);
    let text: String = recs.iter().map(|r| serde_json::to_string(r).unwrap() + "\n").collect();
    assert_eq!(super::super::trace::parse(&text, std::path::Path::new("p")).unwrap(), recs);
}

#[test]
fn app_prompts_are_shared_and_conversation_prefixes_are_many() {
    let reqs = generate(&spec(4)).unwrap();
    let app_ids = 1..1 + 16 * 8;
    let firsts: Vec<&TraceRecord> = reqs.iter().filter(|r| r.turn == 0).map(|r| &r.record).collect();
    let with_app = firsts.iter().filter(|r| app_ids.contains(&r.hash_ids[1])).count() as f64 / firsts.len() as f64;
    assert!((0.4..0.6).contains(&with_app), "app fraction {with_app}");
    // Zipf: app 0 is the most popular.
    let uses = |a: u64| firsts.iter().filter(|r| r.hash_ids[1] == 1 + a * 8).count();
    assert!(uses(0) > uses(5) && uses(0) > uses(15));
    let distinct: std::collections::HashSet<&[u64]> = firsts.iter().map(|r| &r.hash_ids[..]).collect();
    assert_eq!(distinct.len(), firsts.len(), "every conversation has its own prefix");
}

#[test]
fn distributions_have_the_asked_shape() {
    let s = ProductionSpec { conversations: 3000, max_turns: 50, ..spec(5) };
    let reqs = generate(&s).unwrap();
    // Think time: lognormal, median ~150 s, heavy right tail.
    let mut prev: HashMap<u64, f64> = HashMap::new();
    let mut think = Vec::new();
    for r in &reqs {
        if let Some(t) = prev.insert(r.conversation, r.record.timestamp) {
            think.push((r.record.timestamp - t) / 1000.0);
        }
    }
    let m = median(think.clone());
    assert!((120.0..180.0).contains(&m), "think median {m}");
    think.sort_by(f64::total_cmp);
    let p99 = crate::stats::percentile(&think, 99.0).unwrap();
    assert!(p99 > 8.0 * m, "heavy tail: p99 {p99} vs median {m}");
    let mean = think.iter().sum::<f64>() / think.len() as f64;
    assert!(mean > 1.5 * m, "mean {mean} well above the median {m}");
    // Conversation arrivals: Poisson at 1/s -> mean gap 1 s.
    let starts: Vec<f64> = reqs.iter().filter(|r| r.turn == 0).map(|r| r.record.timestamp / 1000.0).collect();
    let gap = (starts.last().unwrap() - starts[0]) / (starts.len() - 1) as f64;
    assert!((0.9..1.1).contains(&gap), "mean conversation gap {gap}");
    // Turns: geometric, mean ~3.5 (a little less: long conversations hit the context limit).
    let turns = reqs.len() as f64 / s.conversations as f64;
    assert!((2.9..3.8).contains(&turns), "mean turns {turns}");
    // Outputs: mean ~350.
    let out = reqs.iter().map(|r| r.record.output_length as f64).sum::<f64>() / reqs.len() as f64;
    assert!((320.0..380.0).contains(&out), "mean output {out}");
    // First messages (after the shared blocks): lognormal, median ~1000, a long tail up
    // to the model's maximum.
    let app_ids = 1..1 + s.apps * s.app_max_blocks as u64;
    let firsts: Vec<&TraceRecord> = reqs.iter().filter(|r| r.turn == 0).map(|r| &r.record).collect();
    let message = |r: &TraceRecord| {
        let shared = 1 + r.hash_ids.iter().filter(|id| app_ids.contains(id)).count();
        (r.input_length - shared * TRACE_BLOCK) as f64
    };
    let m = median(firsts.iter().map(|r| message(r)).collect());
    assert!((900.0..1100.0).contains(&m), "first-message median {m}");
    let firsts: Vec<f64> = firsts.iter().map(|r| r.input_length as f64).collect();
    let max = firsts.iter().cloned().fold(0.0, f64::max);
    assert!(max > 16_000.0 && max <= s.max_model_len as f64, "longest first prompt {max}");
    let long = firsts.iter().filter(|&&l| l > 8000.0).count() as f64 / firsts.len() as f64;
    assert!((0.02..0.15).contains(&long), "share of first prompts > 8k: {long}");
}

#[test]
fn a_duration_cuts_a_window() {
    let full = generate(&spec(6)).unwrap();
    let window = generate(&ProductionSpec { duration_s: Some(600.0), ..spec(6) }).unwrap();
    let expect: Vec<_> = full.iter().filter(|r| r.record.timestamp <= 600_000.0).cloned().collect();
    assert_eq!(window, expect);
    assert!(window.len() < full.len() && !window.is_empty());
}

#[test]
fn bad_specs_are_refused() {
    for bad in [
        ProductionSpec { rate_per_s: 0.0, ..ProductionSpec::default() },
        ProductionSpec { conversations: 0, ..ProductionSpec::default() },
        ProductionSpec { mean_turns: 0.5, ..ProductionSpec::default() },
        ProductionSpec { think_sigma: -1.0, ..ProductionSpec::default() },
        ProductionSpec { max_model_len: 2000, ..ProductionSpec::default() },
        ProductionSpec { duration_s: Some(0.0), ..ProductionSpec::default() },
    ] {
        assert!(generate(&bad).is_err(), "{bad:?}");
    }
    let tiny = ProductionSpec { apps: 0, max_model_len: 1200, max_output_tokens: 64, conversations: 50, ..ProductionSpec::default() };
    let reqs = generate(&tiny).unwrap();
    assert!(reqs.iter().all(|r| r.record.input_length + r.record.output_length as usize <= 1200));
}

#[test]
fn shipped_production_trace_is_the_generator_output() {
    // bench/traces/production.jsonl = `kvroute-bench gen-trace --shape production --duration-s 1800`.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/production.jsonl");
    let shipped = super::super::trace::load(&path).unwrap();
    let spec = ProductionSpec { duration_s: Some(1800.0), ..ProductionSpec::default() };
    assert_eq!(shipped, records(&generate(&spec).unwrap()));
}

#[test]
fn shipped_long_fresh_trace_is_the_generator_output() {
    // bench/traces/long-fresh.jsonl = `kvroute-bench gen-trace --shape long-fresh`.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/long-fresh.jsonl");
    let shipped = super::super::trace::load(&path).unwrap();
    assert_eq!(shipped, records(&generate(&ProductionSpec::long_fresh()).unwrap()));
}
