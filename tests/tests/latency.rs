//! Added latency of the filter, measured (not asserted: these machines are noisy). Run with
//! `cargo test -p kvroute-e2e --test latency -- --ignored --nocapture`.
//!
//! - `added_latency`: sequential small requests straight to a fake worker, through Envoy on a
//!   pass-through path, and through Envoy on an LLM path (body buffering + parse + pick round
//!   trip to a fake state service that answers at once) in both routing modes.
//! - `overhead_vs_round_robin` (the request-path overhead benchmark; figures in `tests/LATENCY.md`;
//!   its parts are in `kvroute_e2e::overhead`):
//!   one Envoy with two listeners in front of the same fake workers (answer at once): a plain
//!   round-robin listener (router only) and the kvroute listener (filter + pick to the REAL
//!   `kvroute-state`, policy kvroute). 1k / 8k / 32k-token prompts as token ids, as text routed
//!   on text chunks (no tokenizer) and as text tokenized by the state service's local tokenizer
//!   (Qwen3 fixture). Then Envoy's memory with and without the module at several `--concurrency`.
//! - `nginx_overhead_vs_plain_location`: the same cells through NGINX with ngx_wasm_module
//!   (`KVROUTE_NGINX`): a kvroute server against the same NGINX's plain server.
//! - `added_latency_split`: where an 8k-token-id request's added latency goes (the pick's round
//!   trip, a bare round trip to the state service, the rest in the filter).
//! - The CPU per streamed request is in `cpu.rs`.

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
use kvroute_e2e::host::{Host, Proxy};
use kvroute_e2e::llm::tokens;
use kvroute_e2e::overhead::{body, cell, pct, post, samples_per_cell, text_prompt, tokenizer_fixture, Cell, PromptKind, RealState, BENCH_MODEL, SIZES, WARMUP};
use std::time::Duration;

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

/// Every cell through `host`: its kvroute route against the same proxy's plain route, in front of
/// the same fake workers. Stage 1: the state service without a tokenizer (token ids, text on
/// text chunks); stage 2: one with the local tokenizer (when the fixture is there).
async fn overhead_cells(host: &Host, workers: &[FakeWorker], n: usize) -> Result<(Vec<Cell>, Vec<String>)> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let (mut cells, mut notes) = (Vec::new(), Vec::new());
    let start = |state_port: u16| {
        let opts = EnvoyOptions { mode: Mode::Endpoint, worker_ports: workers.iter().map(|w| w.port).collect(), state_port, plugin: json!({}) };
        Proxy::start(host, opts, EnvoyExtra { plain_listener: true, ..EnvoyExtra::default() })
    };
    let state = RealState::start(workers, None).await?;
    {
        let proxy = start(state.port).await?;
        for kind in [PromptKind::TokenIds, PromptKind::TextChunks] {
            for (s, tokens) in SIZES.iter().enumerate() {
                let c = cell(&client, &proxy, &state, kind, *tokens, n, 1_000_000 * (1 + s as u32) + 100_000 * kind as u32).await?;
                eprintln!("{host} done: {} {} (n {})", kind.label(), tokens, c.n);
                cells.push(c);
            }
        }
        notes.push(format!("state (no tokenizer): {}", state.tokenization_counts().await));
    }
    match tokenizer_fixture() {
        Some(dir) => {
            let tok_state = RealState::start(workers, Some(&dir)).await?;
            let proxy = start(tok_state.port).await?;
            for kind in [PromptKind::TextTokenizer, PromptKind::TextTokenizerShared] {
                for (s, tokens) in SIZES.iter().enumerate() {
                    let c = cell(&client, &proxy, &tok_state, kind, *tokens, n, 5_000_000 * kind as u32 + 1_000_000 * s as u32).await?;
                    eprintln!("{host} done: {} {} (n {})", c.kind.label(), tokens, c.n);
                    cells.push(c);
                }
            }
            notes.push(format!("state (tokenizer {}): {}", dir.display(), tok_state.tokenization_counts().await));
        }
        None => notes.push("tokenizer fixture unavailable (tokenize/fetch-tokenizer.sh): local-tokenizer cells skipped".into()),
    }
    Ok((cells, notes))
}

fn print_cells(host: &Host, cells: &[Cell], notes: &[String], n: usize) {
    println!("\n### Added latency through {host} (sequential requests, {WARMUP} warm-up, up to {n} measured per cell; ms)\n");
    println!("| prompt | tokens | body KiB | n | plain p50 | p99 | kvroute p50 | p99 | added p50 | added p99 | state decide mean | state tokenize mean | unrouted | decision total blocks |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in cells {
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
    for note in notes {
        println!("\n{note}");
    }
}

async fn four_workers() -> Result<Vec<FakeWorker>> {
    let mut workers = Vec::new();
    for name in ["A", "B", "C", "D"] {
        workers.push(FakeWorker::start_unrecorded(name).await?);
    }
    Ok(workers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures (tests/LATENCY.md)"]
async fn overhead_vs_round_robin() -> Result<()> {
    let n = samples_per_cell();
    let workers = four_workers().await?;
    let (cells, notes) = overhead_cells(&Host::Envoy, &workers, n).await?;
    print_cells(&Host::Envoy, &cells, &notes, n);
    let state = RealState::start(&workers, None).await?;

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

/// Where the added latency of an 8k-token-id request goes (tests/LATENCY.md, "Where the added
/// p50 goes"). One sequential client, the four measurements interleaved request by request:
/// - Envoy's plain listener and its kvroute listener (added = kvroute - plain, as above);
/// - `GET /healthz` straight to `kvroute-state`: one loopback HTTP round trip to that server,
///   with no work in it (the floor of any out-of-process pick here);
/// - the filter's pick (a `PickRequest` with the prompt's 512 block keys, protobuf) straight to
///   `kvroute-state`;
///
/// and the filter's own pick round trip (its `kvroute_pick_latency_us` histogram, mean over the
/// measured requests): kvroute - plain - that round trip is the filter's work in the VM and
/// Envoy's pause and resume around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures"]
async fn added_latency_split() -> Result<()> {
    use kvroute_core::keys::{token_block_keys, KeyRoot};
    use kvroute_core::wire::{Endpoint, PickRequest};
    use prost::Message;
    const TOKENS: usize = 8192;
    let n = samples_per_cell();
    let workers = four_workers().await?;
    let state = RealState::start(&workers, None).await?;
    let opts = EnvoyOptions { mode: Mode::Endpoint, worker_ports: workers.iter().map(|w| w.port).collect(), state_port: state.port, plugin: json!({}) };
    // `KVROUTE_LATENCY_MODULE=/path.wasm`: another build of the filter (to compare two).
    let module = std::env::var_os("KVROUTE_LATENCY_MODULE").map(std::path::PathBuf::from);
    let envoy = Envoy::start_with(opts, EnvoyExtra { plain_listener: true, module, ..EnvoyExtra::default() }).await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let (plain_url, kv_url) = (envoy.plain_url("/v1/completions"), envoy.url("/v1/completions"));
    let (health_url, pick_url) = (format!("http://127.0.0.1:{}/healthz", state.port), format!("http://127.0.0.1:{}/v1/pick", state.port));
    let root = KeyRoot::new(BENCH_MODEL, "");
    let direct_pick = |seed: u32| {
        let ids = tokens(seed, TOKENS);
        PickRequest {
            model: BENCH_MODEL.into(),
            endpoint: Endpoint::Completions as i32,
            token_keys: token_block_keys(&root, &ids, 16).into_iter().map(|k| k.0).collect(),
            block_size: 16,
            prompt_tokens: TOKENS as u32,
            max_tokens: 1,
            ..PickRequest::default()
        }
        .encode_to_vec()
    };
    let timed = |req: reqwest::RequestBuilder| async move {
        let t = Instant::now();
        let r = req.send().await?;
        anyhow::ensure!(r.status().is_success(), "answered {}", r.status());
        r.bytes().await?;
        anyhow::Ok(t.elapsed().as_secs_f64() * 1000.0)
    };
    let mut ms: [Vec<f64>; 4] = Default::default();
    let mut filter_before = (0.0, 0.0);
    for i in 0..WARMUP + n {
        let seed = 9_000_000 + i as u32;
        let json = body(PromptKind::TokenIds, seed, TOKENS);
        let proto = direct_pick(seed + 500_000);
        // A different order each request, so that no measurement always follows another.
        let mut order = [0usize, 1, 2, 3];
        order.rotate_left(i % 4);
        for which in order {
            let t = match which {
                0 => timed(client.post(&plain_url).header("content-type", "application/json").body(json.clone())).await?,
                1 => timed(client.post(&kv_url).header("content-type", "application/json").body(json.clone())).await?,
                2 => timed(client.get(&health_url)).await?,
                _ => timed(client.post(&pick_url).header("content-type", "application/x-protobuf").body(proto.clone())).await?,
            };
            if i >= WARMUP {
                ms[which].push(t);
            }
        }
        if i + 1 == WARMUP {
            filter_before = filter_pick_sums(&envoy).await?;
        }
    }
    let filter_after = filter_pick_sums(&envoy).await?;
    let picks = filter_after.1 - filter_before.1;
    let filter_rtt_ms = if picks > 0.0 { (filter_after.0 - filter_before.0) / picks / 1000.0 } else { f64::NAN };
    for m in &mut ms {
        m.sort_by(f64::total_cmp);
    }
    let p50 = |m: &[f64]| pct(m, 0.5);
    let mean = |m: &[f64]| m.iter().sum::<f64>() / m.len().max(1) as f64;
    println!("\n### Added latency split, {TOKENS} token ids, {} requests each (ms)\n", ms[0].len());
    println!("| measurement | p50 | mean | p99 |\n|---|---|---|---|");
    for (label, m) in ["Envoy plain listener", "Envoy kvroute listener", "GET /healthz straight to kvroute-state", "the pick straight to kvroute-state"].iter().zip(&ms) {
        println!("| {label} | {:.3} | {:.3} | {:.3} |", p50(m), mean(m), pct(m, 0.99));
    }
    println!("| added (kvroute - plain) | {:.3} | {:.3} | |", p50(&ms[1]) - p50(&ms[0]), mean(&ms[1]) - mean(&ms[0]));
    println!("| the filter's pick round trip (its histogram, {picks} picks) | | {filter_rtt_ms:.3} | |");
    println!("| the rest: filter work in the VM, pause and resume (added mean - round trip) | | {:.3} | |", mean(&ms[1]) - mean(&ms[0]) - filter_rtt_ms);
    drop(envoy);
    drop(state.proc);
    Ok(())
}

/// The filter's `kvroute_pick_latency_us` (sum µs, count) from Envoy's Prometheus stats, after
/// Envoy's next stats flush (histograms are merged every 5 s).
async fn filter_pick_sums(envoy: &Envoy) -> Result<(f64, f64)> {
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    let url = format!("http://127.0.0.1:{}/stats/prometheus", envoy.admin_port);
    let text = reqwest::get(&url).await?.text().await?;
    let value = |suffix: &str| {
        text.lines()
            .filter(|l| l.contains(&format!("kvroute_pick_latency_us_{suffix}")) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    Ok((value("sum"), value("count")))
}

/// The same cells through NGINX with ngx_wasm_module (`KVROUTE_NGINX`): the kvroute server
/// (filter + pick to the real state service, `proxy_pass` to the chosen worker) against the same
/// NGINX's plain server (`proxy_pass http://workers_default`, no filter, NGINX's round robin)
/// in front of the same fake workers (tests/LATENCY.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures (tests/LATENCY.md)"]
async fn nginx_overhead_vs_plain_location() -> Result<()> {
    let Some(bin) = kvroute_e2e::nginx::binary() else {
        println!("{}", kvroute_e2e::nginx::SKIP);
        return Ok(());
    };
    let n = samples_per_cell();
    let workers = four_workers().await?;
    let host = Host::Nginx(bin);
    let (cells, notes) = overhead_cells(&host, &workers, n).await?;
    print_cells(&host, &cells, &notes, n);
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

/// The sensitivity classifier's cost on the request path: the same text prompts (1k / 8k /
/// 32k tokens, no secrets in them, so every byte is scanned and nothing is pooled) through two
/// Envoys in front of the same state service and fake workers, one with `sensitivity` on and
/// one without, requests alternating between them. Figures in `bench/README.md` ("The
/// sensitivity classifier").
#[tokio::test]
#[ignore = "benchmark: prints figures"]
async fn classifier_cost_through_envoy() -> Result<()> {
    let n = samples_per_cell();
    let workers = four_workers().await?;
    let state = RealState::start(&workers, None).await?;
    let start = |plugin: serde_json::Value| {
        let opts = EnvoyOptions { mode: Mode::Endpoint, worker_ports: workers.iter().map(|w| w.port).collect(), state_port: state.port, plugin };
        Envoy::start_with(opts, EnvoyExtra::default())
    };
    let off = start(json!({})).await?;
    let on = start(json!({ "sensitivity": { "pool": "restricted" } })).await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    println!("\n### The classifier through Envoy (Wasm, V8), sequential text requests, {WARMUP} warm-up, {n} measured per size; ms\n");
    println!("| tokens | body KiB | classifier off p50 | p99 | on p50 | p99 | added p50 | added p99 | added p50 per KiB (us) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (s, tokens) in SIZES.iter().enumerate() {
        let (mut a, mut b, mut kib) = (Vec::new(), Vec::new(), 0);
        for i in 0..WARMUP + n {
            let bytes = body(PromptKind::TextChunks, 7_000_000 + 1_000_000 * s as u32 + i as u32, *tokens);
            kib = bytes.len() / 1024;
            let (ta, tb) = if i % 2 == 0 {
                let ta = post(&client, &off.url("/v1/completions"), &bytes).await?.0;
                (ta, post(&client, &on.url("/v1/completions"), &bytes).await?.0)
            } else {
                let tb = post(&client, &on.url("/v1/completions"), &bytes).await?.0;
                (post(&client, &off.url("/v1/completions"), &bytes).await?.0, tb)
            };
            if i >= WARMUP {
                a.push(ta);
                b.push(tb);
            }
        }
        a.sort_by(|x, y| x.total_cmp(y));
        b.sort_by(|x, y| x.total_cmp(y));
        let (p50, p99) = (pct(&b, 0.5) - pct(&a, 0.5), pct(&b, 0.99) - pct(&a, 0.99));
        println!(
            "| {} | {kib} | {:.3} | {:.3} | {:.3} | {:.3} | **{p50:.3}** | **{p99:.3}** | {:.1} |",
            tokens,
            pct(&a, 0.5),
            pct(&a, 0.99),
            pct(&b, 0.5),
            pct(&b, 0.99),
            p50 * 1000.0 / kib.max(1) as f64
        );
    }
    println!("\nrequests the classifier marked sensitive: {} (expected 0: plain text)", on.counter("kvroute_sensitive").await?);
    Ok(())
}
