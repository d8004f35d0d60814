//! Hand-written SVG plots (no plotting crate, no fonts, a few KB each so they can be
//! committed): the TTFT CDF per policy, goodput against offered rate for sweeps, and plain
//! lines over time (a soak's memory).
//! The CDF's x axis is logarithmic because cache hits and misses differ by 10-100x.

use crate::report::RunReport;
use crate::stats::ttft_cdf;
use std::collections::BTreeMap;
use std::fmt::Write;

const W: f64 = 720.0;
const H: f64 = 420.0;
const L: f64 = 70.0;
const R: f64 = 170.0;
const T: f64 = 40.0;
const B: f64 = 50.0;
const COLORS: &[&str] = &["#d62728", "#7f7f7f", "#ff7f0e", "#9467bd", "#1f77b4", "#2ca02c", "#8c564b", "#e377c2", "#17becf", "#bcbd22"];

/// One colour per known policy (so the peers never share one), other series by their index,
/// from the colours after the known ones on.
fn color(policy: &str, i: usize) -> &'static str {
    // approx_prefix is retired; reports from before it was still redraw in its colour.
    let known = ["random", "round_robin", "least_loaded", "approx_prefix", "kvroute", "sglang_cache_aware", "llmd_default", "dynamo_kv", "sglang_router"];
    let at = known.iter().position(|p| *p == policy).unwrap_or((known.len() + i) % COLORS.len());
    COLORS.get(at).copied().unwrap_or("#000000")
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

struct Frame {
    svg: String,
    x: (f64, f64),
    y: (f64, f64),
    log_x: bool,
}

impl Frame {
    fn new(title: &str, x: (f64, f64), y: (f64, f64), log_x: bool) -> Frame {
        let mut svg = String::new();
        let _ = write!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\
             <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/><text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>",
            (L + W - R) / 2.0,
            esc(title)
        );
        Frame { svg, x, y, log_x }
    }

    fn px(&self, v: f64) -> f64 {
        let f = |v: f64| if self.log_x { v.max(1e-9).log10() } else { v };
        L + (f(v) - f(self.x.0)) / (f(self.x.1) - f(self.x.0)) * (W - L - R)
    }

    fn py(&self, v: f64) -> f64 {
        H - B - (v - self.y.0) / (self.y.1 - self.y.0) * (H - T - B)
    }

    fn axes(&mut self, xticks: &[f64], yticks: &[f64], xlabel: &str, ylabel: &str) {
        for &t in xticks {
            let x = self.px(t);
            let _ = write!(self.svg, "<line x1=\"{x:.1}\" y1=\"{T}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#ddd\"/><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>", H - B, H - B + 16.0, fmt_tick(t));
        }
        for &t in yticks {
            let y = self.py(t);
            let _ = write!(self.svg, "<line x1=\"{L}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>", W - R, L - 6.0, y + 4.0, fmt_tick(t));
        }
        let _ = write!(
            self.svg,
            "<rect x=\"{L}\" y=\"{T}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
             <text transform=\"translate(18 {}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            W - L - R, H - T - B, (L + W - R) / 2.0, H - 12.0, esc(xlabel), (T + H - B) / 2.0, esc(ylabel)
        );
    }

    /// Colour by policy; `dash` (an SVG dash pattern, "" = solid) tells a sweep's rates apart.
    fn series(&mut self, i: usize, policy: &str, name: &str, dash: &str, pts: &[(f64, f64)], step: bool) {
        let c = color(policy, i);
        let mut d = String::new();
        let mut prev_y = None;
        for (k, &(x, y)) in pts.iter().enumerate() {
            let (px, py) = (self.px(x), self.py(y));
            if k == 0 {
                let _ = write!(d, "M{px:.1},{:.1}", self.py(0.0).min(py));
            } else if let (true, Some(p)) = (step, prev_y) {
                let _ = write!(d, " L{px:.1},{p:.1}");
            }
            let _ = write!(d, " L{px:.1},{py:.1}");
            prev_y = Some(py);
        }
        let _ = write!(self.svg, "<path d=\"{d}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/>");
        if !step {
            for &(x, y) in pts {
                let _ = write!(self.svg, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>", self.px(x), self.py(y));
            }
        }
        let ly = T + 16.0 + i as f64 * 20.0;
        let lx = W - R + 14.0;
        let _ = write!(self.svg, "<line x1=\"{lx}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"3\" stroke-dasharray=\"{dash}\"/><text x=\"{}\" y=\"{}\">{}</text>", lx + 22.0, lx + 28.0, ly + 4.0, esc(name));
    }

    fn finish(mut self) -> String {
        self.svg.push_str("</svg>\n");
        self.svg
    }
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 || (v.abs() >= 1.0 && v.fract() == 0.0) { format!("{v:.0}") } else if v.abs() >= 0.1 { format!("{v:.1}") } else { format!("{v}") }
}

/// Dash patterns for the rates of a sweep, in the order they ran.
const DASHES: &[&str] = &["", "7 4", "2 3", "10 3 2 3"];

/// TTFT CDF per pass: colour by policy; in sweeps, the dash pattern by rate and the label
/// carries the rate; with rounds, the label carries the round.
pub fn ttft_cdf_svg(report: &RunReport, title: &str) -> String {
    let mut rates: Vec<f64> = Vec::new();
    for r in report.passes.iter().filter_map(|p| p.rate) {
        if !rates.contains(&r) {
            rates.push(r);
        }
    }
    let rounds = report.has_rounds();
    let series: Vec<(&str, String, &str, Vec<(f64, f64)>)> = report
        .passes
        .iter()
        .map(|p| {
            let (name, dash) = match p.rate.filter(|_| rates.len() > 1) {
                Some(r) => {
                    let k = rates.iter().position(|&x| x == r).unwrap_or(0);
                    (format!("{} {r}/s", p.name(rounds)), DASHES[k % DASHES.len()])
                }
                None => (p.name(rounds), ""),
            };
            (p.policy.as_str(), name, dash, ttft_cdf(&p.samples))
        })
        .collect();
    let all = series.iter().flat_map(|(_, _, _, s)| s.iter().map(|p| p.0));
    let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.01, 1.0) };
    let lo_dec = lo.max(1e-3).log10().floor() as i32;
    let hi_dec = (hi.max(lo * 10.0).log10().ceil() as i32).max(lo_dec + 1);
    let xticks: Vec<f64> = (lo_dec..=hi_dec).map(|e| 10f64.powi(e)).collect();
    let mut f = Frame::new(title, (10f64.powi(lo_dec), 10f64.powi(hi_dec)), (0.0, 1.0), true);
    f.axes(&xticks, &[0.0, 0.25, 0.5, 0.75, 0.9, 1.0], "time to first token (s, log scale)", "fraction of requests");
    let slo_x = f.px(report.slo.ttft_s);
    if report.slo.ttft_s > f.x.0 && report.slo.ttft_s < f.x.1 {
        let _ = write!(f.svg, "<line x1=\"{slo_x:.1}\" y1=\"{T}\" x2=\"{slo_x:.1}\" y2=\"{}\" stroke=\"#000\" stroke-dasharray=\"4 4\"/><text x=\"{:.1}\" y=\"{}\">SLO</text>", H - B, slo_x + 4.0, T + 12.0);
    }
    for (i, (policy, name, dash, pts)) in series.iter().enumerate() {
        f.series(i, policy, name, dash, pts, true);
    }
    f.finish()
}

/// Goodput (requests/min within the SLO) against offered rate, one line per policy.
pub fn goodput_svg(report: &RunReport, title: &str) -> String {
    let mut by_policy: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for p in &report.passes {
        if let Some(r) = p.rate {
            if !order.contains(&p.policy.as_str()) {
                order.push(&p.policy);
            }
            by_policy.entry(&p.policy).or_default().push((r, p.summary.goodput.per_min));
        }
    }
    let xmax = by_policy.values().flatten().map(|p| p.0).fold(0.0, f64::max).max(0.1) * 1.05;
    let ymax = by_policy.values().flatten().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.1;
    let ticks = |max: f64| (0..=5).map(|i| max * i as f64 / 5.0).map(|v| (v * 100.0).round() / 100.0).collect::<Vec<_>>();
    let mut f = Frame::new(title, (0.0, xmax), (0.0, ymax), false);
    f.axes(&ticks(xmax), &ticks(ymax), "offered rate (requests/s)", "goodput (requests/min within SLO)");
    for (i, name) in order.iter().enumerate() {
        let mut pts = by_policy[name].clone();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        f.series(i, name, name, "", &pts, false);
    }
    f.finish()
}

/// Named lines over a linear x axis from 0 (a soak's RSS per process against time).
pub fn lines_svg(title: &str, xlabel: &str, ylabel: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    let pts = || series.iter().flat_map(|(_, p)| p.iter());
    let xmax = pts().map(|p| p.0).fold(0.0, f64::max).max(1.0);
    let ymax = pts().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.1;
    let ticks = |max: f64| (0..=5).map(|i| max * i as f64 / 5.0).map(|v| v.round()).collect::<Vec<_>>();
    let mut f = Frame::new(title, (0.0, xmax), (0.0, ymax), false);
    f.axes(&ticks(xmax), &ticks(ymax), xlabel, ylabel);
    for (i, (name, pts)) in series.iter().enumerate() {
        f.series(i, name, name, "", pts, true);
    }
    f.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{CacheDelta, PassResult};
    use crate::stats::{Sample, Slo, Summary};

    fn report() -> RunReport {
        let pass = |policy: &str, rate: f64, t: f64| {
            let samples: Vec<Sample> =
                (1..=20).map(|i| Sample { ttft_s: Some(t * i as f64), ok: true, ..Default::default() }).collect();
            PassResult {
                round: 1,
                policy: policy.into(),
                rate: Some(rate),
                summary: Summary::new(&samples, 60.0, Slo::default()),
                cache: CacheDelta::default(),
                cache_hit_ratio: None,
                first_scheduled: None,
                share_of_oracle: None,
                promised: None,
                state_degraded: None,
                pick_answer: None,
                queue: Default::default(),
                queue_wait: Default::default(),
                samples,
            }
        };
        RunReport {
            workload: "x".into(),
            params: serde_json::Value::Null,
            slo: Slo::default(),
            cores: 2,
            time_scale: 1.0,
            passes: vec![pass("random", 1.0, 0.5), pass("kvroute", 1.0, 0.02), pass("random", 2.0, 1.0), pass("kvroute", 2.0, 0.03)],
            bounds: None,
        }
    }

    #[test]
    fn svgs_are_well_formed_and_small() {
        let r = report();
        for svg in [ttft_cdf_svg(&r, "TTFT <CDF>"), goodput_svg(&r, "goodput")] {
            assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
            assert_eq!(svg.matches("<path").count(), if svg.contains("CDF") { 4 } else { 2 });
            assert!(!svg.contains("NaN") && !svg.contains("inf"));
            assert!(svg.len() < 40_000);
        }
        let cdf = ttft_cdf_svg(&r, "t");
        assert!(cdf.contains(">kvroute 2/s<"), "{cdf}");
        // Colour follows the policy, the dash pattern the rate.
        assert_eq!(cdf.matches(&format!("stroke=\"{}\"", color("kvroute", 0))).count(), 4, "2 lines + 2 legend marks");
        assert!(cdf.contains(&format!("stroke-dasharray=\"{}\"", DASHES[1])));
    }
}
