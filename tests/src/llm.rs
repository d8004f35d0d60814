//! Request helpers for the end-to-end tests: deterministic token-id prompts (exact keys, no
//! tokenizer involved) and the routing facts a response carries.

use serde_json::{json, Value};

/// `n` token ids that differ for every `seed` (and never collide across seeds in practice).
pub fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 1000 + (seed.wrapping_mul(7919).wrapping_add(i.wrapping_mul(104_729))) % 100_000).collect()
}

pub fn concat(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut v = a.to_vec();
    v.extend_from_slice(b);
    v
}

/// A `/v1/completions` body with a token-id prompt.
pub fn completion(model: &str, prompt: &[u32], max_tokens: u32, stream: bool) -> Value {
    json!({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, "ignore_eos": true,
           "stream_options": {"include_usage": true}})
}

/// A response header as a string ("" when absent).
pub fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

/// One field of `x-kvroute-decision` (`worker=..;matched=..;...`).
pub fn decision_field(decision: &str, key: &str) -> Option<String> {
    decision.split(';').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v.to_string()))
}
