//! Medians over repeated rounds (`--repeat N`, or the reports of several runs merged by
//! [`merge`]): one row per (rate, policy) that ran more than once. A single pass of a saturated workload moves by tens of percent between runs (a
//! burst's queues are chaotic), so a claim about policies rests on these, not on one row.

use super::{PassResult, RunReport};
use crate::stats::{percentile, sorted};
use std::fmt::Write;

#[derive(Clone, Debug, PartialEq)]
pub struct MedianRow {
    pub policy: String,
    pub rate: Option<f64>,
    pub rounds: usize,
    pub ttft_p50: Option<f64>,
    pub ttft_p90: Option<f64>,
    pub ttft_p99: Option<f64>,
    pub goodput_per_min: Option<f64>,
    pub reuse: Option<f64>,
}

fn median(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    percentile(&sorted(values.flatten()), 50.0)
}

/// Rows in first-appearance order, only for (rate, policy) pairs with two passes or more.
pub fn medians(report: &RunReport) -> Vec<MedianRow> {
    let mut groups: Vec<(&str, Option<f64>, Vec<&PassResult>)> = Vec::new();
    for p in &report.passes {
        match groups.iter_mut().find(|(policy, rate, _)| *policy == p.policy && *rate == p.rate) {
            Some((_, _, passes)) => passes.push(p),
            None => groups.push((&p.policy, p.rate, vec![p])),
        }
    }
    groups
        .into_iter()
        .filter(|(_, _, passes)| passes.len() > 1)
        .map(|(policy, rate, passes)| MedianRow {
            policy: policy.to_string(),
            rate,
            rounds: passes.len(),
            ttft_p50: median(passes.iter().map(|p| p.summary.ttft_p50)),
            ttft_p90: median(passes.iter().map(|p| p.summary.ttft_p90)),
            ttft_p99: median(passes.iter().map(|p| p.summary.ttft_p99)),
            goodput_per_min: median(passes.iter().map(|p| Some(p.summary.goodput.per_min))),
            reuse: median(passes.iter().map(|p| p.first_scheduled.as_ref().and_then(|r| r.total))),
        })
        .collect()
}

/// The reports of several runs of one workload as one report, each (policy, rate)'s passes
/// numbered as rounds in the order given: the way to put variants that need different stacks
/// (with and without a queue, each named by `--variant`) into the same rounds, one run of
/// each per round. `params` becomes the list of the runs' parameters.
pub fn merge(reports: Vec<RunReport>) -> Result<RunReport, String> {
    let mut reports = reports.into_iter();
    let mut merged = reports.next().ok_or("no report to merge")?;
    merged.params = serde_json::Value::Array(vec![std::mem::take(&mut merged.params)]);
    for r in reports {
        if r.workload != merged.workload || r.time_scale != merged.time_scale || r.slo != merged.slo {
            return Err(format!(
                "reports of different runs: workload {} at time scale {} and SLO {:?} against {} at {} and {:?}",
                r.workload, r.time_scale, r.slo, merged.workload, merged.time_scale, merged.slo
            ));
        }
        if let serde_json::Value::Array(all) = &mut merged.params {
            all.push(r.params);
        }
        merged.passes.extend(r.passes);
    }
    let mut seen: Vec<(String, Option<f64>)> = Vec::new();
    for p in &mut merged.passes {
        let key = (p.policy.clone(), p.rate);
        p.round = 1 + seen.iter().filter(|k| **k == key).count() as u32;
        seen.push(key);
    }
    Ok(merged)
}

/// The medians as a markdown table (empty when nothing ran twice).
pub fn markdown(report: &RunReport) -> String {
    let rows = medians(report);
    if rows.is_empty() {
        return String::new();
    }
    let secs = |v: Option<f64>| v.map_or("-".into(), |x| if x < 10.0 { format!("{x:.3}") } else { format!("{x:.1}") });
    let pct = |v: Option<f64>| v.map_or("n/a".into(), |x| format!("{:.1}%", x * 100.0));
    let mut out = String::from(
        "median over rounds:\n\n| policy | rate/s | rounds | ttft p50 | ttft p90 | ttft p99 | goodput/min | reuse |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.policy,
            r.rate.map_or("trace".into(), |x| format!("{x:.2}")),
            r.rounds,
            secs(r.ttft_p50),
            secs(r.ttft_p90),
            secs(r.ttft_p99),
            r.goodput_per_min.map_or("-".into(), |g| format!("{g:.1}")),
            pct(r.reuse),
        );
    }
    out
}
