//! A run's results: one [`PassResult`] per (policy, rate), rendered as a terminal table and
//! serialised as JSON (the JSON keeps every sample so plots can be redrawn later).

use crate::stats::{Sample, Slo, Summary};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Prefix-cache counters summed over all workers, as deltas over one pass.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CacheDelta {
    pub queries: f64,
    pub hits: f64,
}

impl CacheDelta {
    pub fn hit_ratio(&self) -> Option<f64> {
        (self.queries > 0.0).then(|| self.hits / self.queries)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PassResult {
    pub policy: String,
    /// Offered rate in requests/s (`None` for trace timestamps).
    pub rate: Option<f64>,
    pub summary: Summary,
    pub cache: CacheDelta,
    pub cache_hit_ratio: Option<f64>,
    /// Degraded decisions counted by the state service over the pass, when it exposes them.
    pub state_degraded: Option<f64>,
    pub samples: Vec<Sample>,
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

/// The comparison table, one row per pass.
pub fn table(report: &RunReport) -> String {
    let head = [
        "policy", "rate/s", "reqs", "fail", "ttft p50", "ttft p90", "ttft p99", "e2e p50", "e2e p90", "goodput/min",
        "<=slo", "cache hit", "req/s", "tok/s", "degraded",
    ];
    let rows: Vec<Vec<String>> = report
        .passes
        .iter()
        .map(|p| {
            let s = &p.summary;
            let degraded = match p.state_degraded {
                Some(d) => format!("{}/{}", s.degraded, d as u64),
                None => s.degraded.to_string(),
            };
            vec![
                p.policy.clone(),
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
                format!("{:.2}", s.requests_per_s),
                format!("{:.0}", s.output_tokens_per_s),
                degraded,
            ]
        })
        .collect();
    let widths: Vec<usize> =
        (0..head.len()).map(|i| rows.iter().map(|r| r[i].len()).chain([head[i].len()]).max().unwrap_or(0)).collect();
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        let parts: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:>w$}")).collect();
        let _ = writeln!(out, "{}", parts.join("  "));
    };
    line(&mut out, &head.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    for r in &rows {
        line(&mut out, r);
    }
    let _ = writeln!(
        out,
        "times in simulated s (time scale {}); goodput = requests/min with TTFT <= {} s; '!' = fewer than {:.0}% within the SLO; degraded = from response headers[/state-service metric]",
        report.time_scale,
        report.slo.ttft_s,
        report.slo.attainment * 100.0
    );
    out
}

/// The same table as GitHub markdown, for bench/README.md.
pub fn markdown(report: &RunReport) -> String {
    let t = table(report);
    let mut lines = t.lines();
    let mut out = String::new();
    let cells = |l: &str| l.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect::<Vec<_>>().join(" | ");
    if let Some(h) = lines.next() {
        let n = h.split("  ").filter(|c| !c.trim().is_empty()).count();
        let _ = writeln!(out, "| {} |\n|{}", cells(h), "---|".repeat(n));
    }
    for l in lines {
        if l.starts_with("times in") {
            let _ = writeln!(out, "\n{l}");
        } else {
            let _ = writeln!(out, "| {} |", cells(l));
        }
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
        PassResult { policy: policy.into(), rate: Some(1.0), summary, cache_hit_ratio: cache.hit_ratio(), cache, state_degraded: None, samples }
    }

    #[test]
    fn table_and_json_roundtrip() {
        let r = RunReport {
            workload: "shared_prefix".into(),
            params: serde_json::json!({}),
            slo: Slo::default(),
            cores: 2,
            time_scale: 1.0,
            passes: vec![pass("random", 3.0), pass("kvroute", 0.2)],
        };
        let t = table(&r);
        assert!(t.contains("kvroute") && t.contains("75.0%") && t.contains("0.200"));
        let md = markdown(&r);
        assert!(md.starts_with("| policy | rate/s"));
        assert_eq!(md.lines().filter(|l| l.starts_with("| ")).count(), 3);
        let back: RunReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.passes.len(), 2);
        assert_eq!(CacheDelta::default().hit_ratio(), None);
    }
}
