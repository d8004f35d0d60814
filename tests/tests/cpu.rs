//! Envoy CPU per streamed request (issue 18; figures in `tests/LATENCY.md`), measured, not
//! asserted. Run with `cargo test -p kvroute-e2e --release --test cpu -- --ignored --nocapture`.

use anyhow::Result;
use std::time::Duration;

/// Envoy's own CPU time in milliseconds: the sum over its threads of the nanoseconds each ran
/// (`/proc/<pid>/task/*/schedstat`, first field), far finer than the 10 ms ticks of `stat`.
fn process_cpu_ms(pid: u32) -> Result<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        // A thread that exits between the listing and the read has nothing left to count.
        let Ok(stat) = std::fs::read_to_string(task?.path().join("schedstat")) else { continue };
        ns += stat.split_whitespace().next().and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    }
    Ok(ns as f64 / 1e6)
}

/// The request-path cost as the team running the proxy sees it (issue 18): Envoy CPU per
/// streamed request on the kvroute listener vs the same Envoy's plain round-robin listener,
/// same requests, real state service and simulated workers streaming one SSE event per token.
/// Token-id prompts of 1k / 8k / 32k tokens, 100 and 1000 streamed tokens.
///
/// The three phases (plain; kvroute with `stream_options.include_usage`, whose stream the
/// filter reads for its usage event; kvroute without, only counted) alternate in blocks of
/// [`BLOCK`] requests, each block's CPU added to its phase: the VM's CPU speed drifts by tens
/// of percent over a minute (steal time counts as the process's), which whole sequential
/// phases turned into ratios of 0.9x-1.4x for the same build.
///
/// `KVROUTE_CPU_REQUESTS` (default 60) requests per cell and phase; `KVROUTE_CPU_CELLS=8192:1,
/// 8192:100` some cells (prompt:streamed tokens); `KVROUTE_CPU_TIME_SCALE` the sims' (default
/// 0.03: ~1.1 ms between tokens, so that Envoy reads each event alone; the last column shows
/// it did); `KVROUTE_CPU_PLUGIN` filter settings (JSON); `KVROUTE_CPU_MODULE=path.wasm` another build of the filter (an experiment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures (tests/LATENCY.md)"]
async fn cpu_per_streamed_request() -> Result<()> {
    use kvroute_e2e::envoy::EnvoyExtra;
    use kvroute_e2e::stack::{Stack, StackOptions};
    let env = |name: &str| std::env::var(name).ok();
    let n: usize = env("KVROUTE_CPU_REQUESTS").and_then(|v| v.parse().ok()).unwrap_or(60);
    let time_scale: f64 = env("KVROUTE_CPU_TIME_SCALE").and_then(|v| v.parse().ok()).unwrap_or(0.03);
    let module = std::env::var_os("KVROUTE_CPU_MODULE").map(std::path::PathBuf::from);
    let envoy = EnvoyExtra { plain_listener: true, module, ..EnvoyExtra::default() };
    // The filter's defaults, not the e2e harness's (which turns the decision header on and
    // flushes reports every 50 ms); `KVROUTE_CPU_PLUGIN='{"report_flush_ms":5000}'` overrides.
    let mut plugin = serde_json::json!({ "decision_header": false, "report_flush_ms": 100 });
    if let Some(extra) = env("KVROUTE_CPU_PLUGIN") {
        let extra: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&extra)?;
        if let Some(p) = plugin.as_object_mut() {
            p.extend(extra);
        }
    }
    let opts = StackOptions { workers: 2, time_scale, envoy, plugin, ..StackOptions::default() };
    let stack = Stack::start(opts).await?;
    let pid = stack.envoy().proc.pid().ok_or_else(|| anyhow::anyhow!("envoy pid"))?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let phases = [(stack.envoy().plain_url("/v1/completions"), true), (stack.envoy().url("/v1/completions"), true), (stack.envoy().url("/v1/completions"), false)];
    println!("\n### Envoy CPU per streamed request (ms; {n} requests per cell and phase, phases alternating by {BLOCK})\n");
    println!("| prompt tokens | streamed tokens | plain listener | kvroute, stream with usage | ratio | kvroute, stream without usage | ratio | chunks read per request | state-service calls per kvroute request |");
    println!("|---|---|---|---|---|---|---|---|---|");
    // The simulated workers' max_model_len is 32768: the "32k" prompt leaves room for 1000 tokens.
    let default_cells: Vec<(usize, u32)> = [1024, 8192, 31_744].iter().flat_map(|p| [(*p, 100u32), (*p, 1000)]).collect();
    let cells: Vec<(usize, u32)> = env("KVROUTE_CPU_CELLS")
        .map(|v| v.split(',').filter_map(|c| c.split_once(':')).filter_map(|(p, o)| Some((p.parse().ok()?, o.parse().ok()?))).collect())
        .unwrap_or(default_cells);
    let mut seed = 7_000_000u32;
    for (prompt, output) in cells {
        let mut cpu = [0.0f64; 3];
        // Body chunks the client read: a stream whose events Envoy coalesced (a busy moment)
        // costs it fewer callbacks, so phases compare only at equal counts.
        let mut chunks = [0u64; 3];
        // Calls Envoy made to the state service (picks and report batches) in the two kvroute
        // phases: what a report costs the proxy is one of them.
        let mut calls = 0u64;
        // Warm-up (JIT, connections), then measure.
        for (url, usage) in &phases {
            for _ in 0..3 {
                seed += 1;
                send(&client, url, prompt, output, *usage, seed).await?;
            }
        }
        for _ in 0..n.div_ceil(BLOCK) {
            for (i, (url, usage)) in phases.iter().enumerate() {
                let calls_before = state_calls(stack.envoy()).await?;
                let before = process_cpu_ms(pid)?;
                for _ in 0..BLOCK {
                    seed += 1;
                    chunks[i] += send(&client, url, prompt, output, *usage, seed).await?;
                }
                cpu[i] += process_cpu_ms(pid)? - before;
                if i > 0 {
                    calls += state_calls(stack.envoy()).await? - calls_before;
                }
            }
        }
        let sent = (n.div_ceil(BLOCK) * BLOCK) as f64;
        let [plain, with_usage, without_usage] = cpu.map(|c| c / sent);
        let c = chunks.map(|c| c as f64 / sent);
        println!(
            "| {prompt} | {output} | {plain:.2} | {with_usage:.2} | {:.2}x | {without_usage:.2} | {:.2}x | {:.0} / {:.0} / {:.0} | {:.2} |",
            with_usage / plain,
            without_usage / plain,
            c[0],
            c[1],
            c[2],
            calls as f64 / (2.0 * sent)
        );
    }
    Ok(())
}

/// Requests Envoy has sent to the state service's cluster (picks and report batches).
async fn state_calls(envoy: &kvroute_e2e::envoy::Envoy) -> Result<u64> {
    let stats = envoy.stats("cluster.kvroute_state.upstream_rq_total").await?;
    Ok(stats.iter().find(|(k, _)| k == "cluster.kvroute_state.upstream_rq_total").and_then(|(_, v)| v.trim().parse().ok()).unwrap_or(0))
}

/// Requests per phase before the next phase's turn.
const BLOCK: usize = 5;

/// One streamed completion of `prompt` token ids and `output` tokens, read to its end; returns
/// the body chunks the client read. `usage`: with `stream_options.include_usage`.
async fn send(client: &reqwest::Client, url: &str, prompt: usize, output: u32, usage: bool, seed: u32) -> Result<u64> {
    use kvroute_e2e::llm::{completion, tokens};
    use kvroute_e2e::stack::MODEL;
    let mut body = completion(MODEL, &tokens(seed, prompt), output, true);
    if !usage {
        body.as_object_mut().map(|o| o.remove("stream_options"));
    }
    let mut resp = client.post(url).json(&body).send().await?;
    anyhow::ensure!(resp.status().is_success(), "status {}", resp.status());
    let mut chunks = 0;
    while resp.chunk().await?.is_some() {
        chunks += 1;
    }
    Ok(chunks)
}
