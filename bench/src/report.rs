//! A run's results: one [`PassResult`] per (policy, rate), rendered as a terminal table and
//! serialised as JSON (the JSON keeps every sample so plots can be redrawn later).

use crate::bounds::ReuseBounds;
pub use crate::counters::{Buckets, CacheDelta, FirstScheduled};
use crate::stats::{Keying, Promised, Sample, Slo, Summary};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

pub mod medians;

/// First-scheduling reuse over one pass: shares of its prompt tokens served from cache.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Reuse {
    /// The counters' deltas over the pass.
    pub counters: FirstScheduled,
    pub gpu: Option<f64>,
    /// `None` when the sims expose no CPU series (no CPU tier).
    pub cpu: Option<f64>,
    /// GPU + CPU (CPU counted as 0 when absent).
    pub total: Option<f64>,
}

impl Reuse {
    pub fn from_delta(d: FirstScheduled) -> Reuse {
        let share = |x: Option<f64>| x.filter(|_| d.prompt_tokens > 0.0).map(|x| x / d.prompt_tokens);
        let total = d.cached_gpu.map(|g| g + d.cached_cpu.unwrap_or(0.0));
        Reuse { counters: d, gpu: share(d.cached_gpu), cpu: share(d.cached_cpu), total: share(total) }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PassResult {
    pub policy: String,
    /// Which round of a `--repeat` run (1-based; 0 in reports from before rounds existed).
    #[serde(default)]
    pub round: u32,
    /// Offered rate in requests/s (`None` for trace timestamps).
    pub rate: Option<f64>,
    pub summary: Summary,
    pub cache: CacheDelta,
    /// vLLM's `prefix_cache_hits / prefix_cache_queries` over the pass. Counts every
    /// admission, so preempted requests re-hitting their own blocks inflate it.
    pub cache_hit_ratio: Option<f64>,
    /// First-scheduling reuse from the sims' counters; `None` when they lack them ("n/a").
    #[serde(default)]
    pub first_scheduled: Option<Reuse>,
    /// `first_scheduled.total / bounds.oracle.share`: kvroute's (or any policy's) share of
    /// the oracle bound.
    #[serde(default)]
    pub share_of_oracle: Option<f64>,
    /// What the index promised the chosen worker held and the engine did not serve
    /// ([`Promised`]); `None` without exact keys or usage.
    #[serde(default)]
    pub promised: Option<Promised>,
    /// Degraded decisions counted by the state service over the pass, when it exposes them.
    pub state_degraded: Option<f64>,
    /// The state service's pick answer times over the pass (tokenizing included).
    #[serde(default)]
    pub pick_answer: Option<Buckets>,
    /// The state service's queued picks over the pass by outcome (`dispatched`,
    /// `shed_deadline`, ...; `kvroute_queue_outcomes_total`); empty when none queued.
    #[serde(default)]
    pub queue: std::collections::BTreeMap<String, f64>,
    /// Their waits in the queue by class (dispatched picks; histogram delta over the pass).
    #[serde(default)]
    pub queue_wait: std::collections::BTreeMap<String, Buckets>,
    pub samples: Vec<Sample>,
}

impl PassResult {
    /// The pass's name in tables and plots: the policy, with its round in a `--repeat` run.
    pub fn name(&self, rounds: bool) -> String {
        if rounds {
            format!("{} #{}", self.policy, self.round)
        } else {
            self.policy.clone()
        }
    }

    /// Sets `share_of_oracle` from the workload's bounds, and `promised` with their block size.
    pub fn relate_to(&mut self, bounds: Option<&ReuseBounds>) {
        self.promised = bounds.and_then(|b| Promised::of(&self.samples, u32::try_from(b.capacity.block_size).unwrap_or(u32::MAX)));
        let oracle = bounds.and_then(|b| b.oracle.share).filter(|s| *s > 0.0);
        self.share_of_oracle = match (self.first_scheduled.as_ref().and_then(|r| r.total), oracle) {
            (Some(t), Some(o)) => Some(t / o),
            _ => None,
        };
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunReport {
    pub workload: String,
    pub params: serde_json::Value,
    pub slo: Slo,
    pub cores: usize,
    /// The workers' time scale; every time and rate here is in simulated seconds.
    #[serde(default = "one")]
    pub time_scale: f64,
    pub passes: Vec<PassResult>,
    /// The workload's reuse bounds (policy-independent), when they were computed.
    #[serde(default)]
    pub bounds: Option<ReuseBounds>,
}

impl RunReport {
    /// Whether some policy ran more than one round (`--repeat`).
    pub fn has_rounds(&self) -> bool {
        self.passes.iter().any(|p| p.round > 1)
    }
}

fn one() -> f64 {
    1.0
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| if x < 10.0 { format!("{x:.3}") } else { format!("{x:.1}") })
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
}

fn pct_na(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |x| format!("{:.1}%", x * 100.0))
}

const HEAD: [&str; 22] = [
    "policy", "rate/s", "reqs", "fail", "ttft p50", "ttft p90", "ttft p99", "e2e p50", "e2e p90", "goodput/min", "<=slo",
    "vllm hit", "reuse", "gpu", "cpu", "of oracle", "gone", "req/s", "tok/s", "degraded", "keys", "pick ms",
];

/// `p50/p99` of the pass's pick answer times in ms (real time: the service's clock).
fn pick_ms(p: &PassResult) -> String {
    let q = |x: f64| p.pick_answer.as_ref().and_then(|b| b.quantile(x)).map_or("-".into(), |v| format!("{:.2}", v * 1000.0));
    format!("{}/{}", q(0.5), q(0.99))
}

/// True when `p` sent fewer requests than the bounds cover (time limit, failed turns).
fn partial(report: &RunReport, p: &PassResult) -> bool {
    report.bounds.as_ref().is_some_and(|b| p.summary.requests < b.requests)
}

fn rows(report: &RunReport) -> Vec<Vec<String>> {
    let rounds = report.has_rounds();
    report
        .passes
        .iter()
        .map(|p| {
            let s = &p.summary;
            let degraded = match p.state_degraded {
                Some(d) => format!("{}/{}", s.degraded, d as u64),
                None => s.degraded.to_string(),
            };
            vec![
                p.name(rounds),
                p.rate.map_or("trace".into(), |r| format!("{r:.2}")),
                s.requests.to_string(),
                s.failed.to_string(),
                secs(s.ttft_p50),
                secs(s.ttft_p90),
                secs(s.ttft_p99),
                secs(s.e2e_p50),
                secs(s.e2e_p90),
                format!("{:.1}", s.goodput.per_min),
                format!("{}{}", pct(Some(s.goodput.within_slo)), if s.goodput.slo_met { "" } else { "!" }),
                pct(p.cache_hit_ratio),
                pct_na(p.first_scheduled.as_ref().and_then(|r| r.total)),
                pct_na(p.first_scheduled.as_ref().and_then(|r| r.gpu)),
                pct_na(p.first_scheduled.as_ref().and_then(|r| r.cpu)),
                format!("{}{}", pct_na(p.share_of_oracle), if partial(report, p) && p.share_of_oracle.is_some() { "*" } else { "" }),
                pct_na(p.promised.as_ref().and_then(Promised::gone_share)),
                format!("{:.2}", s.requests_per_s),
                format!("{:.0}", s.output_tokens_per_s),
                degraded,
                Keying::of(&p.samples).map_or("-".into(), |k| k.cell()),
                pick_ms(p),
            ]
        })
        .collect()
}

/// The lines under the table: units, and the workload's reuse bounds.
fn footer(report: &RunReport) -> Vec<String> {
    let mut out = vec![format!(
        "times in simulated s (time scale {}); goodput = requests/min with TTFT <= {} s; '!' = fewer than {:.0}% within the SLO; degraded = from response headers[/state-service metric]; keys = how the prompts became keys (exact, else text chunks by why); pick ms = the state service's answer time p50/p99, tokenizing included (real ms)",
        report.time_scale,
        report.slo.ttft_s,
        report.slo.attainment * 100.0
    )];
    out.push(
        "vllm hit = vllm:prefix_cache hits/queries (every admission, preemptions re-count); reuse = prompt tokens served from cache at first scheduling (sims' counters, gpu + cpu; n/a = not exposed); of oracle = reuse / oracle bound; gone = of the prompt tokens the index said the chosen worker held (exact keys), the share the engine did not serve from cache (evicted while the request queued)".into(),
    );
    if let Some(b) = &report.bounds {
        out.push(b.summary());
        if report.passes.iter().any(|p| partial(report, p)) {
            out.push(format!("* the pass sent fewer requests than the {} the bounds cover: its share of the oracle compares different request sets", b.requests));
        }
    }
    out.extend(per_class(report));
    let rounds = report.passes.iter().any(|p| p.round > 1);
    for p in report.passes.iter().filter(|p| !p.queue.is_empty()) {
        let outcomes: Vec<String> = p.queue.iter().map(|(o, n)| format!("{o} {n}")).collect();
        out.push(format!("{} queued picks: {}", p.name(rounds), outcomes.join(", ")));
        for (class, b) in &p.queue_wait {
            let f = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.2}"));
            out.push(format!(
                "{} class {class}: queue wait p50 {} s, p99 {} s, none over {} s (real s; histogram bound)",
                p.name(rounds),
                f(b.quantile(0.5)),
                f(b.quantile(0.99)),
                f(b.bound())
            ));
        }
    }
    out
}

/// One line per pass and service class (`--classes`): requests, failed (shed included), TTFT.
fn per_class(report: &RunReport) -> Vec<String> {
    let rounds = report.passes.iter().any(|p| p.round > 1);
    let mut out = Vec::new();
    for p in &report.passes {
        let classes: std::collections::BTreeSet<&str> = p.samples.iter().filter_map(|s| s.class.as_deref()).collect();
        for class in classes {
            let samples: Vec<Sample> = p.samples.iter().filter(|s| s.class.as_deref() == Some(class)).cloned().collect();
            let s = Summary::new(&samples, p.summary.duration_s, report.slo);
            let f = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.3}"));
            out.push(format!(
                "{} class {class}: {} requests, {} failed or shed; TTFT p50 / p90 / p99 {} / {} / {} s; {:.1}% within {} s",
                p.name(rounds),
                s.requests,
                s.failed,
                f(s.ttft_p50),
                f(s.ttft_p90),
                f(s.ttft_p99),
                s.goodput.within_slo * 100.0,
                report.slo.ttft_s
            ));
        }
    }
    out
}

/// The comparison table, one row per pass.
pub fn table(report: &RunReport) -> String {
    let rows = rows(report);
    let widths: Vec<usize> =
        (0..HEAD.len()).map(|i| rows.iter().map(|r| r[i].len()).chain([HEAD[i].len()]).max().unwrap_or(0)).collect();
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        let parts: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:>w$}")).collect();
        let _ = writeln!(out, "{}", parts.join("  "));
    };
    line(&mut out, &HEAD.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    for r in &rows {
        line(&mut out, r);
    }
    for l in footer(report) {
        let _ = writeln!(out, "{l}");
    }
    let medians = medians::markdown(report);
    if !medians.is_empty() {
        let _ = write!(out, "\n{medians}");
    }
    out
}

/// The same table as GitHub markdown, for bench/README.md.
pub fn markdown(report: &RunReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {} |\n|{}", HEAD.join(" | "), "---|".repeat(HEAD.len()));
    for r in rows(report) {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    out.push('\n');
    for l in footer(report) {
        let _ = writeln!(out, "\n{l}");
    }
    let medians = medians::markdown(report);
    if !medians.is_empty() {
        let _ = write!(out, "\n{medians}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(policy: &str, ttft: f64) -> PassResult {
        let samples: Vec<Sample> = (0..4)
            .map(|_| Sample { ttft_s: Some(ttft), e2e_s: Some(ttft + 1.0), ok: true, output_tokens: 8, ..Default::default() })
            .collect();
        let summary = Summary::new(&samples, 60.0, Slo::default());
        let cache = CacheDelta { queries: 100.0, hits: 75.0 };
        PassResult {
            policy: policy.into(),
            round: 1,
            rate: Some(1.0),
            summary,
            cache_hit_ratio: cache.hit_ratio(),
            cache,
            first_scheduled: None,
            share_of_oracle: None,
            promised: None,
            state_degraded: None,
            pick_answer: None,
            queue: Default::default(),
            queue_wait: Default::default(),
            samples,
        }
    }

    fn run_of(passes: Vec<PassResult>) -> RunReport {
        RunReport { workload: "trace".into(), params: serde_json::json!({}), slo: Slo::default(), cores: 2, time_scale: 1.0, passes, bounds: None }
    }

    #[test]
    fn table_and_json_roundtrip() {
        let r = run_of(vec![pass("random", 3.0), pass("kvroute", 0.2)]);
        let t = table(&r);
        assert!(t.contains("kvroute") && t.contains("75.0%") && t.contains("0.200"));
        assert!(t.contains("n/a"), "no first-scheduling counters -> n/a");
        let md = markdown(&r);
        assert!(md.starts_with("| policy | rate/s"));
        assert_eq!(md.lines().filter(|l| l.starts_with("| ")).count(), 3);
        assert!(md.lines().filter(|l| l.starts_with("| ")).all(|l| l.matches(" | ").count() == HEAD.len() - 1));
        let back: RunReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.passes.len(), 2);
        assert_eq!(CacheDelta::default().hit_ratio(), None);
    }

    #[test]
    fn rounds_are_named_and_their_medians_tabled() {
        let round = |policy: &str, ttft: f64, n: u32| PassResult { round: n, ..pass(policy, ttft) };
        let r = run_of(vec![round("kvroute", 1.0, 1), round("llmd_default", 2.0, 1), round("kvroute", 3.0, 2), round("kvroute", 8.0, 3)]);
        let rows = medians::medians(&r);
        assert_eq!(rows.len(), 1, "a policy that ran once has no median row");
        assert_eq!((rows[0].policy.as_str(), rows[0].rounds, rows[0].ttft_p50), ("kvroute", 3, Some(3.0)));
        let md = markdown(&r);
        assert!(md.contains("| kvroute #3 |") && md.contains("| llmd_default #1 |"), "{md}");
        assert!(md.contains("| kvroute | 1.00 | 3 | 3.000 | 3.000 | 3.000 |"), "{md}");
        assert!(table(&r).contains("median over rounds"));
        // One round: plain names, no medians.
        let single = run_of(vec![pass("kvroute", 1.0)]);
        assert!(!markdown(&single).contains('#') && !markdown(&single).contains("median"));
    }

    #[test]
    fn runs_merge_into_rounds_of_one_table() {
        // Round 1: a run with the queue, then one of the peers; round 2 the same.
        let runs = vec![
            run_of(vec![pass("kvroute+queue", 1.0)]),
            run_of(vec![pass("kvroute", 2.0), pass("llmd_default", 4.0)]),
            run_of(vec![pass("kvroute+queue", 3.0)]),
            run_of(vec![pass("kvroute", 2.0), pass("llmd_default", 6.0)]),
        ];
        let merged = medians::merge(runs).unwrap();
        let rounds: Vec<(&str, u32)> = merged.passes.iter().map(|p| (p.policy.as_str(), p.round)).collect();
        assert_eq!(rounds, [("kvroute+queue", 1), ("kvroute", 1), ("llmd_default", 1), ("kvroute+queue", 2), ("kvroute", 2), ("llmd_default", 2)]);
        let rows = medians::medians(&merged);
        let p50 = |policy: &str| rows.iter().find(|r| r.policy == policy).and_then(|r| r.ttft_p50);
        assert_eq!((p50("kvroute+queue"), p50("kvroute"), p50("llmd_default")), (Some(2.0), Some(2.0), Some(5.0)));
        assert!(merged.params.as_array().is_some_and(|a| a.len() == 4));
        // Another workload does not merge.
        let other = RunReport { workload: "other".into(), ..run_of(vec![pass("kvroute", 1.0)]) };
        assert!(medians::merge(vec![run_of(vec![]), other]).is_err());
    }

    #[test]
    fn old_reports_without_reuse_fields_still_load() {
        let mut v = serde_json::to_value(pass("random", 1.0)).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("first_scheduled");
        o.remove("share_of_oracle");
        o.remove("round");
        o.remove("promised");
        let p: PassResult = serde_json::from_value(v).unwrap();
        assert_eq!(p.first_scheduled, None);
        let r = serde_json::json!({"workload": "x", "params": {}, "slo": {"ttft_s": 8.0, "attainment": 0.9}, "cores": 2, "passes": []});
        let r: RunReport = serde_json::from_value(r).unwrap();
        assert!(r.bounds.is_none());
    }

    #[test]
    fn reuse_shares_and_share_of_oracle() {
        let before = FirstScheduled { prompt_tokens: 1000.0, cached_gpu: Some(100.0), cached_cpu: None };
        let after = FirstScheduled { prompt_tokens: 5000.0, cached_gpu: Some(2100.0), cached_cpu: None };
        let r = Reuse::from_delta(after.since(&before));
        assert_eq!(r.counters.prompt_tokens, 4000.0);
        assert_eq!((r.gpu, r.cpu, r.total), (Some(0.5), None, Some(0.5)));
        let with_cpu = FirstScheduled { prompt_tokens: 100.0, cached_gpu: Some(30.0), cached_cpu: Some(10.0) };
        let r2 = Reuse::from_delta(with_cpu.since(&FirstScheduled { cached_gpu: Some(0.0), cached_cpu: Some(0.0), ..Default::default() }));
        assert_eq!((r2.gpu, r2.cpu, r2.total), (Some(0.3), Some(0.1), Some(0.4)));
        // A counter missing before or after: n/a; no prompt tokens: n/a.
        assert_eq!(Reuse::from_delta(after.since(&FirstScheduled::default())).gpu, None);
        assert_eq!(Reuse::from_delta(FirstScheduled { cached_gpu: Some(0.0), ..Default::default() }).total, None);

        let mut p = pass("kvroute", 0.2);
        p.first_scheduled = Some(r);
        let cap = crate::bounds::Capacity { block_size: 16, gpu_blocks: 10, cpu_blocks: 0, engines: 1, source: "flags".into() };
        let mut b = crate::bounds::compute(&[], crate::bounds::Ordering::Arrival, false, cap);
        p.relate_to(Some(&b));
        assert_eq!(p.share_of_oracle, None, "an empty workload has no oracle share");
        b.oracle.share = Some(0.8);
        p.relate_to(Some(&b));
        assert_eq!(p.share_of_oracle, Some(0.625));
        p.relate_to(None);
        assert_eq!(p.share_of_oracle, None);
        let report = RunReport {
            workload: "trace".into(),
            params: serde_json::json!({}),
            slo: Slo::default(),
            cores: 2,
            time_scale: 1.0,
            passes: vec![{
                p.relate_to(Some(&b));
                p
            }],
            bounds: Some(b),
        };
        let t = table(&report);
        assert!(t.contains("50.0%") && t.contains("62.5%") && t.contains("oracle 80.0%"), "{t}");
        assert!(markdown(&report).contains("workload reuse bounds"));
        assert!(!t.contains("62.5%*"));
        let mut cut = report;
        if let Some(b) = cut.bounds.as_mut() {
            b.requests = 10; // the pass sent 4
        }
        let t = table(&cut);
        assert!(t.contains("62.5%*") && t.contains("fewer requests than the 10"), "{t}");
    }
}
