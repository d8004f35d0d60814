//! Budget benchmarks (figures, not assertions: `cargo test -p kvroute-e2e --test tenant_bench
//! -- --ignored --nocapture`; results in state-service/README.md "Tenants and budgets").
//!
//! - `noisy_neighbour`: tenants A and B with the same token budget behind real Envoy and two
//!   simulated workers; B sends at half its budget. Phases: B alone; B while A floods at 5x its
//!   budget (A's excess answered 429 by the filter before any worker); B while A floods with
//!   its budget lifted at runtime (what the fleet would suffer without budgets). B's TTFT
//!   p50/p99 per phase, A's admitted and rejected counts.
//! - `fair_shares_without_budgets`: the same tenants and rates with no budget at all and the
//!   state service's queue on (`[scheduling]`, both tenants weight 1): A's flood waits in the
//!   router, and the queue's fair shares (deficit round robin on prefill tokens) keep B's
//!   requests moving. B's TTFT p50/p99 alone and beside A; A's requests served, shed at the
//!   queue deadline (503), other. `KVROUTE_BENCH_SCHEDULING="headroom_workers = 1; ..."` sets
//!   more of `[scheduling]`.
//!
//! Both send each tenant's requests evenly spaced, or as a seeded Poisson process with
//! `KVROUTE_BENCH_ARRIVALS=poisson` (B's requests then sometimes arrive together);
//! `KVROUTE_BENCH_PHASE_S` sets the length of a phase (30 s; B's p99 over 30 s is its
//! slowest of ~29 requests). `KVROUTE_BENCH_WORKERS` sets the fleet of
//! `fair_shares_without_budgets` (2 sims; the tenants' rates scale with it).
//! - `shared_budget_two_replicas`: two replicas on three Redis shards, one tenant budget,
//!   concurrent picks spread over both replicas well past the budget; the tokens admitted within
//!   the window against the budget (one shared budget: 1.0x; per-replica budgets would be 2x).
//!   Then every shard stopped: each replica admits its local share (budget / replicas).

use anyhow::Result;
use kvroute_e2e::llm::{completion, tokens};
use kvroute_e2e::stack::{Stack, StackOptions, StateToml, MODEL};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

const ADMIN: &str = "kvroute-bench-admin-token";
const PROMPT: usize = 1000;
const OUTPUT: u32 = 32;
/// Each tenant's budget: ~116 requests of ~1032 tokens a minute, ~1.9/s (the two sims serve
/// about twice that: A's flood at 5x overloads them).
const BUDGET: u64 = 120_000;
/// Each tenant's concurrent requests: what bounds a burst the minute's budget would admit.
const CONCURRENT: u64 = 4;

fn sha(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Default)]
struct Tally {
    ttft_ms: Vec<f64>,
    ok: u64,
    rejected: u64,
    /// 503: shed by the state service's queue.
    shed: u64,
    /// The slowest first token and the seed of its request.
    slowest: (f64, u32),
    other: u64,
}

/// One streamed completion; TTFT = first body chunk. Prompts of seeds that differ modulo
/// 100,000 share nothing (`llm::tokens`): each phase and tenant has its own seed range.
async fn one(client: reqwest::Client, url: String, key: &'static str, seed: u32, tally: Arc<Mutex<Tally>>) {
    let body = completion(MODEL, &tokens(seed, PROMPT), OUTPUT, true);
    let t = Instant::now();
    let resp = client.post(&url).bearer_auth(key).json(&body).send().await;
    let Ok(mut resp) = resp else {
        tally.lock().await.other += 1;
        return;
    };
    match resp.status().as_u16() {
        200 => {
            let mut first = None;
            while let Ok(Some(_chunk)) = resp.chunk().await {
                first.get_or_insert_with(|| t.elapsed().as_secs_f64() * 1000.0);
            }
            let mut g = tally.lock().await;
            g.ok += 1;
            if let Some(ms) = first {
                g.ttft_ms.push(ms);
                if ms > g.slowest.0 {
                    g.slowest = (ms, seed);
                }
            }
        }
        429 => tally.lock().await.rejected += 1,
        503 => tally.lock().await.shed += 1,
        _ => tally.lock().await.other += 1,
    }
}

/// Sends `rate` requests/s of tenant `key` for `secs`, open loop; returns when all answered.
async fn drive(client: &reqwest::Client, url: &str, key: &'static str, rate: f64, secs: f64, seed: u32) -> Tally {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let n = (rate * secs) as u32;
    let poisson = arrivals() == "poisson";
    let start = tokio::time::Instant::now();
    let mut at = 0.0;
    let mut tasks = Vec::new();
    for i in 0..n {
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        tasks.push(tokio::spawn(one(client.clone(), url.to_string(), key, seed + i, tally.clone())));
        at += if poisson { exponential_gap(seed + i, rate) } else { 1.0 / rate };
    }
    for t in tasks {
        let _ = t.await;
    }
    Arc::try_unwrap(tally).map(Mutex::into_inner).unwrap_or_default()
}

/// A seeded exponential gap of mean `1 / rate` (splitmix64 of `seed`): Poisson arrivals,
/// the same in every run.
fn exponential_gap(seed: u32, rate: f64) -> f64 {
    let mut z = u64::from(seed).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let u = ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -u.ln() / rate
}

/// `KVROUTE_BENCH_ARRIVALS`: `even` (the default) or `poisson`.
fn arrivals() -> String {
    std::env::var("KVROUTE_BENCH_ARRIVALS").unwrap_or_else(|_| "even".into())
}

/// Seconds per phase: `KVROUTE_BENCH_PHASE_S`, default 30.
fn phase_secs() -> f64 {
    positive_env("KVROUTE_BENCH_PHASE_S", 30.0)
}

/// Sims behind Envoy for `fair_shares_without_budgets`: `KVROUTE_BENCH_WORKERS`, default 2.
fn fleet_size() -> usize {
    positive_env("KVROUTE_BENCH_WORKERS", 2)
}

/// The environment variable `name` if it parses as a positive number, else `default`.
fn positive_env<T: std::str::FromStr + PartialOrd + Default>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).filter(|v: &T| *v > T::default()).unwrap_or(default)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures"]
async fn noisy_neighbour() -> Result<()> {
    const A: &str = "sk-tenant-a-0123456789";
    const B: &str = "sk-tenant-b-0123456789";
    let plugin = json!({
        "identity": { "sources": [ { "api_key": { "keys": { format!("sha256:{}", sha(A)): "team-a", format!("sha256:{}", sha(B)): "team-b" } } } ] }
    });
    let budget = format!("tokens_per_minute = {BUDGET}\nconcurrent_requests = {CONCURRENT}\n");
    let tables = format!("\n[tenancy]\nmetrics_tenants = [\"team-a\", \"team-b\"]\n[tenancy.budgets.team-a]\n{budget}[tenancy.budgets.team-b]\n{budget}");
    let state = StateToml { top: format!("admin_token = \"{ADMIN}\""), tables, ..StateToml::default() };
    let stack = Stack::start(StackOptions { plugin, state, workers: 2, time_scale: 1.0, ..StackOptions::default() }).await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let url = stack.envoy().url("/v1/completions");
    let per_request = (PROMPT as f64) + f64::from(OUTPUT);
    let budget_rate = BUDGET as f64 / per_request / 60.0;
    let (b_rate, a_rate, secs) = (budget_rate / 2.0, budget_rate * 5.0, phase_secs());
    println!(
        "budget {BUDGET} tokens/min and {CONCURRENT} concurrent each (~{budget_rate:.2} req/s of {per_request} tokens); B at {b_rate:.2} req/s, A floods at {a_rate:.2} req/s; {secs} s per phase; 2 sims (time scale 1.0)"
    );

    let mut alone = drive(&client, &url, B, b_rate, secs, 10_000).await;
    println!(
        "B alone:                     TTFT p50 {:7.1} ms  p99 {:7.1} ms  ({} ok, {} rejected)",
        pct(&mut alone.ttft_ms, 0.5), pct(&mut alone.ttft_ms, 0.99), alone.ok, alone.rejected
    );
    for (label, lifted) in [("B + A flooding (budgeted):  ", false), ("B + A flooding (no budget): ", true)] {
        if lifted {
            let resp = client
                .put(stack.state_url("/admin/tenants/team-a/budget"))
                .bearer_auth(ADMIN)
                .json(&json!({}))
                .send()
                .await?;
            anyhow::ensure!(resp.status().is_success(), "lifting A's budget: {}", resp.status());
        }
        // A fresh window for A: wait out what the previous phase charged.
        tokio::time::sleep(Duration::from_secs(if lifted { 5 } else { 0 })).await;
        let (mut b, a) = tokio::join!(drive(&client, &url, B, b_rate, secs, 20_000 + lifted as u32 * 10_000), drive(&client, &url, A, a_rate, secs, 50_000 + lifted as u32 * 20_000));
        println!(
            "{label} TTFT p50 {:7.1} ms  p99 {:7.1} ms  ({} ok, {} rejected); A: {} admitted, {} answered 429, {} other",
            pct(&mut b.ttft_ms, 0.5), pct(&mut b.ttft_ms, 0.99), b.ok, b.rejected, a.ok, a.rejected, a.other
        );
    }
    let metrics = stack.client.get(stack.state_url("/metrics")).send().await?.text().await?;
    for line in metrics.lines().filter(|l| l.starts_with("kvroute_tenant_requests_total")) {
        println!("  {line}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures"]
async fn fair_shares_without_budgets() -> Result<()> {
    const A: &str = "sk-tenant-a-0123456789";
    const B: &str = "sk-tenant-b-0123456789";
    const DEADLINE_MS: u64 = 20_000;
    let plugin = json!({
        "identity": { "sources": [ { "api_key": { "keys": { format!("sha256:{}", sha(A)): "team-a", format!("sha256:{}", sha(B)): "team-b" } } } ] }
    });
    // More `[scheduling]` settings from the environment, one `key = value` per line.
    let extra = std::env::var("KVROUTE_BENCH_SCHEDULING").unwrap_or_default().replace(';', "\n");
    let tables = format!(
        "\n[tenancy]\nmetrics_tenants = [\"team-a\", \"team-b\"]\n[scheduling]\nenabled = true\n{extra}\n[scheduling.classes.standard]\norder = 1\nqueue_deadline_ms = {DEADLINE_MS}\n"
    );
    let state = StateToml { tables, ..StateToml::default() };
    let workers = fleet_size();
    let stack = Stack::start(StackOptions { plugin, state, workers, time_scale: 1.0, ..StackOptions::default() }).await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let url = stack.envoy().url("/v1/completions");
    // The noisy neighbour's rates: a share is half of what the sims serve (a budget is what
    // two sims serve for one tenant; the fleet scales it).
    let share = BUDGET as f64 / ((PROMPT as f64) + f64::from(OUTPUT)) / 60.0 * workers as f64 / 2.0;
    let (b_rate, a_rate, secs) = (share / 2.0, share * 5.0, phase_secs());
    println!("no budgets, [scheduling] on ({extra:?} over the defaults, standard class deadline {DEADLINE_MS} ms); B at {b_rate:.2} req/s, A at {a_rate:.2} req/s; {secs} s per phase, {} arrivals; {workers} sims", arrivals());
    let mut alone = drive(&client, &url, B, b_rate, secs, 110_000).await;
    println!("B alone:        TTFT p50 {:7.1} ms  p99 {:7.1} ms  ({} ok, {} shed)", pct(&mut alone.ttft_ms, 0.5), pct(&mut alone.ttft_ms, 0.99), alone.ok, alone.shed);
    let (mut b, a) = tokio::join!(drive(&client, &url, B, b_rate, secs, 120_000), drive(&client, &url, A, a_rate, secs, 150_000));
    let (b50, b99) = (pct(&mut b.ttft_ms, 0.5), pct(&mut b.ttft_ms, 0.99));
    println!("B + A flooding: TTFT p50 {b50:7.1} ms  p99 {b99:7.1} ms  ({} ok, {} shed); B's p99 {:.2}x alone", b.ok, b.shed, b99 / pct(&mut alone.ttft_ms, 0.99));
    let next = b.ttft_ms.len().saturating_sub(2);
    println!("  B's slowest: {:.1} ms, its request {} of the phase; the next slowest {:.1} ms", b.slowest.0, b.slowest.1 - 120_000, b.ttft_ms.get(next).copied().unwrap_or(f64::NAN));
    println!("A: {} served, {} shed at its deadline, {} other", a.ok, a.shed, a.other);
    let metrics = stack.client.get(stack.state_url("/metrics")).send().await?.text().await?;
    for line in metrics.lines().filter(|l| l.starts_with("kvroute_queue_outcomes_total")) {
        println!("  {line}");
    }
    Ok(())
}

async fn degraded(stack: &kvroute_e2e::replicas::ReplicaStack) {
    for r in 0..stack.replicas.len() {
        println!("  replica {r}: kvroute_budget_degraded_total {}", stack.metric(r, "kvroute_budget_degraded_total", "").await.unwrap_or(f64::NAN));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures"]
async fn shared_budget_two_replicas() -> Result<()> {
    use kvroute_e2e::replicas::{ReplicaOptions, ReplicaStack};
    use std::sync::atomic::{AtomicU64, Ordering};
    const TENANT_BUDGET: u64 = 200_000;
    const PROMPT_TOKENS: u64 = 1_000;
    const OUTPUT: u64 = 256;
    let tables = format!("\n[tenancy]\nreplicas = 2\nstore_timeout_ms = 1000\n[tenancy.budgets.team]\ntokens_per_minute = {TENANT_BUDGET}\n");
    let mut stack = ReplicaStack::start(ReplicaOptions { workers: 2, replicas: 2, shards: 3, time_scale: 0.2, scrape_metrics: false, tables, plugin: serde_json::json!({}) }).await?;
    let ids = Arc::new(AtomicU64::new(1));
    // Picks on both replicas from 16 tasks for `secs`; returns (admitted tokens, admitted, rejected).
    let (client, urls) = (stack.client.clone(), [stack.state_url(0, "/v1/pick"), stack.state_url(1, "/v1/pick")]);
    let flood = |secs: f64| {
        let (client, urls, ids) = (client.clone(), urls.clone(), ids.clone());
        async move {
            let (tokens, admitted, rejected) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            let until = Instant::now() + Duration::from_secs_f64(secs);
            let mut tasks = Vec::new();
            for t in 0..16usize {
                let (client, url, ids) = (client.clone(), urls[t % 2].clone(), ids.clone());
                let (tokens, admitted, rejected) = (tokens.clone(), admitted.clone(), rejected.clone());
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < until {
                        let id = ids.fetch_add(1, Ordering::Relaxed);
                        let keys: Vec<u64> = (0..PROMPT_TOKENS / 16).map(|k| id * 1_000 + k).collect();
                        let body = json!({ "model": MODEL, "token_keys": keys, "block_size": 16, "prompt_tokens": PROMPT_TOKENS, "tenant": "team", "assignment_id": id });
                        let Ok(resp) = client.post(&url).json(&body).send().await else { continue };
                        let Ok(pick) = resp.json::<serde_json::Value>().await else { continue };
                        if pick["rejection"].is_object() {
                            rejected.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        } else if pick["assignment_id"].as_u64().unwrap_or(0) != 0 {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            tokens.fetch_add(PROMPT_TOKENS + OUTPUT, Ordering::Relaxed);
                        }
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            (tokens.load(Ordering::Relaxed), admitted.load(Ordering::Relaxed), rejected.load(Ordering::Relaxed))
        }
    };
    println!("one tenant, {TENANT_BUDGET} tokens/min, {} tokens per pick, 16 concurrent pickers over 2 replicas on 3 shards", PROMPT_TOKENS + OUTPUT);
    let (tokens, admitted, rejected) = flood(20.0).await;
    println!(
        "shared (Redis):   admitted {tokens} tokens in 20 s = {:.4}x the budget ({admitted} picks admitted, {rejected} rejected)",
        tokens as f64 / TENANT_BUDGET as f64
    );
    degraded(&stack).await;
    for shard in &mut stack.shards {
        shard.kill();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (tokens, admitted, rejected) = flood(10.0).await;
    println!(
        "shards down (local share, budget / 2 per replica): admitted {tokens} tokens = {:.4}x ({admitted} admitted, {rejected} rejected)",
        tokens as f64 / TENANT_BUDGET as f64
    );
    degraded(&stack).await;
    Ok(())
}
