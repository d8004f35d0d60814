//! `kvroute-bench soak`: production-shaped load for a long time through the production
//! topology (two state replicas on Redis shards, Envoy, simulated workers), with a fault every
//! few minutes in turn: a state replica killed, one frozen, a worker killed, one frozen, a Redis
//! shard killed; each held `fault_secs`, then restored.
//!
//! What it records:
//! - every `sample_secs`: each process's RSS (the state replicas, Envoy) and, from each
//!   replica's `GET /v1/workers`, the fleet's assignments in flight as that replica sees them
//!   (picks are shared through the store), beside the truth: the requests the load has in
//!   flight through Envoy at that moment;
//! - per fault: the requests that failed while it lasted (and 10 s after), and how long after
//!   its end every replica's in-flight count came back to the truth (within `tolerance`, held
//!   for a second);
//! - whether memory is flat: each process's mean RSS over the fifth to tenth minute against
//!   the last five.

use crate::chaos::{back_to_truth, one, prompt, replica_in_flight, Outcome};
use crate::stack::Stack;
use crate::BenchError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct SoakConfig {
    pub duration: Duration,
    pub fault_every: Duration,
    pub fault_secs: f64,
    pub sample_every: Duration,
    pub concurrency: usize,
    pub prompt_tokens: usize,
    pub output_tokens: u32,
    pub model: String,
    /// How far a replica's in-flight count may be from the truth and still count as equal
    /// (requests between their pick and their first report, reports on their way).
    pub tolerance: u64,
}

/// One fault of the cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoakFault {
    KillReplica(usize),
    FreezeReplica(usize),
    KillWorker(usize),
    FreezeWorker(usize),
    KillShard(usize),
}

impl SoakFault {
    pub fn label(self) -> String {
        match self {
            SoakFault::KillReplica(r) => format!("state replica {r} kill -9"),
            SoakFault::FreezeReplica(r) => format!("state replica {r} frozen"),
            SoakFault::KillWorker(i) => format!("worker {i} kill -9"),
            SoakFault::FreezeWorker(i) => format!("worker {i} frozen"),
            SoakFault::KillShard(i) => format!("Redis shard {i} kill -9"),
        }
    }

    fn process(self) -> String {
        match self {
            SoakFault::KillReplica(r) | SoakFault::FreezeReplica(r) => Stack::replica_name(r),
            SoakFault::KillWorker(i) | SoakFault::FreezeWorker(i) => format!("sim{i}"),
            SoakFault::KillShard(i) => format!("redis{i}"),
        }
    }

    fn kills(self) -> bool {
        !matches!(self, SoakFault::FreezeReplica(_) | SoakFault::FreezeWorker(_))
    }
}

/// The cycle for a stack of `replicas`, `workers` and `shards`.
pub fn cycle(replicas: usize, workers: usize, shards: usize) -> Vec<SoakFault> {
    let mut c = vec![SoakFault::KillReplica(0), SoakFault::FreezeReplica(replicas.saturating_sub(1))];
    if workers > 2 {
        c.push(SoakFault::KillWorker(1));
        c.push(SoakFault::FreezeWorker(2));
    }
    if shards > 0 {
        c.push(SoakFault::KillShard(0));
    }
    c
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    pub t_s: f64,
    /// RSS per process, MiB (absent while it is dead).
    pub rss_mib: BTreeMap<String, f64>,
    /// Requests in flight through Envoy.
    pub truth: usize,
    /// Each replica's count of the fleet's assignments in flight (`None`: it did not answer);
    /// each is compared with `truth`.
    pub in_flight: Vec<Option<u64>>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct FaultRow {
    pub at_s: f64,
    pub fault: String,
    pub requests: usize,
    pub failed: usize,
    /// Failures a fault may not cost: all of them, except, for a killed worker, the requests
    /// that were already running on it when it died (nothing may be sent twice).
    pub failed_beyond_running: usize,
    /// Requests that fell back to plain balancing (`x-kvroute-fallback`) in the window.
    pub fallbacks: usize,
    /// After the fault ended: every replica within `tolerance` of the truth, held 1 s.
    pub back_to_truth_ms: Option<f64>,
    /// The largest excess of a replica's in-flight count over the truth seen after the fault
    /// ended (phantom load), until it came back.
    pub max_excess: i64,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SoakReport {
    pub minutes: f64,
    pub total: usize,
    pub failed: usize,
    pub faults: Vec<FaultRow>,
    pub samples: Vec<Sample>,
}

/// Runs the soak on a started `stack`.
pub async fn run(stack: &mut Stack, cfg: &SoakConfig) -> Result<SoakReport, BenchError> {
    let err = |e: reqwest::Error| BenchError::Stack(e.to_string());
    let mut headers = reqwest::header::HeaderMap::new();
    let token = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", stack.config.api_token)).map_err(|e| BenchError::Stack(e.to_string()))?;
    headers.insert(reqwest::header::AUTHORIZATION, token);
    let control = reqwest::Client::builder().default_headers(headers).build().map_err(err)?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(300)).build().map_err(err)?;
    let replicas: Vec<String> = (0..stack.config.replicas.max(1)).map(|r| stack.replica_url(r)).collect();
    let url = format!("{}/v1/completions", stack.envoy_url());
    let start = Instant::now();
    let end = start + cfg.duration;
    let truth = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let done: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    // Production-shaped: conversations over shared prefixes, each turn a fresh tail.
    let prefixes: Arc<Vec<Vec<u32>>> = Arc::new((0..24).map(|p| prompt(31_000 + p, cfg.prompt_tokens)).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..cfg.concurrency.max(1))
        .map(|_| {
            let (client, url, prefixes, next, truth, stop, done, cfg) =
                (client.clone(), url.clone(), prefixes.clone(), next.clone(), truth.clone(), stop.clone(), done.clone(), cfg.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    let mut p = prefixes[n % prefixes.len()].clone();
                    p.extend(prompt(500_000 + n, 64 + n % 192));
                    let body = serde_json::json!({"model": cfg.model, "prompt": p, "max_tokens": cfg.output_tokens, "stream": true,
                        "ignore_eos": true, "stream_options": {"include_usage": true}});
                    truth.fetch_add(1, Ordering::SeqCst);
                    let outcome = one(&client, &url, body).await;
                    truth.fetch_sub(1, Ordering::SeqCst);
                    done.lock().unwrap_or_else(PoisonError::into_inner).push(outcome);
                }
            })
        })
        .collect();

    let faults = cycle(stack.config.replicas, stack.config.workers, stack.config.redis_shards);
    let hold = Duration::from_secs_f64(cfg.fault_secs);
    let (mut samples, mut rows) = (Vec::new(), Vec::new());
    let mut next_sample = Instant::now();
    let mut next_fault = start + cfg.fault_every;
    let mut k = 0;
    let sample = |stack: &Stack, truth: usize, in_flight: Vec<Option<u64>>| {
        let mut rss = BTreeMap::new();
        for r in 0..stack.config.replicas.max(1) {
            let name = Stack::replica_name(r);
            if let Some(m) = stack.rss_mib(&name) {
                rss.insert(name, m);
            }
        }
        if let Some(m) = stack.rss_mib("envoy") {
            rss.insert("envoy".into(), m);
        }
        Sample { t_s: start.elapsed().as_secs_f64(), rss_mib: rss, truth, in_flight }
    };
    while Instant::now() < end {
        if Instant::now() >= next_sample {
            let counts = replica_in_flight(&control, &replicas).await;
            samples.push(sample(stack, truth.load(Ordering::SeqCst), counts));
            next_sample += cfg.sample_every;
        }
        if Instant::now() >= next_fault && Instant::now() + hold + Duration::from_secs(40) < end {
            let fault = faults[k % faults.len()];
            k += 1;
            let t0 = Instant::now();
            let name = fault.process();
            eprintln!("{:>6.0} s: {}", start.elapsed().as_secs_f64(), fault.label());
            if fault.kills() {
                stack.kill(&name)?;
            } else {
                stack.freeze(&name, true)?;
            }
            tokio::time::sleep(hold).await;
            if fault.kills() {
                stack.restart(&name)?;
            } else {
                stack.freeze(&name, false)?;
            }
            let back = Instant::now();
            let b = back_to_truth(&control, &replicas, &truth, cfg.tolerance, back).await;
            tokio::time::sleep(Duration::from_secs(10).saturating_sub(back.elapsed())).await;
            let window_end = Instant::now();
            let row = {
                let d = done.lock().unwrap_or_else(PoisonError::into_inner);
                let during: Vec<&Outcome> = d.iter().filter(|o| o.ended >= t0 && o.started <= window_end).collect();
                let failed: Vec<&&Outcome> = during.iter().filter(|o| !o.served).collect();
                FaultRow {
                    at_s: (t0 - start).as_secs_f64(),
                    fault: fault.label(),
                    requests: during.len(),
                    failed: failed.len(),
                    failed_beyond_running: match fault {
                        SoakFault::KillWorker(_) => failed.iter().filter(|o| o.started >= t0).count(),
                        _ => failed.len(),
                    },
                    fallbacks: during.iter().filter(|o| !o.fallback.is_empty()).count(),
                    back_to_truth_ms: b.after_ms,
                    max_excess: b.max_excess,
                }
            };
            eprintln!(
                "         {} of {} failed ({} beyond those running), {} fell back; back to the truth after {:?} ms (max excess {})",
                row.failed, row.requests, row.failed_beyond_running, row.fallbacks, row.back_to_truth_ms, row.max_excess
            );
            rows.push(row);
            next_fault = t0 + cfg.fault_every;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        let _ = t.await;
    }
    let d = done.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(SoakReport {
        minutes: start.elapsed().as_secs_f64() / 60.0,
        total: d.len(),
        failed: d.iter().filter(|o| !o.served).count(),
        faults: rows,
        samples,
    })
}

/// Mean RSS of `name` over samples in `[from_s, to_s)`.
fn mean_rss(samples: &[Sample], name: &str, from_s: f64, to_s: f64) -> Option<f64> {
    let v: Vec<f64> = samples.iter().filter(|s| s.t_s >= from_s && s.t_s < to_s).filter_map(|s| s.rss_mib.get(name).copied()).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The report as markdown: faults, memory flatness, and the in-flight samples.
pub fn markdown(r: &SoakReport) -> String {
    let mut t = format!("{:.1} minutes, {} requests, {} failed\n\n", r.minutes, r.total, r.failed);
    t.push_str("| at | fault (held, then restored) | requests during it (+10 s) | failed | failed beyond those running on a killed worker | fell back | in flight back to the truth after | largest phantom excess |\n|---|---|---|---|---|---|---|---|\n");
    for f in &r.faults {
        let back = f.back_to_truth_ms.map_or("not within 30 s".to_string(), |ms| format!("{ms:.0} ms"));
        t.push_str(&format!(
            "| {:.0} s | {} | {} | {} | {} | {} | {back} | {} |\n",
            f.at_s, f.fault, f.requests, f.failed, f.failed_beyond_running, f.fallbacks, f.max_excess
        ));
    }
    let last = r.samples.last().map_or(0.0, |s| s.t_s);
    let names: std::collections::BTreeSet<&String> = r.samples.iter().flat_map(|s| s.rss_mib.keys()).collect();
    t.push_str("\n| process | RSS, minutes 5-10 (MiB) | RSS, last 5 minutes (MiB) | change |\n|---|---|---|---|\n");
    for name in names {
        let (a, b) = (mean_rss(&r.samples, name, 300.0, 600.0), mean_rss(&r.samples, name, last - 300.0, last + 1.0));
        let change = match (a, b) {
            (Some(a), Some(b)) => format!("{:+.1}%", (b - a) / a * 100.0),
            _ => "-".into(),
        };
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        t.push_str(&format!("| {name} | {} | {} | {change} |\n", f(a), f(b)));
    }
    t
}

/// RSS per process against time (minutes), from the samples.
pub fn rss_svg(r: &SoakReport) -> String {
    let names: std::collections::BTreeSet<&String> = r.samples.iter().flat_map(|s| s.rss_mib.keys()).collect();
    let series: Vec<(String, Vec<(f64, f64)>)> = names
        .into_iter()
        .map(|name| (name.clone(), r.samples.iter().filter_map(|s| Some((s.t_s / 60.0, *s.rss_mib.get(name)?))).collect()))
        .collect();
    crate::plot::lines_svg(&format!("RSS during a {:.0}-minute soak with faults", r.minutes), "minutes", "RSS (MiB)", &series)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_s: f64, state: f64, in_flight: Vec<Option<u64>>) -> Sample {
        Sample { t_s, rss_mib: BTreeMap::from([("state".to_string(), state)]), truth: 3, in_flight }
    }

    #[test]
    fn the_table_compares_early_and_late_memory_and_says_when_truth_never_came_back() {
        let samples = (0..=60).map(|m| sample(m as f64 * 60.0, if m < 30 { 100.0 } else { 110.0 }, vec![Some(1), Some(2)])).collect();
        let faults = vec![
            FaultRow { at_s: 240.0, fault: SoakFault::FreezeReplica(1).label(), requests: 50, failed: 0, failed_beyond_running: 0, fallbacks: 3, back_to_truth_ms: Some(420.0), max_excess: 1 },
            FaultRow { at_s: 480.0, fault: SoakFault::KillShard(0).label(), requests: 40, failed: 2, failed_beyond_running: 2, fallbacks: 0, back_to_truth_ms: None, max_excess: 9 },
        ];
        let md = markdown(&SoakReport { minutes: 60.0, total: 90, failed: 2, faults, samples });
        assert!(md.contains("| state replica 1 frozen | 50 | 0 | 0 | 3 | 420 ms | 1 |"), "{md}");
        assert!(md.contains("not within 30 s"), "{md}");
        assert!(md.contains("| state | 100.0 | 110.0 | +10.0% |"), "{md}");
        let svg = rss_svg(&SoakReport { minutes: 60.0, total: 0, failed: 0, faults: vec![], samples: vec![sample(0.0, 50.0, vec![]), sample(60.0, 60.0, vec![])] });
        assert!(svg.starts_with("<svg") && svg.contains(">state<"), "{svg}");
    }

    #[test]
    fn the_cycle_covers_each_part() {
        let c = cycle(2, 4, 3);
        assert_eq!(c.len(), 5);
        assert_eq!(c.iter().filter(|f| f.kills()).count(), 3);
        assert_eq!(cycle(1, 2, 0), [SoakFault::KillReplica(0), SoakFault::FreezeReplica(0)]);
    }
}
