//! Added latency of the filter, measured (not asserted: these machines are noisy). Run with
//! `cargo test -p kvroute-e2e --test latency -- --ignored --nocapture`.
//!
//! - `added_latency`: sequential small requests straight to a fake worker, through Envoy on a
//!   pass-through path, and through Envoy on an LLM path (body buffering + parse + pick round
//!   trip to a fake state service that answers at once) in both routing modes.
//! - `overhead_vs_round_robin` (the request-path overhead benchmark; figures in `tests/LATENCY.md`):
//!   one Envoy with two listeners in front of the same fake workers (answer at once): a plain
//!   round-robin listener (router only) and the kvroute listener (filter + pick to the REAL
//!   `kvroute-state`, policy kvroute). 1k / 8k / 32k-token prompts as token ids, as text routed
//!   on text chunks (no tokenizer) and as text tokenized by the state service's local tokenizer
//!   (Qwen3 fixture). Then Envoy's memory with and without the module at several `--concurrency`.

use anyhow::Result;
use kvroute_e2e::envoy::{worker_cluster, Envoy, EnvoyOptions, Mode};
use kvroute_e2e::fake::{FakeState, FakeWorker, PickBehavior};
use serde_json::json;
use std::time::Instant;

const N: usize = 400;

async fn measure(client: &reqwest::Client, url: &str, body: &serde_json::Value) -> Result<(f64, f64)> {
    let mut ms = Vec::with_capacity(N);
    for i in 0..N + 20 {
        let t = Instant::now();
        client.post(url).json(body).send().await?.bytes().await?;
        if i >= 20 {
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    Ok((ms[N / 2], ms[N * 99 / 100]))
}

#[tokio::test]
#[ignore = "benchmark: prints figures"]
async fn added_latency() -> Result<()> {
    let workers = [FakeWorker::start("A").await?, FakeWorker::start("B").await?];
    let client = reqwest::Client::new();
    let body = json!({"model": "m", "prompt": "You are a helpful assistant. ".repeat(60), "max_tokens": 4});
    let (p50, p99) = measure(&client, &format!("http://{}/v1/completions", workers[1].addr()), &body).await?;
    println!("direct to worker                 p50 {p50:.3} ms  p99 {p99:.3} ms");
    for mode in [Mode::Endpoint, Mode::Cluster] {
        let state = FakeState::start(PickBehavior::Route { worker: "B".into(), endpoint: workers[1].addr(), cluster: worker_cluster(1) }).await?;
        let envoy = Envoy::start(EnvoyOptions { mode, worker_ports: workers.iter().map(|w| w.port).collect(), state_port: state.port, plugin: json!({}) }).await?;
        let (p50, p99) = measure(&client, &envoy.url("/other"), &body).await?;
        println!("{mode:?}: envoy, pass-through path   p50 {p50:.3} ms  p99 {p99:.3} ms");
        let (p50, p99) = measure(&client, &envoy.url("/v1/completions"), &body).await?;
        println!("{mode:?}: envoy + kvroute pick       p50 {p50:.3} ms  p99 {p99:.3} ms");
    }
    Ok(())
}

/// Pick round trip to the real state service (token-id prompts, 4 workers), as the filter
/// measured it (`kvroute_pick_latency_us`, Envoy's histogram quantiles).
#[tokio::test]
#[ignore = "benchmark: prints figures"]
async fn real_state_service_pick_latency() -> Result<()> {
    use kvroute_e2e::llm::{completion, tokens};
    use kvroute_e2e::stack::{Stack, StackOptions, MODEL};
    let s = Stack::start(StackOptions { workers: 4, time_scale: 0.05, ..StackOptions::default() }).await?;
    for i in 0..300u32 {
        let body = completion(MODEL, &tokens(i % 20, 512), 1, false);
        s.client.post(s.envoy().url("/v1/completions")).json(&body).send().await?.bytes().await?;
    }
    let url = format!("http://127.0.0.1:{}/stats?filter=kvroute_pick_latency_us", s.envoy().admin_port);
    // Envoy publishes histogram quantiles at its stats flush (every 5 s by default).
    let text = kvroute_e2e::net::wait_for("histogram flush", std::time::Duration::from_secs(20), || async {
        let t = reqwest::get(&url).await.ok()?.text().await.ok()?;
        (!t.contains("No recorded values")).then_some(t)
    })
    .await?;
    println!("{text}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Overhead on the request path (filter vs plain Envoy; tests/LATENCY.md).

use kvroute_e2e::envoy::EnvoyExtra;
use kvroute_e2e::llm::{decision_field, tokens};
use kvroute_e2e::net::{free_port, wait_for, wait_http_ok};
use kvroute_e2e::proc::Proc;
use std::path::PathBuf;
use std::time::Duration;

const BENCH_MODEL: &str = "kvroute/bench";
const SIZES: [usize; 3] = [1024, 8192, 32768];
const WARMUP: usize = 50;
/// Per-cell time bound: a cell stops early (and says so) rather than run for minutes.
const CELL_BUDGET: Duration = Duration::from_secs(90);

fn samples_per_cell() -> usize {
    std::env::var("KVROUTE_LATENCY_N").ok().and_then(|v| v.parse().ok()).unwrap_or(500)
}

/// The real state service (release build) configured with the fake workers (endpoint, cluster,
/// vLLM `/metrics`; no KV events). Text prompts: `worker_fallback = false` (fake workers have
/// no `/tokenize`), so they take the local tokenizer when `tokenizer` is given, else text chunks.
struct RealState {
    proc: Proc,
    port: u16,
}

impl RealState {
    async fn start(workers: &[FakeWorker], tokenizer: Option<&PathBuf>) -> Result<RealState> {
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
    async fn sums(&self) -> [f64; 4] {
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
    async fn tokenization_counts(&self) -> String {
        let text = match reqwest::get(format!("http://127.0.0.1:{}/metrics", self.port)).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        text.lines().filter(|l| l.starts_with("kvroute_tokenization_total")).collect::<Vec<_>>().join(", ")
    }
}

/// `target/release/kvroute-state` (`$KVROUTE_STATE_BIN` overrides): the benchmark measures
/// the optimized service. Not built here: `cargo build --release -p kvroute-state` first.
fn state_release_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KVROUTE_STATE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| kvroute_e2e::paths::repo_root().join("target"));
    let bin = target.join("release/kvroute-state");
    anyhow::ensure!(bin.is_file(), "{} missing: run `cargo build --release -p kvroute-state` first", bin.display());
    Ok(bin)
}

#[derive(Copy, Clone, Debug, PartialEq)]
enum PromptKind {
    TokenIds,
    TextChunks,
    TextTokenizer,
    /// A raw ChatML prompt: the same long system message in every request, a distinct 32-word
    /// user message. The tokenizer caches text between special tokens (pieces), so the system
    /// message hits its cache. (A plain text prompt is one piece: any change misses.)
    TextTokenizerShared,
}

impl PromptKind {
    fn label(self) -> &'static str {
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
const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "with", "as", "was", "on", "be", "at", "by", "this", "had", "not",
    "are", "but", "from", "or", "have", "an", "they", "which", "one", "you", "were", "her", "all", "she", "there", "would",
    "their", "we", "him", "been", "has", "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its",
    "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time", "these",
];

fn text_prompt(seed: u32, n: usize) -> String {
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
fn body(kind: PromptKind, seed: u32, n: usize) -> Vec<u8> {
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

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

struct Cell {
    kind: PromptKind,
    tokens: usize,
    body_kib: usize,
    n: usize,
    plain: (f64, f64),
    kvroute: (f64, f64),
    /// Responses on the kvroute listener without a state-service choice (fallback route).
    unrouted: usize,
    /// `total=` blocks of the last decision (x 16 = prompt tokens as the state service keyed them).
    total_blocks: String,
    /// Mean time inside the state service (ms): deciding the pick, tokenizing (0 when it did not).
    state_decide_ms: f64,
    state_tokenize_ms: f64,
}

async fn post(client: &reqwest::Client, url: &str, body: &[u8]) -> Result<(f64, reqwest::header::HeaderMap)> {
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
async fn cell(client: &reqwest::Client, envoy: &Envoy, state: &RealState, kind: PromptKind, n_tokens: usize, n: usize, seed0: u32) -> Result<Cell> {
    let (plain_url, kv_url) = (envoy.plain_url("/v1/completions"), envoy.url("/v1/completions"));
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

fn tokenizer_fixture() -> Option<PathBuf> {
    let out = std::process::Command::new("bash").arg(kvroute_e2e::paths::repo_root().join("tokenize/fetch-tokenizer.sh")).output().ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && dir.join("tokenizer.json").is_file()).then_some(dir)
}

async fn start_envoy(workers: &[FakeWorker], state_port: u16, extra: EnvoyExtra) -> Result<Envoy> {
    Envoy::start_with(
        EnvoyOptions { mode: Mode::Endpoint, worker_ports: workers.iter().map(|w| w.port).collect(), state_port, plugin: json!({}) },
        extra,
    )
    .await
}

struct Mem {
    wasm: bool,
    concurrency: u32,
    rss_idle_kib: u64,
    alloc_idle: u64,
    rss_kib: u64,
    alloc: u64,
    conns_per_thread: Vec<u64>,
    vms: String,
}

async fn stat_u64(envoy: &Envoy, regex: &str) -> u64 {
    envoy.stats(regex).await.ok().and_then(|s| s.first().and_then(|(_, v)| v.parse().ok())).unwrap_or(0)
}

/// Envoy's RSS and `server.memory_allocated` right after start and after traffic on fresh
/// connections (spread over the worker threads) with 1k..32k-token prompts of both kinds.
async fn memory(workers: &[FakeWorker], state_port: u16, wasm: bool, concurrency: u32) -> Result<Mem> {
    let envoy = start_envoy(workers, state_port, EnvoyExtra { concurrency, wasm, ..EnvoyExtra::default() }).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_idle_kib = envoy.rss_kib().unwrap_or(0);
    let alloc_idle = stat_u64(&envoy, "^server\\.memory_allocated$").await;
    let url = envoy.url("/v1/completions");
    for round in 0..(8 * concurrency) {
        // A fresh client = a fresh connection: the kernel spreads them over the worker threads.
        let client = reqwest::Client::builder().pool_max_idle_per_host(0).build()?;
        for (k, kind) in [PromptKind::TokenIds, PromptKind::TextChunks].into_iter().enumerate() {
            for n in SIZES {
                post(&client, &url, &body(kind, 900_000 + round * 10 + k as u32, n)).await?;
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_kib = envoy.rss_kib().unwrap_or(0);
    let alloc = stat_u64(&envoy, "^server\\.memory_allocated$").await;
    let mut conns: Vec<(String, u64)> = envoy
        .stats("worker_[0-9]+\\.downstream_cx_total$")
        .await?
        .into_iter()
        .filter(|(k, _)| k.starts_with("listener.127.0.0.1_"))
        .map(|(k, v)| (k, v.parse().unwrap_or(0)))
        .collect();
    conns.sort();
    let vms = envoy.stats("^wasm\\..*active").await?.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
    Ok(Mem { wasm, concurrency, rss_idle_kib, alloc_idle, rss_kib, alloc, conns_per_thread: conns.into_iter().map(|c| c.1).collect(), vms })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures (tests/LATENCY.md)"]
async fn overhead_vs_round_robin() -> Result<()> {
    let n = samples_per_cell();
    let workers = vec![
        FakeWorker::start_unrecorded("A").await?,
        FakeWorker::start_unrecorded("B").await?,
        FakeWorker::start_unrecorded("C").await?,
        FakeWorker::start_unrecorded("D").await?,
    ];
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let mut cells = Vec::new();
    let mut notes = Vec::new();

    // Stage 1: state service without a tokenizer: token-id prompts and text on text chunks.
    let state = RealState::start(&workers, None).await?;
    {
        let envoy = start_envoy(&workers, state.port, EnvoyExtra { plain_listener: true, ..EnvoyExtra::default() }).await?;
        for kind in [PromptKind::TokenIds, PromptKind::TextChunks] {
            for (s, tokens) in SIZES.iter().enumerate() {
                let c = cell(&client, &envoy, &state, kind, *tokens, n, 1_000_000 * (1 + s as u32) + 100_000 * kind as u32).await?;
                eprintln!("done: {} {} (n {})", kind.label(), tokens, c.n);
                cells.push(c);
            }
        }
        notes.push(format!("state (no tokenizer): {}", state.tokenization_counts().await));
    }

    // Stage 2: the same with the state service's local tokenizer for text prompts.
    match tokenizer_fixture() {
        Some(dir) => {
            let tok_state = RealState::start(&workers, Some(&dir)).await?;
            let envoy = start_envoy(&workers, tok_state.port, EnvoyExtra { plain_listener: true, ..EnvoyExtra::default() }).await?;
            for kind in [PromptKind::TextTokenizer, PromptKind::TextTokenizerShared] {
                for (s, tokens) in SIZES.iter().enumerate() {
                    let c = cell(&client, &envoy, &tok_state, kind, *tokens, n, 5_000_000 * kind as u32 + 1_000_000 * s as u32).await?;
                    eprintln!("done: {} {} (n {})", c.kind.label(), tokens, c.n);
                    cells.push(c);
                }
            }
            notes.push(format!("state (tokenizer {}): {}", dir.display(), tok_state.tokenization_counts().await));
            drop(tok_state.proc);
        }
        None => notes.push("tokenizer fixture unavailable (tokenize/fetch-tokenizer.sh): local-tokenizer cells skipped".into()),
    }

    println!("\n### Added latency (sequential requests, {WARMUP} warm-up, up to {n} measured per cell; ms)\n");
    println!("| prompt | tokens | body KiB | n | round robin p50 | p99 | kvroute p50 | p99 | added p50 | added p99 | state decide mean | state tokenize mean | unrouted | decision total blocks |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in &cells {
        println!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | **{:.3}** | **{:.3}** | {:.3} | {:.3} | {} | {} |",
            c.kind.label(),
            c.tokens,
            c.body_kib,
            c.n,
            c.plain.0,
            c.plain.1,
            c.kvroute.0,
            c.kvroute.1,
            c.kvroute.0 - c.plain.0,
            c.kvroute.1 - c.plain.1,
            c.state_decide_ms,
            c.state_tokenize_ms,
            c.unrouted,
            c.total_blocks
        );
    }
    for note in &notes {
        println!("\n{note}");
    }

    // Memory: the same Envoy config with and without the module, at several --concurrency.
    let mut mems = Vec::new();
    for concurrency in [1, 2, 4] {
        for wasm in [false, true] {
            mems.push(memory(&workers, state.port, wasm, concurrency).await?);
        }
    }
    println!("\n### Envoy memory (after start / after traffic on fresh connections; MiB)\n");
    println!("| module | --concurrency | RSS idle | memory_allocated idle | RSS after traffic | memory_allocated after | connections per worker thread | wasm VMs |");
    println!("|---|---|---|---|---|---|---|---|");
    let mib = |k: u64| k as f64 / 1024.0;
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    for m in &mems {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:?} | {} |",
            if m.wasm { "kvroute" } else { "none" },
            m.concurrency,
            mib(m.rss_idle_kib),
            mb(m.alloc_idle),
            mib(m.rss_kib),
            mb(m.alloc),
            m.conns_per_thread,
            m.vms
        );
    }
    let find = |wasm: bool, c: u32| mems.iter().find(|m| m.wasm == wasm && m.concurrency == c);
    println!("\n| estimate (after traffic) | RSS MiB | memory_allocated MiB |\n|---|---|---|");
    if let (Some(w1), Some(n1)) = (find(true, 1), find(false, 1)) {
        println!(
            "| module, --concurrency 1 (with - without) | {:.1} | {:.1} |",
            mib(w1.rss_kib) - mib(n1.rss_kib),
            mb(w1.alloc) - mb(n1.alloc)
        );
    }
    for (lo, hi) in [(1, 2), (2, 4)] {
        if let (Some(wl), Some(wh), Some(nl), Some(nh)) = (find(true, lo), find(true, hi), find(false, lo), find(false, hi)) {
            let threads = f64::from(hi - lo);
            let per = |h: f64, l: f64| (h - l) / threads;
            println!(
                "| per extra worker thread with the module, {lo}->{hi} | {:.1} | {:.1} |",
                per(mib(wh.rss_kib), mib(wl.rss_kib)),
                per(mb(wh.alloc), mb(wl.alloc))
            );
            println!(
                "| of which the module's share (minus the same without it), {lo}->{hi} | {:.1} | {:.1} |",
                per(mib(wh.rss_kib), mib(wl.rss_kib)) - per(mib(nh.rss_kib), mib(nl.rss_kib)),
                per(mb(wh.alloc), mb(wl.alloc)) - per(mb(nh.alloc), mb(nl.alloc))
            );
        }
    }
    drop(state.proc);
    Ok(())
}

/// Hostile load (issue 12): while `HOSTILE` clients keep posting multi-MiB text picks (each a
/// distinct ~3 MiB prompt for the local tokenizer, the most expensive pick there is), small
/// token-id picks keep flowing. Prints the small picks' round trip p50 / p99 (protobuf, straight
/// to the real state service) before and during, and what became of the hostile ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark: prints figures"]
async fn hostile_load_small_picks_keep_flowing() -> Result<()> {
    use kvroute_core::keys::{text_chunk_keys, token_block_keys, KeyRoot};
    use kvroute_core::wire::PickRequest;
    use prost::Message;
    const HOSTILE: usize = 4;
    const HOSTILE_BYTES: usize = 3 << 20;
    let workers = vec![FakeWorker::start("A").await?, FakeWorker::start("B").await?];
    let Some(tokenizer) = tokenizer_fixture() else {
        println!("skipped: no tokenizer fixture (tokenize/fetch-tokenizer.sh)");
        return Ok(());
    };
    let state = RealState::start(&workers, Some(&tokenizer)).await?;
    let url = format!("http://127.0.0.1:{}/v1/pick", state.port);
    let client = reqwest::Client::new();
    let root = KeyRoot::new(BENCH_MODEL, "");
    let small = |seed: u32| {
        let ids = tokens(seed, 512);
        PickRequest {
            model: BENCH_MODEL.into(),
            token_keys: token_block_keys(&root, &ids, 16).into_iter().map(|k| k.0).collect(),
            block_size: 16,
            prompt_tokens: 512,
            ..PickRequest::default()
        }
        .encode_to_vec()
    };
    let n = samples_per_cell();
    let round = |seed0: u32| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let mut ms = Vec::with_capacity(n);
            for i in 0..n as u32 {
                let t = Instant::now();
                let r = client.post(&url).header("content-type", "application/x-protobuf").body(small(seed0 + i)).send().await?;
                anyhow::ensure!(r.status() == 200, "small pick answered {}", r.status());
                r.bytes().await?;
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            ms.sort_by(f64::total_cmp);
            anyhow::Ok((pct(&ms, 0.5), pct(&ms, 0.99)))
        }
    };
    let (b50, b99) = round(1).await?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hostile: Vec<_> = (0..HOSTILE)
        .map(|h| {
            let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut sent, mut worst_ms) = (0usize, 0f64);
                let mut seed = 10_000 * (h as u32 + 1);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    seed += 1;
                    let text = text_prompt(seed, HOSTILE_BYTES / 5);
                    let keys = text_chunk_keys(&KeyRoot::new(BENCH_MODEL, ""), &text, 256).into_iter().map(|k| k.0).collect();
                    let body = PickRequest {
                        model: BENCH_MODEL.into(),
                        endpoint: kvroute_core::wire::Endpoint::Completions as i32,
                        prompt_bytes: text.len() as u32,
                        prompt_text: text,
                        text_chunk_keys: keys,
                        ..PickRequest::default()
                    }
                    .encode_to_vec();
                    let t = Instant::now();
                    let Ok(r) = client.post(&url).header("content-type", "application/x-protobuf").header("x-kvroute-deadline-ms", "50").body(body).send().await else { continue };
                    let _ = r.bytes().await;
                    worst_ms = worst_ms.max(t.elapsed().as_secs_f64() * 1000.0);
                    sent += 1;
                }
                (sent, worst_ms)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (d50, d99) = round(100_000).await?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut hostile_sent = 0;
    let mut hostile_worst = 0f64;
    for h in hostile {
        let (sent, worst) = h.await?;
        hostile_sent += sent;
        hostile_worst = hostile_worst.max(worst);
    }
    println!("small token-id picks (512 tokens, {n} sequential), round trip to kvroute-state:");
    println!("  alone:                                   p50 {b50:.3} ms  p99 {b99:.3} ms");
    println!("  with {HOSTILE} clients posting {} MiB text picks: p50 {d50:.3} ms  p99 {d99:.3} ms", HOSTILE_BYTES >> 20);
    println!("  hostile picks answered: {hostile_sent}, slowest {hostile_worst:.0} ms; {}", state.tokenization_counts().await);
    Ok(())
}

/// Envoy's own CPU time (user + system, clock ticks of /proc/<pid>/stat) in milliseconds.
fn process_cpu_ms(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) start at the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime, stime: fields 14 and 15 of the whole line, 12 and 13 after the command.
    let hz = 100.0;
    Ok((ticks(11) + ticks(12)) * 1000.0 / hz)
}

/// The request-path cost as the team running the proxy sees it (issue 18): Envoy CPU per
/// streamed request on the kvroute listener vs the same Envoy's plain round-robin listener,
/// same requests, sequential phases, real state service and simulated workers streaming one
/// SSE event per token. Token-id prompts of 1k / 8k / 32k tokens, 100 and 1000 streamed tokens.
/// `KVROUTE_CPU_REQUESTS` (default 60) requests per cell and listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures (tests/LATENCY.md)"]
async fn cpu_per_streamed_request() -> Result<()> {
    use kvroute_e2e::envoy::EnvoyExtra;
    use kvroute_e2e::llm::{completion, tokens};
    use kvroute_e2e::stack::{Stack, StackOptions, MODEL};
    let n: usize = std::env::var("KVROUTE_CPU_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    // KVROUTE_CPU_MODULE=path.wasm measures another build of the filter (an experiment).
    let module = std::env::var_os("KVROUTE_CPU_MODULE").map(std::path::PathBuf::from);
    let envoy = EnvoyExtra { plain_listener: true, module, ..EnvoyExtra::default() };
    let opts = StackOptions { workers: 2, time_scale: 0.01, envoy, ..StackOptions::default() };
    let stack = Stack::start(opts).await?;
    let pid = stack.envoy().proc.pid().ok_or_else(|| anyhow::anyhow!("envoy pid"))?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let kvroute = stack.envoy().url("/v1/completions");
    let plain = stack.envoy().plain_url("/v1/completions");
    println!("\n### Envoy CPU per streamed request (ms; {n} sequential requests per cell and listener)\n");
    println!("| prompt tokens | streamed tokens | plain listener | kvroute, stream with usage | ratio | kvroute, stream without usage | ratio |");
    println!("|---|---|---|---|---|---|---|");
    let mut seed = 7_000_000u32;
    // The simulated workers' max_model_len is 32768: the "32k" prompt leaves room for 1000 tokens.
    let default_cells: Vec<(usize, u32)> = [1024, 8192, 31_744].iter().flat_map(|p| [(*p, 100u32), (*p, 1000)]).collect();
    // KVROUTE_CPU_CELLS=8192:1,8192:100 measures just those (prompt:streamed tokens).
    let cells: Vec<(usize, u32)> = std::env::var("KVROUTE_CPU_CELLS")
        .ok()
        .map(|v| v.split(',').filter_map(|c| c.split_once(':')).filter_map(|(p, o)| Some((p.parse().ok()?, o.parse().ok()?))).collect())
        .unwrap_or(default_cells);
    for (prompt, output) in cells {
        {
            let mut per = [0.0f64; 3];
            // `stream_options.include_usage` (llm::completion sets it): the filter reads the
            // stream for its usage event; without it the stream is only counted.
            for (i, (url, usage)) in [(&plain, true), (&kvroute, true), (&kvroute, false)].into_iter().enumerate() {
                let body_for = |seed: u32| {
                    let mut body = completion(MODEL, &tokens(seed, prompt), output, true);
                    if !usage {
                        body.as_object_mut().map(|o| o.remove("stream_options"));
                    }
                    body
                };
                // Warm-up (JIT, connections), then measure.
                for _ in 0..3 {
                    seed += 1;
                    client.post(url).json(&body_for(seed)).send().await?.bytes().await?;
                }
                let before = process_cpu_ms(pid)?;
                for _ in 0..n {
                    seed += 1;
                    let body = body_for(seed);
                    let resp = client.post(url).json(&body).send().await?;
                    anyhow::ensure!(resp.status().is_success(), "status {}", resp.status());
                    resp.bytes().await?;
                }
                per[i] = (process_cpu_ms(pid)? - before) / n as f64;
            }
            println!("| {prompt} | {output} | {:.2} | {:.2} | {:.2}x | {:.2} | {:.2}x |", per[0], per[1], per[1] / per[0], per[2], per[2] / per[0]);
        }
    }
    Ok(())
}
