//! The open-loop driver. Sessions start at their own times — a seeded Poisson process at
//! the offered rate, or the trace's timestamps — whether or not earlier requests finished,
//! because a closed loop hides queueing: a slow router would simply be sent less. Within a
//! session, turn k+1 is sent when turn k's answer has fully arrived.
//!
//! Bounds: the workload's request count, a wall-clock limit after which nothing new is
//! sent, a per-request timeout, and a cap on requests in flight (the only place the loop
//! can close; hitting it is counted).

use crate::client::{self, Outcome};
use crate::stats::Sample;
use crate::workload::request::{self, Answer};
use crate::workload::text::{self, rng_for, Ns};
use crate::workload::{Session, Workload};
use indicatif::ProgressBar;
use rand::Rng;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

#[derive(Clone, Copy, Debug, serde::Serialize)]
pub enum Arrival {
    /// Seeded Poisson session arrivals at this many per second.
    Poisson { rate: f64 },
    /// The workload's own `at_s` (trace replay; speed already applied).
    Timestamps,
}

#[derive(Clone, Debug)]
pub struct RunSpec {
    /// Where requests go (Envoy's listener), e.g. `http://127.0.0.1:10000`.
    pub base_url: String,
    pub model: String,
    pub arrival: Arrival,
    pub seed: u64,
    pub max_duration: Duration,
    pub request_timeout: Duration,
    pub max_inflight: usize,
    /// The workers' time scale: arrival times are multiplied by it and measured times
    /// divided by it, so rates, latencies and the SLO are all in simulated (GPU) seconds.
    pub time_scale: f64,
    /// Service classes and the share of sessions in each (`--classes`); empty: none. A
    /// session's class is drawn from the seed, and its requests go as tenant `class-<name>`.
    pub classes: Vec<(String, f64)>,
}

/// Session `id`'s class: a seeded draw by the classes' shares.
pub fn class_of(classes: &[(String, f64)], seed: u64, id: u64) -> Option<&str> {
    let total: f64 = classes.iter().map(|(_, w)| w).sum();
    if classes.is_empty() || total.is_nan() || total <= 0.0 {
        return None;
    }
    let mut x = rng_for(seed, Ns::Order, id).gen::<f64>() * total;
    for (name, w) in classes {
        if x < *w {
            return Some(name);
        }
        x -= w;
    }
    classes.last().map(|(n, _)| n.as_str())
}

#[derive(Debug, Default)]
pub struct PassOutput {
    pub samples: Vec<Sample>,
    /// First send to last completion, seconds.
    pub duration_s: f64,
    /// Requests never sent because the time limit passed.
    pub unsent: usize,
    /// Times a send waited for the in-flight cap.
    pub inflight_waits: usize,
}

/// Session start offsets in seconds.
pub fn schedule(workload: &Workload, arrival: Arrival, seed: u64) -> Vec<f64> {
    match arrival {
        Arrival::Timestamps => workload.sessions.iter().map(|s| s.at_s.unwrap_or(0.0)).collect(),
        Arrival::Poisson { rate } => {
            let mut rng = rng_for(seed, Ns::Order, u64::MAX);
            let mut t = 0.0;
            workload
                .sessions
                .iter()
                .map(|_| {
                    let at = t;
                    t += -(1.0 - rng.gen::<f64>()).ln() / rate.max(1e-9);
                    at
                })
                .collect()
        }
    }
}

struct Shared {
    client: reqwest::Client,
    spec: RunSpec,
    url: String,
    mode: crate::workload::PromptMode,
    start: Instant,
    inflight: Semaphore,
    waits: AtomicUsize,
    unsent: AtomicUsize,
    bar: ProgressBar,
}

pub async fn run(workload: &Workload, spec: &RunSpec, bar: ProgressBar) -> PassOutput {
    let ts = if spec.time_scale > 0.0 { spec.time_scale } else { 1.0 };
    let offsets: Vec<f64> = schedule(workload, spec.arrival, spec.seed).into_iter().map(|t| t * ts).collect();
    let client = reqwest::Client::builder().pool_max_idle_per_host(spec.max_inflight).build().unwrap_or_default();
    let shared = Arc::new(Shared {
        client,
        url: format!("{}{}", spec.base_url.trim_end_matches('/'), request::path(workload.mode)),
        mode: workload.mode,
        spec: spec.clone(),
        start: Instant::now(),
        inflight: Semaphore::new(spec.max_inflight.max(1)),
        waits: AtomicUsize::new(0),
        unsent: AtomicUsize::new(0),
        bar,
    });
    let mut tasks = tokio::task::JoinSet::new();
    for (session, at) in workload.sessions.iter().zip(offsets) {
        let (session, shared) = (session.clone(), shared.clone());
        tasks.spawn(async move { run_session(session, at, shared).await });
    }
    let mut samples = Vec::with_capacity(workload.num_requests());
    let mut end = 0.0f64;
    while let Some(r) = tasks.join_next().await {
        for s in r.unwrap_or_default() {
            end = end.max(s.sent_s + s.e2e_s.unwrap_or(0.0));
            samples.push(s);
        }
    }
    samples.sort_by(|a, b| a.sent_s.total_cmp(&b.sent_s));
    let first = samples.first().map_or(0.0, |s| s.sent_s);
    for s in &mut samples {
        s.sent_s /= ts;
        s.ttft_s = s.ttft_s.map(|t| t / ts);
        s.e2e_s = s.e2e_s.map(|t| t / ts);
    }
    PassOutput {
        duration_s: (end - first).max(0.0) / ts,
        samples,
        unsent: shared.unsent.load(Ordering::Relaxed),
        inflight_waits: shared.waits.load(Ordering::Relaxed),
    }
}

async fn run_session(session: Session, at: f64, sh: Arc<Shared>) -> Vec<Sample> {
    tokio::time::sleep_until((sh.start + Duration::from_secs_f64(at)).into()).await;
    let mut answers: Vec<Answer> = Vec::new();
    let mut out = Vec::new();
    let class = class_of(&sh.spec.classes, sh.spec.seed, session.id).map(str::to_string);
    let tenant = class.as_ref().map(|c| format!("class-{c}"));
    for turn in 0..session.turns.len() {
        if sh.start.elapsed() > sh.spec.max_duration {
            sh.unsent.fetch_add(session.turns.len() - turn, Ordering::Relaxed);
            sh.bar.inc((session.turns.len() - turn) as u64);
            break;
        }
        let body = request::body(&sh.spec.model, sh.mode, &session, turn, &answers);
        let permit = match sh.inflight.try_acquire() {
            Ok(p) => p,
            Err(_) => {
                sh.waits.fetch_add(1, Ordering::Relaxed);
                match sh.inflight.acquire().await {
                    Ok(p) => p,
                    Err(_) => break,
                }
            }
        };
        let sent_s = sh.start.elapsed().as_secs_f64();
        let Outcome { mut sample, text: answer_text, token_ids } =
            client::send(&sh.client, &sh.url, &body, tenant.as_deref(), sh.spec.request_timeout).await;
        drop(permit);
        sample.sent_s = sent_s;
        sample.class = class.clone();
        answers.push(match sh.mode {
            crate::workload::PromptMode::Chat => Answer::Text(answer_text),
            crate::workload::PromptMode::Tokens if !token_ids.is_empty() => Answer::Tokens(token_ids),
            crate::workload::PromptMode::Tokens => {
                let n = sample.output_tokens as usize;
                Answer::Tokens(text::tokens(sh.spec.seed, Ns::Answer, session.id * 1_000 + turn as u64, n))
            }
        });
        sh.bar.inc(1);
        let failed = !sample.ok;
        out.push(sample);
        if failed {
            // A conversation whose turn failed does not go on (its history is incomplete).
            sh.unsent.fetch_add(session.turns.len() - turn - 1, Ordering::Relaxed);
            sh.bar.inc((session.turns.len() - turn - 1) as u64);
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::independent::{generate, IndependentSpec};
    use crate::workload::PromptMode;

    #[test]
    fn classes_are_drawn_by_their_shares() {
        let classes = vec![("interactive".to_string(), 0.2), ("batch".to_string(), 0.8)];
        let n = (0..10_000).filter(|id| class_of(&classes, 7, *id) == Some("interactive")).count();
        assert!((1_800..2_200).contains(&n), "{n} of 10000 interactive");
        assert_eq!(class_of(&classes, 7, 42), class_of(&classes, 7, 42));
        assert_eq!(class_of(&[], 7, 1), None);
    }

    #[test]
    fn poisson_schedule_is_seeded_with_the_right_mean_gap() {
        let w = generate(&IndependentSpec { requests: 4000, input_tokens: 1, output_tokens: 1, seed: 1, mode: PromptMode::Tokens })
            .unwrap();
        let a = schedule(&w, Arrival::Poisson { rate: 4.0 }, 3);
        assert_eq!(a, schedule(&w, Arrival::Poisson { rate: 4.0 }, 3));
        assert_ne!(a, schedule(&w, Arrival::Poisson { rate: 4.0 }, 4));
        assert_eq!(a[0], 0.0);
        let mean_gap = a.last().unwrap() / (a.len() - 1) as f64;
        assert!((mean_gap - 0.25).abs() < 0.02, "mean gap {mean_gap}");
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }
}
