//! The Prometheus text parser the state service runs on every vLLM worker's `/metrics`
//! (`kvroute_state::load::parse`), on arbitrary bytes decoded as the scraper's HTTP client
//! decodes a body (UTF-8, invalid sequences replaced).
//!
//! Oracles beyond "no panic": what `parse_vllm` returns is in range (KV usage in 0..=1, at most
//! as many engines as lines), `samples` yields at most one sample per line, and every label it
//! lists is found by `Sample::label`.
#![no_main]

use kvroute_state::load::parse::{parse_vllm, samples};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let lines = text.lines().count();
    let mut n = 0;
    for s in samples(&text) {
        n += 1;
        for (k, _) in &s.labels {
            let _ = s.label(k).expect("a listed label is found");
        }
    }
    assert!(n <= lines);
    let load = parse_vllm(&text);
    assert!((0.0..=1.0).contains(&load.kv_usage), "{load:?}");
    assert!(load.engines as usize <= lines, "{load:?}");
});
