use super::*;

fn s(ttft: Option<f64>, e2e: Option<f64>) -> Sample {
    Sample { ttft_s: ttft, e2e_s: e2e, ok: ttft.is_some(), output_tokens: 10, ..Default::default() }
}

#[test]
fn percentile_interpolates_between_ranks() {
    let v = [1.0, 2.0, 3.0, 4.0];
    assert_eq!(percentile(&v, 50.0), Some(2.5));
    assert_eq!(percentile(&v, 0.0), Some(1.0));
    assert_eq!(percentile(&v, 100.0), Some(4.0));
    assert!((percentile(&v, 90.0).unwrap() - 3.7).abs() < 1e-12);
    assert_eq!(percentile(&[5.0], 99.0), Some(5.0));
    assert_eq!(percentile(&[], 50.0), None);
    let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
    assert!((percentile(&hundred, 99.0).unwrap() - 99.01).abs() < 1e-9);
}

#[test]
fn goodput_counts_requests_within_slo_per_minute() {
    let slo = Slo { ttft_s: 1.0, attainment: 0.9 };
    let samples: Vec<Sample> = (0..10).map(|i| s(Some(if i < 9 { 0.5 } else { 2.0 }), Some(3.0))).collect();
    let g = goodput(&samples, 30.0, slo);
    assert!((g.per_min - 18.0).abs() < 1e-9, "9 good in 30 s = 18/min");
    assert!((g.within_slo - 0.9).abs() < 1e-12);
    assert!(g.slo_met);
}

#[test]
fn failures_count_against_goodput_not_latency() {
    let slo = Slo { ttft_s: 1.0, attainment: 0.9 };
    let mut samples: Vec<Sample> = (0..8).map(|_| s(Some(0.5), Some(1.0))).collect();
    samples.push(s(None, None));
    samples.push(s(None, None));
    let sum = Summary::new(&samples, 60.0, slo);
    assert_eq!(sum.failed, 2);
    assert_eq!(sum.ttft_p99, Some(0.5));
    assert!((sum.goodput.within_slo - 0.8).abs() < 1e-12);
    assert!(!sum.goodput.slo_met);
    assert!((sum.goodput.per_min - 8.0).abs() < 1e-9);
    assert!((sum.output_tokens_per_s - 80.0 / 60.0).abs() < 1e-9);
}

#[test]
fn empty_and_degraded() {
    let sum = Summary::new(&[], 0.0, Slo::default());
    assert_eq!(sum.ttft_p50, None);
    assert_eq!(sum.goodput.per_min, 0.0);
    let mut a = s(Some(0.1), Some(0.2));
    a.fallback = Some("state_unavailable".into());
    let mut b = s(Some(0.1), Some(0.2));
    b.decision = Some("worker=w2;matched=0;policy=kvroute;degraded=none".into());
    assert!(is_degraded(&a));
    assert!(!is_degraded(&b));
    b.decision = Some("worker=w2;policy=kvroute;degraded=stale_events".into());
    assert!(is_degraded(&b));
}

#[test]
fn cdf_is_monotone_and_ends_at_one() {
    let samples = [s(Some(3.0), None), s(Some(1.0), None), s(None, None), s(Some(2.0), None)];
    let cdf = ttft_cdf(&samples);
    assert_eq!(cdf, vec![(1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]);
}

fn routed(decision: &str, prompt_tokens: u32, cached: Option<u32>) -> Sample {
    Sample { ttft_s: Some(1.0), ok: true, prompt_tokens, cached_tokens: cached, decision: Some(decision.into()), ..Default::default() }
}

#[test]
fn promised_counts_what_the_index_said_and_the_engine_did_not_serve() {
    let exact = "worker=w0;matched=10;total=12;ttft_ms=5.0;policy=kvroute;tokenization=exact_token_ids;degraded=none";
    let samples = [
        // 160 promised, 160 served.
        routed(exact, 200, Some(160)),
        // 160 promised, 96 served: 64 gone, one request short.
        routed(exact, 200, Some(96)),
        // A fully cached 160-token prompt: its last block is recomputed, 144 promised.
        routed(exact, 160, Some(144)),
        // Not counted: text chunks (keys are not blocks), no usage, a failed request.
        routed(&exact.replace("exact_token_ids", "text_chunks"), 200, Some(0)),
        routed(exact, 200, None),
        Sample { ok: false, ..routed(exact, 200, Some(0)) },
    ];
    let p = Promised::of(&samples, 16).unwrap();
    assert_eq!(p, Promised { requests: 3, promised_tokens: 464, gone_tokens: 64, requests_short: 1 });
    assert!((p.gone_share().unwrap() - 64.0 / 464.0).abs() < 1e-12);
    // More served than promised (another request warmed it meanwhile) is not negative.
    let warmed = Promised::of(&[routed(exact, 400, Some(320))], 16).unwrap();
    assert_eq!((warmed.gone_tokens, warmed.requests_short), (0, 0));
    assert_eq!(Promised::of(&samples[3..], 16), None);
    assert_eq!(Promised { requests: 1, ..Promised::default() }.gone_share(), None);
}

#[test]
fn keying_counts_exact_picks_and_text_chunks_by_why() {
    let with = |decision: &str| Sample { decision: Some(decision.into()), ok: true, ..Default::default() };
    let samples = vec![
        with("policy=kvroute;tokenization=local;degraded=none"),
        with("worker=w0;matched=1;total=2;ttft_ms=5.0;policy=kvroute;tokenization=exact_token_ids;degraded=none"),
        with("policy=kvroute;tokenization=text_chunks;degraded=tokenize_deadline"),
        with("policy=kvroute;tokenization=text_chunks;degraded=tokenize_deadline"),
        with("policy=kvroute;tokenization=none;degraded=none"),
        Sample::default(),
    ];
    let k = Keying::of(&samples).expect("decisions");
    assert_eq!(k.cell(), "2 exact, 2 tokenize_deadline, 1 unkeyed");
    assert_eq!(Keying::of(&[Sample::default()]), None);
}
