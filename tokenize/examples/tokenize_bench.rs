//! Cost of exact chat tokenization + block keys per request, for conversations of about 2k,
//! 8k and 32k tokens: cold (the conversation was never seen) vs warm (the previous turn was
//! encoded, the request adds one assistant reply and one user turn). Reports medians of the
//! parse+render, encode and key steps. Then the same cold requests encoded by 1, 2 and 4
//! threads at once (what a pick's encode costs while other picks encode beside it), and one
//! long fresh user message: cold, and grown by a paragraph after the shorter one was encoded.
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

/// Median ms per cold request when `threads` encode different conversations at once.
fn concurrent_cold(dir: &std::path::Path, inputs: &[String], threads: usize) -> anyhow::Result<f64> {
    let tok = ModelTokenizer::from_dir(dir)?;
    let start = std::sync::Barrier::new(threads);
    let times: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (tok, start) = (&tok, &start);
                s.spawn(move || {
                    start.wait();
                    let mut mine = Sample::default();
                    for input in inputs.iter().skip(t).step_by(threads) {
                        mine.measure(tok, input).expect("encode");
                    }
                    mine.total
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("thread")).collect()
    });
    Ok(median(&times))
}

/// About `bytes` bytes of prose with no added token in it (one piece), like a long pasted
/// document.
fn long_message(seed: u64, bytes: usize) -> String {
    let mut rng = gen::rng(seed);
    let mut text = String::new();
    while text.len() < bytes {
        text.push_str(&gen::text(&mut rng, 8).replace('<', "("));
        text.push_str("\n\n");
    }
    text
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

    println!("\ncold ms per request, median, with N requests encoding at once ({} cores)", std::thread::available_parallelism().map_or(0, |n| n.get()));
    println!("{:>7} | {:>8} {:>8} {:>8}", "tokens", "N=1", "N=2", "N=4");
    for target in [8_000usize, 32_000] {
        let inputs: Vec<String> = (0..8u64).map(|rep| conversation(&tok, target as u64 * 7000 + rep, target).map(|c| c.0)).collect::<Result<_, _>>()?;
        let per = [1, 2, 4].map(|n| concurrent_cold(&dir, &inputs, n));
        println!("{:>7} | {:>8.3} {:>8.3} {:>8.3}", target, per[0].as_ref().map_or(f64::NAN, |v| *v), per[1].as_ref().map_or(f64::NAN, |v| *v), per[2].as_ref().map_or(f64::NAN, |v| *v));
    }

    println!("\none fresh user message: cold, and grown by a paragraph once the shorter one was encoded");
    println!("{:>7} {:>6} | {:>8} {:>8}", "tokens", "bytes", "cold ms", "grown ms");
    for bytes in [32usize << 10, 128 << 10] {
        let (mut cold, mut grown) = (Sample::default(), Sample::default());
        let mut shape = (0, 0);
        for rep in 0..reps {
            let text = long_message(bytes as u64 + rep, bytes);
            let first = json!({"messages": [{"role": "user", "content": text}]}).to_string();
            let next = json!({"messages": [{"role": "user", "content": format!("{text}{}", long_message(rep, 600))}]}).to_string();
            shape = (tok.encode_chat_uncached(&first, Api::ChatCompletions)?.len(), first.len());
            cold.measure(&tok, &first)?;
            grown.measure(&tok, &next)?;
        }
        println!("{:>7} {:>6} | {:>8.3} {:>8.3}", shape.0, shape.1, median(&cold.total), median(&grown.total));
    }
    Ok(())
}
