use super::*;

fn spec(mode: PromptMode) -> ReplaySpec {
    ReplaySpec { speed: 2.0, max_input_tokens: 100_000, max_output_tokens: 1024, seed: 5, mode }
}

fn rec(ts: f64, len: usize, ids: &[u64]) -> TraceRecord {
    TraceRecord { timestamp: ts, input_length: len, output_length: 10, hash_ids: ids.to_vec() }
}

fn ids(c: &Content) -> &[u32] {
    match c {
        Content::Tokens(t) => t,
        Content::Text(_) => panic!("token mode"),
    }
}

#[test]
fn equal_hash_ids_become_identical_blocks() {
    let recs = [rec(0.0, 1300, &[1, 2, 3]), rec(1000.0, 1100, &[1, 2, 9]), rec(3000.0, 600, &[4, 2])];
    let w = to_workload(&recs, &spec(PromptMode::Tokens)).unwrap();
    let p: Vec<&[u32]> = w.sessions.iter().map(|s| ids(&s.turns[0].user)).collect();
    assert_eq!(p[0].len(), 1300);
    assert_eq!(p[1].len(), 1100);
    // Shared leading blocks [1, 2] -> identical first 1024 tokens.
    assert_eq!(p[0][..1024], p[1][..1024]);
    assert_ne!(p[0][1024..1100], p[1][1024..1100]);
    // Block 2 in a different position is the same content, but the prefix differs.
    assert_eq!(p[2][512..600], block_tokens(5, 2)[..88]);
    assert_ne!(p[2][..512], p[0][..512]);
    assert_eq!(p[0][..512], block_tokens(5, 1)[..]);
}

#[test]
fn timestamps_scale_with_speed_and_lengths_pad() {
    let recs = [rec(500.0, 10, &[1]), rec(2500.0, 700, &[1])];
    let w = to_workload(&recs, &spec(PromptMode::Tokens)).unwrap();
    assert_eq!(w.sessions[0].at_s, Some(0.0));
    assert_eq!(w.sessions[1].at_s, Some(1.0));
    assert!(w.is_timed());
    let p1 = ids(&w.sessions[1].turns[0].user);
    assert_eq!(p1.len(), 700, "padded past the listed block");
    assert_eq!(p1[..512], block_tokens(5, 1)[..]);
}

#[test]
fn chat_mode_shares_text_prefix() {
    let recs = [rec(0.0, 1024, &[7, 8]), rec(0.0, 600, &[7, 9])];
    let w = to_workload(&recs, &spec(PromptMode::Chat)).unwrap();
    let text = |i: usize| match &w.sessions[i].turns[0].user {
        Content::Text(s) => s.clone(),
        Content::Tokens(_) => panic!("chat mode"),
    };
    let (a, b) = (text(0), text(1));
    assert_eq!(a.split_whitespace().count(), 1024);
    assert_eq!(b.split_whitespace().count(), 600);
    let wa: Vec<_> = a.split_whitespace().collect();
    let wb: Vec<_> = b.split_whitespace().collect();
    assert_eq!(wa[..512], wb[..512]);
}

#[test]
fn parse_reports_bad_lines() {
    let good = "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 2, \"hash_ids\": [1]}\n\n";
    assert_eq!(parse(good, Path::new("t")).unwrap().len(), 1);
    let bad = format!("{good}{{\"timestamp\": 1}}\n");
    match parse(&bad, Path::new("t")) {
        Err(BenchError::Trace { line, .. }) => assert_eq!(line, 3),
        other => panic!("expected a trace error, got {other:?}"),
    }
}

#[test]
fn synthetic_trace_is_seeded_and_shares_prefixes() {
    let s = SynthSpec { requests: 200, rate_per_s: 2.0, roots: 6, seed: 1 };
    let a = synthesize(&s);
    assert_eq!(a, synthesize(&s));
    assert_ne!(a, synthesize(&SynthSpec { seed: 2, ..s.clone() }));
    assert!(a.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
    for r in &a {
        assert!(r.input_length <= r.hash_ids.len() * TRACE_BLOCK);
        assert!(r.input_length > (r.hash_ids.len() - 1) * TRACE_BLOCK);
    }
    let shared = a.iter().filter(|r| a.iter().filter(|o| o.hash_ids[0] == r.hash_ids[0]).count() > 1).count();
    assert!(shared > 150, "most requests share a root, got {shared}");
}

#[test]
fn shipped_sample_trace_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/sample.jsonl");
    let recs = load(&path).unwrap();
    assert!(recs.len() >= 100);
}
