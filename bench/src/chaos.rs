//! `kvroute-bench chaos`: each failure the router must survive, injected into a started stack
//! under bounded loopback load, with what it cost.
//!
//! A scenario sends `requests` streamed completions (token-id prompts over a few shared
//! prefixes, `concurrency` at a time) through Envoy; once `fault_after` of them are done the
//! fault is injected, and for the faults that end (a process restarted, a frozen one thawed)
//! it ends `fault_secs` later. Per scenario: failed / total, the failures beyond the requests
//! that were running on a killed worker, fallbacks by reason (`x-kvroute-fallback`), the
//! time-to-first-byte p50 / p99, and how long the router took to notice the fault and to
//! recover from it:
//! - a killed / frozen state replica: noticed at the first fallback after the fault, recovered
//!   at the last fallback after it ended (routing resumed); for a replica that stays dead
//!   (`dead_secs`, 60 s by default) the load goes on until it is back, and the fallbacks of
//!   requests started more than a second into the fault are counted apart: what it costs once
//!   Envoy's health check has taken the replica out;
//! - a killed worker: noticed when replica 0 stops picking it, recovered when it takes picks
//!   again after its restart;
//! - a drained worker: noticed when the last replica marks it draining (replicated);
//! - a killed Redis shard: noticed when replica 0 reports it down, recovered when it is up;
//! - a frozen worker (SIGSTOP, `worker_freeze_secs`): noticed when replica 0 stops picking
//!   it, recovered when it takes picks again; the longest time to first byte is the bound a
//!   request sent to it paid (the filter's `first_byte_timeout_ms`, then a retry);
//! - a flooding worker (its event stream announces `flood_blocks` blocks it never holds):
//!   its index against the capacity it reports, and the memory of the state replicas and
//!   Redis before, at the peak and after the worker resets its cache ([`flood`]).
//!
//! After every fault that ends, the time until each replica's count of the fleet's
//! assignments in flight is back to the truth (the requests the load has running, within
//! `tolerance`, held a second): phantom load after a fault is the load model lying.
//!
//! A fault that ends restores the stack; a drain does not (run it last).

mod flood;

pub use flood::FloodResult;

use crate::stack::Stack;
use crate::BenchError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One failure to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// `kill -9` state replica r, restarted after `fault_secs`.
    KillReplica(usize),
    /// SIGSTOP state replica r for `fault_secs`.
    FreezeReplica(usize),
    /// `kill -9` state replica r, restarted after `dead_secs`, under load all along.
    ReplicaDead(usize),
    /// `kill -9` worker i, restarted after `fault_secs`.
    KillWorker(usize),
    /// `POST /admin/workers/{i}/drain` on replica 0.
    DrainWorker(usize),
    /// `kill -9` Redis shard i, restarted after `fault_secs`.
    KillShard(usize),
    /// SIGSTOP worker i for `worker_freeze_secs`: it accepts connections and answers nothing.
    FreezeWorker(usize),
    /// Worker i's event stream announces `flood_blocks` blocks it never holds; then it resets
    /// its cache.
    FloodWorker(usize),
}

impl Fault {
    pub fn label(self) -> String {
        match self {
            Fault::None => "no fault".into(),
            Fault::KillReplica(r) => format!("state replica {r} kill -9, restarted"),
            Fault::FreezeReplica(r) => format!("state replica {r} frozen (SIGSTOP)"),
            Fault::ReplicaDead(r) => format!("state replica {r} dead for long (kill -9, restarted after dead_secs)"),
            Fault::KillWorker(i) => format!("worker {i} kill -9, restarted"),
            Fault::DrainWorker(i) => format!("worker {i} drained"),
            Fault::KillShard(i) => format!("Redis shard {i} kill -9, restarted"),
            Fault::FreezeWorker(i) => format!("worker {i} frozen (SIGSTOP)"),
            Fault::FloodWorker(i) => format!("worker {i} floods its event stream"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ChaosConfig {
    pub requests: usize,
    pub concurrency: usize,
    pub prompt_tokens: usize,
    pub output_tokens: u32,
    pub fault_after: usize,
    pub fault_secs: f64,
    /// How long `ReplicaDead` keeps the replica dead.
    pub dead_secs: f64,
    /// How long `FreezeWorker` keeps the worker frozen.
    pub worker_freeze_secs: f64,
    /// Blocks `FloodWorker` announces.
    pub flood_blocks: u64,
    /// A replica's in-flight count within this of the truth counts as equal.
    pub tolerance: u64,
    pub model: String,
}

/// What one request saw.
#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    pub started: Instant,
    pub ended: Instant,
    pub ttfb: Option<Duration>,
    pub served: bool,
    pub fallback: String,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ScenarioResult {
    pub scenario: String,
    pub total: usize,
    pub failed: usize,
    /// Failures that a fault may not cost: all of them, except, for a killed worker, the
    /// requests that were already running when it died.
    pub failed_beyond_running: usize,
    pub fallbacks: BTreeMap<String, usize>,
    pub ttfb_p50_ms: f64,
    pub ttfb_p99_ms: f64,
    /// The longest time to first byte: what the unluckiest request waited.
    pub ttfb_max_ms: f64,
    pub detect_ms: Option<f64>,
    pub recover_ms: Option<f64>,
    /// A dead replica: fallbacks of requests started more than 1 s into the fault, before it
    /// was back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallbacks_after_1s: Option<usize>,
    /// After a fault that ends: every replica's in-flight count against the truth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight_after: Option<BackToTruth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood: Option<FloodResult>,
}

/// How the replicas' in-flight counts came back to the truth after a fault ended.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct BackToTruth {
    /// `None`: not within 30 s.
    pub after_ms: Option<f64>,
    /// The largest excess of a replica's count over the truth seen until then (phantom load).
    pub max_excess: i64,
}

/// A token-id prompt, the same for the same seed (shared prefixes are one seed's prompt).
pub(crate) fn prompt(seed: usize, n: usize) -> Vec<u32> {
    (0..n).map(|i| 1000 + ((seed as u32).wrapping_mul(7919).wrapping_add(i as u32 * 104_729)) % 100_000).collect()
}

/// One streamed request through the proxy: served when it ended 2xx with `[DONE]`.
pub(crate) async fn one(client: &reqwest::Client, url: &str, body: serde_json::Value) -> Outcome {
    let started = Instant::now();
    let mut out = Outcome { started, ended: started, ttfb: None, served: false, fallback: String::new() };
    let Ok(mut r) = client.post(url).json(&body).send().await else {
        out.ended = Instant::now();
        return out;
    };
    out.fallback = r.headers().get("x-kvroute-fallback").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let ok = r.status().is_success();
    let mut text = String::new();
    loop {
        match r.chunk().await {
            Ok(Some(c)) => {
                out.ttfb.get_or_insert_with(|| started.elapsed());
                text.push_str(&String::from_utf8_lossy(&c));
            }
            Ok(None) => break,
            Err(_) => {
                text.clear();
                break;
            }
        }
    }
    out.served = ok && text.contains("[DONE]");
    out.ended = Instant::now();
    out
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The state a poll reads: replica `r`'s worker view or metrics.
async fn get(client: &reqwest::Client, url: String) -> Option<String> {
    client.get(url).timeout(Duration::from_millis(500)).send().await.ok()?.text().await.ok()
}

async fn worker_flag(stack_urls: &[String], client: &reqwest::Client, replica: usize, worker: usize, flag: &str) -> Option<bool> {
    let text = get(client, format!("{}/v1/workers", stack_urls[replica])).await?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let ws = v["workers"].as_array()?;
    match ws.iter().find(|w| w["id"].as_str() == Some(&format!("w{worker}"))) {
        Some(w) => w[flag].as_bool(),
        // Gone (a drained worker removed): it takes no picks and drains no more.
        None => Some(flag == "draining"),
    }
}

async fn shard_up(stack_urls: &[String], client: &reqwest::Client, shard: usize) -> Option<bool> {
    let text = get(client, format!("{}/metrics", stack_urls[0])).await?;
    let ups: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("kvroute_store_shard_up{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    ups.get(shard).map(|v| *v > 0.0)
}

/// Polls `check` every 50 ms for up to `limit`; the elapsed time since `since` when it held.
async fn when<F, Fut>(since: Instant, limit: Duration, mut check: F) -> Option<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if check().await {
            return Some(since.elapsed().as_secs_f64() * 1000.0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

async fn in_flight(client: &reqwest::Client, replica: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(&get(client, format!("{replica}/v1/workers")).await?).ok()?;
    v["assignments"].as_u64()
}

/// Each replica's count of the fleet's assignments in flight (`None`: it did not answer).
pub(crate) async fn replica_in_flight(client: &reqwest::Client, replicas: &[String]) -> Vec<Option<u64>> {
    let mut out = Vec::with_capacity(replicas.len());
    for r in replicas {
        out.push(in_flight(client, r).await);
    }
    out
}

/// The largest excess of a replica's in-flight count over the truth (phantom load); replicas
/// that did not answer are left out.
pub(crate) fn excess(counts: &[Option<u64>], truth: usize) -> i64 {
    counts.iter().flatten().map(|&c| c as i64 - truth as i64).max().unwrap_or(0)
}

/// Polls every replica's count of the fleet's assignments in flight (each sees them all,
/// through the store) until all are within `tolerance` of `truth` (the requests the load has
/// running) for a second in a row, up to 30 s after `since`: how long after `since` that
/// began, and the largest excess over the truth seen until then.
pub(crate) async fn back_to_truth(control: &reqwest::Client, replicas: &[String], truth: &AtomicUsize, tolerance: u64, since: Instant) -> BackToTruth {
    let (mut held_since, mut max_excess) = (None::<Instant>, 0i64);
    while since.elapsed() < Duration::from_secs(30) {
        let counts = replica_in_flight(control, replicas).await;
        let t = truth.load(Ordering::SeqCst);
        max_excess = max_excess.max(excess(&counts, t));
        let equal = counts.iter().all(|c| c.is_some_and(|c| c.abs_diff(t as u64) <= tolerance));
        match (equal, held_since) {
            (true, None) => held_since = Some(Instant::now()),
            (true, Some(s)) if s.elapsed() >= Duration::from_secs(1) => {
                return BackToTruth { after_ms: Some((s - since).as_secs_f64() * 1000.0), max_excess };
            }
            (false, _) => held_since = None,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    BackToTruth { after_ms: None, max_excess }
}

/// Runs one scenario on `stack` and restores what the fault broke (except a drain).
pub async fn run(stack: &mut Stack, fault: Fault, cfg: &ChaosConfig) -> Result<ScenarioResult, BenchError> {
    let api = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", stack.config.api_token))
        .map_err(|e| BenchError::Stack(format!("api token: {e}")))?;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, api);
    let control = reqwest::Client::builder().default_headers(headers).build().map_err(|e| BenchError::Stack(e.to_string()))?;
    let replicas: Vec<String> = (0..stack.config.replicas.max(1)).map(|r| stack.replica_url(r)).collect();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().map_err(|e| BenchError::Stack(e.to_string()))?;
    let url = format!("{}/v1/completions", stack.envoy_url());
    let prefixes: Arc<Vec<Vec<u32>>> = Arc::new((0..6).map(|p| prompt(7000 + p, cfg.prompt_tokens)).collect());
    let (next, done, truth) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    // The load goes on past `requests` until the fault is over (a long one outlasts them).
    let over = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..cfg.concurrency.max(1))
        .map(|_| {
            let (client, url, prefixes, next, done, truth, over, cfg) =
                (client.clone(), url.clone(), prefixes.clone(), next.clone(), done.clone(), truth.clone(), over.clone(), cfg.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    if n >= cfg.requests && over.load(Ordering::SeqCst) {
                        return out;
                    }
                    let mut p = prefixes[n % prefixes.len()].clone();
                    p.extend(prompt(90_000 + n, 16));
                    let body = serde_json::json!({"model": cfg.model, "prompt": p, "max_tokens": cfg.output_tokens, "stream": true,
                        "ignore_eos": true, "stream_options": {"include_usage": true}});
                    truth.fetch_add(1, Ordering::SeqCst);
                    out.push(one(&client, &url, body).await);
                    truth.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    while done.load(Ordering::SeqCst) < cfg.fault_after.min(cfg.requests) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hold = Duration::from_secs_f64(cfg.fault_secs);
    let t0 = Instant::now();
    let (mut detect_ms, mut recover_ms, mut restored_at, mut flood) = (None, None, None, None);
    match fault {
        Fault::None => {}
        Fault::KillReplica(r) | Fault::FreezeReplica(r) | Fault::ReplicaDead(r) => {
            let name = Stack::replica_name(r);
            let killed = !matches!(fault, Fault::FreezeReplica(_));
            if killed {
                stack.kill(&name)?;
            } else {
                stack.freeze(&name, true)?;
            }
            let hold = if matches!(fault, Fault::ReplicaDead(_)) { Duration::from_secs_f64(cfg.dead_secs) } else { hold };
            tokio::time::sleep(hold).await;
            if killed {
                stack.restart(&name)?;
            } else {
                stack.freeze(&name, false)?;
            }
            restored_at = Some(Instant::now());
        }
        Fault::KillWorker(i) => {
            stack.kill(&format!("sim{i}"))?;
            detect_ms = when(t0, hold, || async { worker_flag(&replicas, &control, 0, i, "takes_picks").await == Some(false) }).await;
            tokio::time::sleep(hold.saturating_sub(t0.elapsed())).await;
            stack.restart(&format!("sim{i}"))?;
            let back = Instant::now();
            restored_at = Some(back);
            recover_ms = when(back, Duration::from_secs(30), || async { worker_flag(&replicas, &control, 0, i, "takes_picks").await == Some(true) }).await;
        }
        Fault::FreezeWorker(i) => {
            stack.freeze(&format!("sim{i}"), true)?;
            let hold = Duration::from_secs_f64(cfg.worker_freeze_secs);
            detect_ms = when(t0, hold, || async { worker_flag(&replicas, &control, 0, i, "takes_picks").await == Some(false) }).await;
            tokio::time::sleep(hold.saturating_sub(t0.elapsed())).await;
            stack.freeze(&format!("sim{i}"), false)?;
            let back = Instant::now();
            restored_at = Some(back);
            recover_ms = when(back, Duration::from_secs(30), || async { worker_flag(&replicas, &control, 0, i, "takes_picks").await == Some(true) }).await;
        }
        Fault::FloodWorker(i) => {
            flood = Some(flood::run(stack, &control, &replicas, i, cfg.flood_blocks).await?);
        }
        Fault::DrainWorker(i) => {
            let r = control
                .post(format!("{}/admin/workers/w{i}/drain", replicas[0]))
                .bearer_auth(&stack.config.admin_token)
                .send()
                .await
                .map_err(|e| BenchError::Stack(format!("drain: {e}")))?;
            if !r.status().is_success() {
                return Err(BenchError::Stack(format!("drain answered {}", r.status())));
            }
            let last = replicas.len() - 1;
            detect_ms = when(t0, Duration::from_secs(10), || async { worker_flag(&replicas, &control, last, i, "draining").await == Some(true) }).await;
        }
        Fault::KillShard(i) => {
            stack.kill(&format!("redis{i}"))?;
            detect_ms = when(t0, hold, || async { shard_up(&replicas, &control, i).await == Some(false) }).await;
            tokio::time::sleep(hold.saturating_sub(t0.elapsed())).await;
            stack.restart(&format!("redis{i}"))?;
            let back = Instant::now();
            restored_at = Some(back);
            recover_ms = when(back, Duration::from_secs(30), || async { shard_up(&replicas, &control, i).await == Some(true) }).await;
        }
    }
    let in_flight_after = match restored_at {
        Some(back) => Some(back_to_truth(&control, &replicas, &truth, cfg.tolerance, back).await),
        None => None,
    };
    over.store(true, Ordering::SeqCst);
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.extend(t.await.map_err(|e| BenchError::Stack(format!("load task: {e}")))?);
    }
    // Replica faults: noticed at the first fallback after the fault, recovered at the last.
    let replica_fault = matches!(fault, Fault::KillReplica(_) | Fault::FreezeReplica(_) | Fault::ReplicaDead(_));
    let fallbacks_after_1s = match (fault, restored_at) {
        (Fault::ReplicaDead(_), Some(back)) => {
            let settled = t0 + Duration::from_secs(1);
            Some(outcomes.iter().filter(|o| o.started >= settled && o.started < back && !o.fallback.is_empty()).count())
        }
        _ => None,
    };
    if replica_fault {
        let fell: Vec<&Outcome> = outcomes.iter().filter(|o| o.ended >= t0 && !o.fallback.is_empty()).collect();
        detect_ms = fell.iter().map(|o| o.ended).min().map(|t| (t - t0).as_secs_f64() * 1000.0);
        if let Some(back) = restored_at {
            // None without a fallback: nothing to recover from.
            recover_ms = fell.iter().map(|o| o.ended.saturating_duration_since(back).as_secs_f64() * 1000.0).reduce(f64::max);
        }
    }
    if let Some(f) = flood.as_mut() {
        flood::reset(f, stack, &control, &replicas).await?;
    }
    let failed = outcomes.iter().filter(|o| !o.served).count();
    let failed_beyond_running = match fault {
        Fault::KillWorker(_) => outcomes.iter().filter(|o| !o.served && o.started >= t0).count(),
        _ => failed,
    };
    let mut fallbacks = BTreeMap::new();
    for o in outcomes.iter().filter(|o| !o.fallback.is_empty()) {
        *fallbacks.entry(o.fallback.clone()).or_insert(0) += 1;
    }
    let mut ttfb: Vec<f64> = outcomes.iter().filter_map(|o| o.ttfb).map(|d| d.as_secs_f64() * 1000.0).collect();
    ttfb.sort_by(f64::total_cmp);
    Ok(ScenarioResult {
        scenario: fault.label(),
        total: outcomes.len(),
        failed,
        failed_beyond_running,
        fallbacks,
        ttfb_p50_ms: percentile(&ttfb, 0.5),
        ttfb_p99_ms: percentile(&ttfb, 0.99),
        ttfb_max_ms: ttfb.last().copied().unwrap_or(f64::NAN),
        detect_ms,
        recover_ms,
        fallbacks_after_1s,
        in_flight_after,
        flood,
    })
}

/// The results as a markdown table.
pub fn table(results: &[ScenarioResult]) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} ms"));
    let mut t = String::from(
        "| fault during load | failed / total | failed beyond those running on a killed worker | fallbacks by reason | fallbacks after its first second | TTFB p50 / p99 / max | noticed after | recovered after | in flight back to the truth after (largest excess) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let fallbacks = if r.fallbacks.is_empty() {
            "none".to_string()
        } else {
            r.fallbacks.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
        };
        t.push_str(&format!(
            "| {} | {} / {} | {} | {} | {} | {:.0} / {:.0} / {:.0} ms | {} | {} | {} |\n",
            r.scenario,
            r.failed,
            r.total,
            r.failed_beyond_running,
            fallbacks,
            r.fallbacks_after_1s.map_or("-".to_string(), |n| n.to_string()),
            r.ttfb_p50_ms,
            r.ttfb_p99_ms,
            r.ttfb_max_ms,
            ms(r.detect_ms),
            ms(r.recover_ms),
            r.in_flight_after.map_or("-".to_string(), |b| match b.after_ms {
                Some(ms) => format!("{ms:.0} ms ({:+})", b.max_excess),
                None => format!("not within 30 s ({:+})", b.max_excess),
            })
        ));
    }
    let floods: Vec<&FloodResult> = results.iter().filter_map(|r| r.flood.as_ref()).collect();
    if !floods.is_empty() {
        t.push('\n');
        t.push_str(&flood::table(&floods));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_excess_is_the_worst_replica_that_answered() {
        assert_eq!(excess(&[Some(8), Some(11)], 8), 3);
        assert_eq!(excess(&[None, Some(6)], 8), -2);
        assert_eq!(excess(&[None], 8), 0);
    }

    #[test]
    fn the_table_says_how_in_flight_came_back_and_lists_floods() {
        let row = |scenario: Fault, in_flight_after, flood| ScenarioResult {
            scenario: scenario.label(),
            total: 240,
            failed: 0,
            failed_beyond_running: 0,
            fallbacks: BTreeMap::new(),
            ttfb_p50_ms: 40.0,
            ttfb_p99_ms: 90.0,
            ttfb_max_ms: 10_200.0,
            detect_ms: Some(700.0),
            recover_ms: None,
            fallbacks_after_1s: None,
            in_flight_after,
            flood,
        };
        let flood = FloodResult {
            worker: 3,
            blocks: 10,
            reported_blocks: None,
            index_blocks_max: 10,
            over_capacity: 0,
            state_rss_mib: [1.0; 3],
            redis_rss_mib: [0.0; 3],
            index_blocks_after_reset: 0,
            secs: 1.0,
        };
        let t = table(&[
            row(Fault::FreezeReplica(0), Some(BackToTruth { after_ms: Some(4.0), max_excess: 1 }), None),
            row(Fault::FreezeWorker(1), Some(BackToTruth { after_ms: None, max_excess: 3 }), None),
            row(Fault::FloodWorker(3), None, Some(flood)),
        ]);
        assert!(t.contains("| 40 / 90 / 10200 ms | 700 ms | - | 4 ms (+1) |"), "{t}");
        assert!(t.contains("| not within 30 s (+3) |"), "{t}");
        assert!(t.contains("| worker 3 floods its event stream |") && t.contains("| worker 3 | 10 in 1 s |"), "{t}");
    }
}
