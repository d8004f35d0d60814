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
//! - a killed Redis shard: noticed when replica 0 reports it down, recovered when it is up.
//!
//! A fault that ends restores the stack; a drain does not (run it last).

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
    pub detect_ms: Option<f64>,
    pub recover_ms: Option<f64>,
    /// A dead replica: fallbacks of requests started more than 1 s into the fault, before it
    /// was back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallbacks_after_1s: Option<usize>,
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
    let (next, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    // The load goes on past `requests` until the fault is over (a long one outlasts them).
    let over = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..cfg.concurrency.max(1))
        .map(|_| {
            let (client, url, prefixes, next, done, over, cfg) =
                (client.clone(), url.clone(), prefixes.clone(), next.clone(), done.clone(), over.clone(), cfg.clone());
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
                    out.push(one(&client, &url, body).await);
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
    let (mut detect_ms, mut recover_ms, mut restored_at) = (None, None, None);
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
            recover_ms = when(back, Duration::from_secs(30), || async { worker_flag(&replicas, &control, 0, i, "takes_picks").await == Some(true) }).await;
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
            recover_ms = when(back, Duration::from_secs(30), || async { shard_up(&replicas, &control, i).await == Some(true) }).await;
        }
    }
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
        detect_ms,
        recover_ms,
        fallbacks_after_1s,
    })
}

/// The results as a markdown table.
pub fn table(results: &[ScenarioResult]) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} ms"));
    let mut t = String::from(
        "| fault during load | failed / total | failed beyond those running on a killed worker | fallbacks by reason | fallbacks after its first second | TTFB p50 / p99 | noticed after | recovered after |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let fallbacks = if r.fallbacks.is_empty() {
            "none".to_string()
        } else {
            r.fallbacks.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
        };
        t.push_str(&format!(
            "| {} | {} / {} | {} | {} | {} | {:.0} / {:.0} ms | {} | {} |\n",
            r.scenario,
            r.failed,
            r.total,
            r.failed_beyond_running,
            fallbacks,
            r.fallbacks_after_1s.map_or("-".to_string(), |n| n.to_string()),
            r.ttfb_p50_ms,
            r.ttfb_p99_ms,
            ms(r.detect_ms),
            ms(r.recover_ms)
        ));
    }
    t
}
