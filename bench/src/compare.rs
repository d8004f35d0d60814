//! A comparison run: for each offered rate, one pass per policy on the same stack and the
//! same workload. Before each pass the workers' prefix caches and the state service are
//! reset and the policy is switched, so no pass inherits another's warm cache; after it,
//! the run waits for the workers to drain so stragglers do not load the next pass.

use crate::bounds::ReuseBounds;
use crate::control::Control;
use crate::peer_router::{PeerRouter, SGLANG_ROUTER};
use crate::report::{CacheDelta, PassResult, Reuse, RunReport};
use crate::runner::{self, Arrival, RunSpec};
use crate::stats::{Slo, Summary};
use crate::workload::Workload;
use crate::BenchError;
use indicatif::{ProgressBar, ProgressStyle};
use std::time::Duration;

/// Every policy the state service knows (its `score::Policy` names).
pub const POLICIES: [&str; 7] =
    ["random", "round_robin", "least_loaded", "sglang_cache_aware", "llmd_default", "dynamo_kv", "kvroute"];

/// What a comparison runs unless told otherwise: the plain balancers, the peers users would
/// deploy instead (SGLang's, llm-d's and Dynamo's published rules with their defaults), kvroute.
pub const DEFAULT_POLICIES: [&str; 6] = ["random", "least_loaded", "sglang_cache_aware", "llmd_default", "dynamo_kv", "kvroute"];

#[derive(Clone, Debug)]
pub struct CompareSpec {
    pub policies: Vec<String>,
    /// Rounds: every policy runs this many times, round after round, so drift over the run
    /// reaches every policy alike (at least 1).
    pub repeat: u32,
    /// Offered rates (requests/s); ignored for timestamped workloads.
    pub rates: Vec<f64>,
    pub run: RunSpec,
    pub slo: Slo,
    /// Pause after the resets, so the events they cause reach the state service first.
    pub settle: Duration,
    pub drain_limit: Duration,
    pub progress: bool,
    /// Copied from `run.time_scale` into the report.
    pub time_scale: f64,
    /// The real SGLang router, for the `sglang_router` row (see [`crate::peer_router`]).
    pub peer: Option<PeerRouter>,
    /// Passes are named `POLICY+VARIANT` (the stack's configuration, e.g. `queue`), so that
    /// reports of several configurations merge into one table ([`crate::report::medians::merge`]).
    pub variant: Option<String>,
}

fn bar(len: usize, label: String, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len as u64);
    let style = ProgressStyle::with_template("{prefix:>28} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    b.set_style(style);
    b.set_prefix(label);
    b.enable_steady_tick(Duration::from_millis(500));
    b
}

pub async fn run_pass(
    workload: &Workload,
    control: &Control,
    spec: &CompareSpec,
    policy: &str,
    rate: Option<f64>,
) -> Result<PassResult, BenchError> {
    control.reset_workers().await?;
    control.reset_state().await?;
    let mut run = spec.run.clone();
    // The real SGLang router takes the requests instead of Envoy (a fresh one per pass); the
    // state service stays out of their path.
    let _router = if policy == SGLANG_ROUTER {
        let peer = spec.peer.as_ref().ok_or_else(|| {
            BenchError::Stack("the sglang_router row needs the sglang-router binary (pip install sglang-router; --sglang-router PATH)".into())
        })?;
        let child = peer.start().await?;
        run.base_url = peer.url();
        Some(child)
    } else {
        control.set_policy(policy).await?;
        None
    };
    tokio::time::sleep(spec.settle).await;
    let before = control.cache_counters().await?;
    let first_before = control.first_scheduled().await;
    let degraded_before = control.state_degraded().await;
    let answers_before = control.pick_answer().await;
    let queue_before = control.queue_outcomes().await;
    let waits_before = control.queue_waits().await;
    run.arrival = match rate {
        Some(rate) => Arrival::Poisson { rate },
        None => Arrival::Timestamps,
    };
    let label = match rate {
        Some(r) => format!("{policy} @ {r:.2}/s"),
        None => format!("{policy} (trace)"),
    };
    let b = bar(workload.num_requests(), label, spec.progress);
    let out = runner::run(workload, &run, b.clone()).await;
    b.finish_with_message(format!("{:.0} s", out.duration_s));
    let drained = control.wait_idle(spec.drain_limit).await;
    if !drained {
        eprintln!("warning: workers still busy {:?} after the {policy} pass", spec.drain_limit);
    }
    let after = control.cache_counters().await?;
    let cache = CacheDelta { queries: after.queries - before.queries, hits: after.hits - before.hits };
    let first_scheduled = match (first_before, control.first_scheduled().await) {
        (Some(b), Some(a)) => Some(Reuse::from_delta(a.since(&b))),
        _ => None,
    };
    let state_degraded = match (degraded_before, control.state_degraded().await) {
        (Some(b), Some(a)) => Some(a - b),
        (None, Some(a)) => Some(a),
        _ => None,
    };
    let pick_answer = match (answers_before, control.pick_answer().await) {
        (Some(b), Some(a)) => Some(a.since(&b)),
        (None, a) => a,
        _ => None,
    };
    let mut queue = control.queue_outcomes().await;
    for (outcome, n) in &mut queue {
        *n -= queue_before.get(outcome).copied().unwrap_or(0.0);
    }
    queue.retain(|_, n| *n > 0.0);
    let mut queue_wait = control.queue_waits().await;
    for (class, b) in &mut queue_wait {
        if let Some(before) = waits_before.get(class) {
            *b = b.since(before);
        }
    }
    queue_wait.retain(|_, b| b.bound().is_some());
    Ok(PassResult {
        pick_answer,
        queue,
        queue_wait,
        policy: match &spec.variant {
            Some(v) => format!("{policy}+{v}"),
            None => policy.to_string(),
        },
        round: 1,
        rate,
        summary: Summary::new(&out.samples, out.duration_s, spec.slo),
        cache_hit_ratio: cache.hit_ratio(),
        cache,
        first_scheduled,
        share_of_oracle: None,
        promised: None,
        state_degraded,
        samples: out.samples,
    })
}

/// Every (rate, round, policy) pass, in that order; `on_pass` sees each result as it lands.
/// `bounds`: the workload's reuse bounds, which each pass's reuse is related to.
pub async fn compare(
    workload: &Workload,
    control: &Control,
    spec: &CompareSpec,
    params: serde_json::Value,
    bounds: Option<ReuseBounds>,
    mut on_pass: impl FnMut(&PassResult),
) -> Result<RunReport, BenchError> {
    let rates: Vec<Option<f64>> =
        if workload.is_timed() { vec![None] } else { spec.rates.iter().copied().map(Some).collect() };
    let mut passes = Vec::new();
    for rate in rates {
        for round in 1..=spec.repeat.max(1) {
            for policy in &spec.policies {
                let mut p = run_pass(workload, control, spec, policy, rate).await?;
                p.round = round;
                p.relate_to(bounds.as_ref());
                on_pass(&p);
                passes.push(p);
            }
        }
    }
    Ok(RunReport {
        workload: workload.name.clone(),
        params,
        slo: spec.slo,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        time_scale: spec.time_scale,
        passes,
        bounds,
    })
}
