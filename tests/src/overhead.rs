//! Shared parts of the request-path overhead benchmarks (`tests/tests/latency.rs`, figures in
//! `tests/LATENCY.md`): the real state service configured for fake workers, the prompts, and
//! one measured cell (sequential requests alternating between a proxy's plain route and its
//! kvroute route, so both see the same machine load). The proxy is Envoy or NGINX: a cell takes
//! the two URLs.

use crate::envoy::worker_cluster;
use crate::fake::FakeWorker;
use crate::llm::{decision_field, tokens};
use crate::net::{free_port, wait_for, wait_http_ok};
use crate::proc::Proc;
use anyhow::Result;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub const BENCH_MODEL: &str = "kvroute/bench";
pub const SIZES: [usize; 3] = [1024, 8192, 32768];
pub const WARMUP: usize = 50;
/// Per-cell time bound: a cell stops early (and says so) rather than run for minutes.
pub const CELL_BUDGET: Duration = Duration::from_secs(90);

pub fn samples_per_cell() -> usize {
    std::env::var("KVROUTE_LATENCY_N").ok().and_then(|v| v.parse().ok()).unwrap_or(500)
}

/// The real state service (release build) configured with the fake workers (endpoint, cluster,
/// vLLM `/metrics`; no KV events). Text prompts: `worker_fallback = false` (fake workers have
/// no `/tokenize`), so they take the local tokenizer when `tokenizer` is given, else text chunks.
pub struct RealState {
    pub proc: Proc,
    pub port: u16,
}

impl RealState {
    pub async fn start(workers: &[FakeWorker], tokenizer: Option<&PathBuf>) -> Result<RealState> {
        let port = free_port();
        let mut toml = format!(
            "listen = \"127.0.0.1:{port}\"\npolicy = \"kvroute\"\nseed = 7\n\n[tokenization]\nworker_fallback = false\n\n\
             [models.\"{BENCH_MODEL}\"]\nblock_size = 16\n"
        );
        if let Some(dir) = tokenizer {
            toml.push_str(&format!("tokenizer_dir = {:?}\n", dir.display().to_string()));
        }
        for (i, w) in workers.iter().enumerate() {
            toml.push_str(&format!(
                "\n[[workers]]\nid = \"{}\"\nmodel = \"{BENCH_MODEL}\"\nendpoint = \"{}\"\ncluster = \"{}\"\nmetrics_url = \"http://{}/metrics\"\n",
                w.name,
                w.addr(),
                worker_cluster(i),
                w.addr()
            ));
        }
        let config = std::env::temp_dir().join(format!("kvroute-e2e-latency-state-{port}.toml"));
        std::fs::write(&config, toml)?;
        let bin = state_release_bin()?;
        let mut proc = Proc::spawn("state", &bin, &["--config".to_string(), config.display().to_string()])?;
        if let Err(e) = wait_http_ok(&format!("http://127.0.0.1:{port}/readyz"), Duration::from_secs(60)).await {
            proc.check_alive()?;
            return Err(e);
        }
        let n = workers.len();
        let url = format!("http://127.0.0.1:{port}/v1/workers");
        wait_for("every fake worker healthy in kvroute-state", Duration::from_secs(30), || async {
            let v: serde_json::Value = reqwest::get(&url).await.ok()?.json().await.ok()?;
            let healthy = v["workers"].as_array()?.iter().filter(|w| w["healthy"].as_bool() == Some(true)).count();
            (healthy == n).then_some(())
        })
        .await?;
        Ok(RealState { proc, port })
    }

    /// (pick decision seconds, picks, tokenization seconds, tokenizations) so far, from the
    /// `kvroute_pick_latency_seconds` and `kvroute_tokenize_seconds` histograms (all labels).
    pub async fn sums(&self) -> [f64; 4] {
        let text = match reqwest::get(format!("http://127.0.0.1:{}/metrics", self.port)).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let total = |name: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        [
            total("kvroute_pick_latency_seconds_sum"),
            total("kvroute_pick_latency_seconds_count"),
            total("kvroute_tokenize_seconds_sum"),
            total("kvroute_tokenize_seconds_count"),
        ]
    }

    /// `kvroute_tokenization_total` lines of the state service's metrics.
    pub async fn tokenization_counts(&self) -> String {
        let text = match reqwest::get(format!("http://127.0.0.1:{}/metrics", self.port)).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        text.lines().filter(|l| l.starts_with("kvroute_tokenization_total")).collect::<Vec<_>>().join(", ")
    }
}

/// `target/release/kvroute-state` (`$KVROUTE_STATE_BIN` overrides): the benchmark measures
/// the optimized service. Not built here: `cargo build --release -p kvroute-state` first.
pub fn state_release_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KVROUTE_STATE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| crate::paths::repo_root().join("target"));
    let bin = target.join("release/kvroute-state");
    anyhow::ensure!(bin.is_file(), "{} missing: run `cargo build --release -p kvroute-state` first", bin.display());
    Ok(bin)
}

#[derive(Copy, Clone, Debug, PartialEq)]
pub enum PromptKind {
    TokenIds,
    TextChunks,
    TextTokenizer,
    /// A raw ChatML prompt: the same long system message in every request, a distinct 32-word
    /// user message. The tokenizer caches text between special tokens (pieces), so the system
    /// message hits its cache. (A plain text prompt is one piece: any change misses.)
    TextTokenizerShared,
}

impl PromptKind {
    pub fn label(self) -> &'static str {
        match self {
            PromptKind::TokenIds => "token ids",
            PromptKind::TextChunks => "text (text chunks)",
            PromptKind::TextTokenizer => "text (local tokenizer)",
            PromptKind::TextTokenizerShared => "text (local tokenizer, ChatML, shared system message)",
        }
    }
}

/// Common English words, each one token with its leading space in Qwen3/GPT-style BPE, so
/// `n` words are about `n` tokens (the tokenizer cells print the state service's count).
pub const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "with", "as", "was", "on", "be", "at", "by", "this", "had", "not",
    "are", "but", "from", "or", "have", "an", "they", "which", "one", "you", "were", "her", "all", "she", "there", "would",
    "their", "we", "him", "been", "has", "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its",
    "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time", "these",
];

pub fn text_prompt(seed: u32, n: usize) -> String {
    let mut x = u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut s = String::with_capacity(n * 5);
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push(' ');
        s.push_str(WORDS[(x >> 58) as usize]);
    }
    s
}

/// A distinct prompt per request: the fake workers publish no KV events, so every pick is a
/// full-length lookup that finds nothing (only the state service's own speculative credit),
/// plus scoring. `TextTokenizerShared` prompts differ only in their user message.
pub fn body(kind: PromptKind, seed: u32, n: usize) -> Vec<u8> {
    let prompt = match kind {
        PromptKind::TokenIds => json!(tokens(seed, n)),
        PromptKind::TextTokenizerShared => json!(format!(
            "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
            text_prompt(7, n - 48),
            text_prompt(seed, 32)
        )),
        _ => json!(text_prompt(seed, n)),
    };
    serde_json::to_vec(&json!({"model": BENCH_MODEL, "prompt": prompt, "max_tokens": 1})).unwrap_or_default()
}

pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub struct Cell {
    pub kind: PromptKind,
    pub tokens: usize,
    pub body_kib: usize,
    pub n: usize,
    pub plain: (f64, f64),
    pub kvroute: (f64, f64),
    /// Responses on the kvroute listener without a state-service choice (fallback route).
    pub unrouted: usize,
    /// `total=` blocks of the last decision (x 16 = prompt tokens as the state service keyed them).
    pub total_blocks: String,
    /// Mean time inside the state service (ms): deciding the pick, tokenizing (0 when it did not).
    pub state_decide_ms: f64,
    pub state_tokenize_ms: f64,
}

pub async fn post(client: &reqwest::Client, url: &str, body: &[u8]) -> Result<(f64, reqwest::header::HeaderMap)> {
    let t = Instant::now();
    let r = client.post(url).header("content-type", "application/json").body(body.to_vec()).send().await?;
    let status = r.status();
    let headers = r.headers().clone();
    r.bytes().await?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(status.is_success(), "{url}: {status}");
    Ok((ms, headers))
}

/// Sequential requests alternating between the plain and the kvroute listener (order swapped
/// every request), so both see the same machine load over the run.
pub async fn cell(client: &reqwest::Client, proxy: &crate::host::Proxy, state: &RealState, kind: PromptKind, n_tokens: usize, n: usize, seed0: u32) -> Result<Cell> {
    let (plain_url, kv_url) = (proxy.plain_url("/v1/completions"), proxy.url("/v1/completions"));
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut unrouted, mut total_blocks, mut body_kib) = (0, String::new(), 0);
    let start = Instant::now();
    let mut before = [0.0; 4];
    for i in 0..WARMUP + n {
        let bytes = body(kind, seed0 + i as u32, n_tokens);
        body_kib = bytes.len() / 1024;
        let kv_first = i % 2 == 1;
        let (ta, (tb, h)) = if kv_first {
            let kv = post(client, &kv_url, &bytes).await?;
            (post(client, &plain_url, &bytes).await?.0, kv)
        } else {
            let plain = post(client, &plain_url, &bytes).await?.0;
            (plain, post(client, &kv_url, &bytes).await?)
        };
        let decision = h.get("x-kvroute-decision").and_then(|v| v.to_str().ok()).unwrap_or("");
        if decision_field(decision, "worker").unwrap_or_default().is_empty() {
            unrouted += 1;
        }
        total_blocks = decision_field(decision, "total").unwrap_or_default();
        if i + 1 == WARMUP {
            before = state.sums().await;
        }
        if i >= WARMUP {
            a.push(ta);
            b.push(tb);
            if start.elapsed() > CELL_BUDGET {
                break;
            }
        }
    }
    let after = state.sums().await;
    let mean_ms = |sum: usize, count: usize| {
        let c = after[count] - before[count];
        if c > 0.0 { (after[sum] - before[sum]) / c * 1000.0 } else { 0.0 }
    };
    a.sort_by(|x, y| x.total_cmp(y));
    b.sort_by(|x, y| x.total_cmp(y));
    Ok(Cell {
        state_decide_ms: mean_ms(0, 1),
        state_tokenize_ms: mean_ms(2, 3),
        kind,
        tokens: n_tokens,
        body_kib,
        n: a.len(),
        plain: (pct(&a, 0.5), pct(&a, 0.99)),
        kvroute: (pct(&b, 0.5), pct(&b, 0.99)),
        unrouted,
        total_blocks,
    })
}

pub fn tokenizer_fixture() -> Option<PathBuf> {
    let out = std::process::Command::new("bash").arg(crate::paths::repo_root().join("tokenize/fetch-tokenizer.sh")).output().ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && dir.join("tokenizer.json").is_file()).then_some(dir)
}
