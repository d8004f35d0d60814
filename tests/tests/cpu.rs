//! Envoy CPU per streamed request (issue 18; figures in `tests/LATENCY.md`), measured, not
//! asserted. Run with `cargo test -p kvroute-e2e --release --test cpu -- --ignored --nocapture`.

use anyhow::Result;
use std::time::Duration;

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
