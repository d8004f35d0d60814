//! Cost of exact chat tokenization + block keys per request, for conversations of about 2k,
//! 8k and 32k tokens: cold (the conversation was never seen) vs warm (the previous turn was
//! encoded, the request adds one assistant reply and one user turn). Reports medians of the
//! parse+render, encode and key steps.
//!
//! cargo run -p kvroute-tokenize --release --example tokenize_bench
//! (KVROUTE_TOKENIZER_DIR=<dir with tokenizer.json> to skip the fixture fetch)

#[path = "../tests/common/gen.rs"]
#[allow(dead_code)]
mod gen;

use kvroute_tokenize::{block_keys, Api, ModelTokenizer};
use serde_json::{json, Value as Json};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The allocator `kvroute-state` runs on.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn tokenizer_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("KVROUTE_TOKENIZER_DIR") {
        return Ok(PathBuf::from(d));
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fetch-tokenizer.sh");
    let out = std::process::Command::new("bash").arg(script).output()?;
    anyhow::ensure!(out.status.success(), "fetch-tokenizer.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A conversation of at least `target` tokens ending with a user turn, and its next turn.
fn conversation(tok: &ModelTokenizer, seed: u64, target: usize) -> anyhow::Result<(String, String, usize)> {
    let mut rng = gen::rng(seed);
    let mut messages = vec![json!({"role": "system", "content": gen::text(&mut rng, 6)})];
    loop {
        messages.push(json!({"role": "user", "content": gen::text(&mut rng, 12)}));
        let input = json!({"messages": messages}).to_string();
        let n = tok.encode_chat_uncached(&input, Api::ChatCompletions)?.len();
        if n >= target {
            let mut next = messages.clone();
            next.push(json!({"role": "assistant", "content": gen::text(&mut rng, 10)}));
            next.push(json!({"role": "user", "content": gen::text(&mut rng, 4)}));
            return Ok((input, json!({"messages": Json::Array(next)}).to_string(), n));
        }
        messages.push(json!({"role": "assistant", "content": gen::text(&mut rng, 12)}));
    }
}

#[derive(Default)]
struct Sample {
    render: Vec<Duration>,
    encode: Vec<Duration>,
    keys: Vec<Duration>,
    total: Vec<Duration>,
}

impl Sample {
    fn measure(&mut self, tok: &ModelTokenizer, input: &str) -> anyhow::Result<()> {
        let t0 = Instant::now();
        let rendered = tok.render_chat(input, Api::ChatCompletions)?;
        let t1 = Instant::now();
        let ids = tok.encoder().encode(&rendered.text)?;
        let t2 = Instant::now();
        let keys = block_keys("Qwen/Qwen3-8B", "", &ids, 16);
        let t3 = Instant::now();
        std::hint::black_box(keys);
        self.render.push(t1 - t0);
        self.encode.push(t2 - t1);
        self.keys.push(t3 - t2);
        self.total.push(t3 - t0);
        Ok(())
    }
}

fn median(v: &[Duration]) -> f64 {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).map(|d| d.as_secs_f64() * 1e3).unwrap_or(f64::NAN)
}

fn main() -> anyhow::Result<()> {
    let dir = tokenizer_dir()?;
    let tok = ModelTokenizer::from_dir(&dir)?;
    let reps = 7u64;
    println!("{:>7} {:>6} | {:>8} {:>8} {:>8} {:>9} | {:>8} {:>8} {:>8} {:>9}", "tokens", "bytes", "cold ms", "render", "encode", "keys", "warm ms", "render", "encode", "keys");
    for target in [2_000usize, 8_000, 32_000] {
        let (mut cold, mut warm) = (Sample::default(), Sample::default());
        let mut shape = (0, 0);
        for rep in 0..reps {
            let (first, next, n) = conversation(&tok, target as u64 * 1000 + rep, target)?;
            shape = (n, first.len());
            cold.measure(&tok, &first)?;
            warm.measure(&tok, &next)?;
        }
        println!(
            "{:>7} {:>6} | {:>8.3} {:>8.3} {:>8.3} {:>9.4} | {:>8.3} {:>8.3} {:>8.3} {:>9.4}",
            shape.0, shape.1,
            median(&cold.total), median(&cold.render), median(&cold.encode), median(&cold.keys),
            median(&warm.total), median(&warm.render), median(&warm.encode), median(&warm.keys),
        );
    }
    let s = tok.cache_stats();
    println!("cache: {} entries, {} KiB, hits {} misses {}", s.entries, s.bytes / 1024, s.hits, s.misses);
    Ok(())
}
