//! Statistics over one pass's request outcomes: latency percentiles, throughput and goodput
//! under a TTFT SLO.
//!
//! Percentiles interpolate linearly between closest ranks (the "type 7" definition used by
//! numpy and most dashboards), so p50 of an even-sized sample is the mean of the middle two.
//! Failed requests have no TTFT; they count against goodput and SLO attainment (a request
//! that never produced a token did not meet any latency objective) but are excluded from
//! the latency percentiles, and reported separately.

use serde::{Deserialize, Serialize};

/// What one request did, as the load generator saw it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Sample {
    /// Send time relative to the start of the pass, seconds.
    pub sent_s: f64,
    pub ttft_s: Option<f64>,
    pub e2e_s: Option<f64>,
    pub ok: bool,
    pub output_tokens: u32,
    pub prompt_tokens: u32,
    /// Prompt tokens the server reported as served from its prefix cache.
    pub cached_tokens: Option<u32>,
    pub worker: Option<String>,
    pub decision: Option<String>,
    pub fallback: Option<String>,
    pub error: Option<String>,
    /// The service class the request was sent as (`--classes`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

/// The latency objective: TTFT under `ttft_s` for at least `attainment` of requests.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Slo {
    pub ttft_s: f64,
    pub attainment: f64,
}

impl Default for Slo {
    fn default() -> Self {
        Slo { ttft_s: 8.0, attainment: 0.9 }
    }
}

/// `p` in [0, 100] of an ascending slice; `None` for an empty one.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// The finite values, ascending.
pub(crate) fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Goodput {
    /// Requests per minute that met the TTFT threshold.
    pub per_min: f64,
    /// Fraction of all sent requests whose first token came within the threshold.
    pub within_slo: f64,
    /// `within_slo >= attainment`.
    pub slo_met: bool,
}

pub fn goodput(samples: &[Sample], duration_s: f64, slo: Slo) -> Goodput {
    if samples.is_empty() || duration_s <= 0.0 {
        return Goodput::default();
    }
    let good = samples.iter().filter(|s| s.ok && s.ttft_s.is_some_and(|t| t <= slo.ttft_s)).count();
    let within = good as f64 / samples.len() as f64;
    Goodput { per_min: good as f64 * 60.0 / duration_s, within_slo: within, slo_met: within >= slo.attainment }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Summary {
    pub requests: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub ttft_p50: Option<f64>,
    pub ttft_p90: Option<f64>,
    pub ttft_p99: Option<f64>,
    pub e2e_p50: Option<f64>,
    pub e2e_p90: Option<f64>,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    pub goodput: Goodput,
    /// Responses whose routing fell back (x-kvroute-fallback) or was marked degraded.
    pub degraded: usize,
    /// Requests per worker (from the x-sim-worker header), for spotting hot spots.
    pub per_worker: std::collections::BTreeMap<String, usize>,
}

impl Summary {
    /// `duration_s`: wall time of the pass, first send to last completion.
    pub fn new(samples: &[Sample], duration_s: f64, slo: Slo) -> Summary {
        let ok = || samples.iter().filter(|s| s.ok);
        let ttft = sorted(ok().filter_map(|s| s.ttft_s));
        let e2e = sorted(ok().filter_map(|s| s.e2e_s));
        let out_tokens: u64 = ok().map(|s| s.output_tokens as u64).sum();
        let mut per_worker = std::collections::BTreeMap::new();
        for w in samples.iter().filter_map(|s| s.worker.clone()) {
            *per_worker.entry(w).or_insert(0) += 1;
        }
        let per_s = |n: f64| if duration_s > 0.0 { n / duration_s } else { 0.0 };
        Summary {
            requests: samples.len(),
            failed: samples.iter().filter(|s| !s.ok).count(),
            duration_s,
            ttft_p50: percentile(&ttft, 50.0),
            ttft_p90: percentile(&ttft, 90.0),
            ttft_p99: percentile(&ttft, 99.0),
            e2e_p50: percentile(&e2e, 50.0),
            e2e_p90: percentile(&e2e, 90.0),
            requests_per_s: per_s(ok().count() as f64),
            output_tokens_per_s: per_s(out_tokens as f64),
            goodput: goodput(samples, duration_s, slo),
            degraded: samples.iter().filter(|s| is_degraded(s)).count(),
            per_worker,
        }
    }
}

/// A decision is degraded when the filter says it fell back (`x-kvroute-fallback`), or its
/// `x-kvroute-decision` (`worker=..;policy=..;degraded=<reason>`) names a reason other
/// than `none`.
pub fn is_degraded(s: &Sample) -> bool {
    s.fallback.as_deref().is_some_and(|f| !f.is_empty()) || decision_field(s, "degraded").is_some_and(|v| v != "none" && !v.is_empty())
}

/// A field of a sample's `x-kvroute-decision` (`worker=..;matched=..;tokenization=..`).
pub fn decision_field<'a>(s: &'a Sample, key: &str) -> Option<&'a str> {
    s.decision.as_deref()?.split(';').filter_map(|kv| kv.trim().split_once('=')).find(|(k, _)| *k == key).map(|(_, v)| v)
}

/// What the router's index promised and the engine served: over the requests routed on exact
/// keys (token ids or tokenized text) whose response reported its cached tokens, the prompt
/// tokens the chosen worker held at the pick (`matched` blocks, as the engines count hits: not
/// the last token of a fully cached prompt) and how many of those the engine did not serve
/// from cache: evicted between the pick and the request's scheduling (the index is stale by
/// the queue's wait, not by its events' latency).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Promised {
    pub requests: usize,
    pub promised_tokens: u64,
    /// Promised tokens the engine did not report cached.
    pub gone_tokens: u64,
    /// Requests that found at least one promised block gone.
    pub requests_short: usize,
}

impl Promised {
    /// `block_size`: tokens per key of exact keys (the engines' block size).
    pub fn of(samples: &[Sample], block_size: u32) -> Option<Promised> {
        let mut p = Promised::default();
        let exact = |s: &&Sample| matches!(decision_field(s, "tokenization"), Some("exact_token_ids" | "local" | "worker"));
        for s in samples.iter().filter(|s| s.ok).filter(exact) {
            let (Some(matched), Some(cached)) = (decision_field(s, "matched").and_then(|m| m.parse::<u64>().ok()), s.cached_tokens) else {
                continue;
            };
            let block = u64::from(block_size.max(1));
            let cacheable = u64::from(s.prompt_tokens.saturating_sub(1)) / block * block;
            let promised = (matched * block).min(cacheable);
            let gone = promised.saturating_sub(u64::from(cached));
            p.requests += 1;
            p.promised_tokens += promised;
            p.gone_tokens += gone;
            p.requests_short += usize::from(gone >= block);
        }
        (p.requests > 0).then_some(p)
    }

    /// Share of the promised tokens that were gone; `None` when nothing was promised.
    pub fn gone_share(&self) -> Option<f64> {
        (self.promised_tokens > 0).then(|| self.gone_tokens as f64 / self.promised_tokens as f64)
    }
}

/// How a pass's prompts became keys, from each response's decision (`tokenization=..;
/// degraded=..`): exactly (token ids, or tokenized by the state service or a worker), or on
/// text chunks and why (the decision's degraded reason: out of time, out of encoding slots, no
/// tokenizer, a prompt without exact ids).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Keying {
    pub exact: usize,
    /// Picks on approximate keys (or none), by reason.
    pub approximate: std::collections::BTreeMap<String, usize>,
}

impl Keying {
    /// `None` when no response carried a decision.
    pub fn of(samples: &[Sample]) -> Option<Keying> {
        let mut k = Keying::default();
        for s in samples.iter().filter(|s| s.decision.is_some()) {
            match decision_field(s, "tokenization") {
                Some("exact_token_ids" | "local" | "worker") => k.exact += 1,
                _ => {
                    let why = decision_field(s, "degraded").filter(|d| !d.is_empty() && *d != "none").unwrap_or("unkeyed");
                    *k.approximate.entry(why.to_string()).or_insert(0) += 1;
                }
            }
        }
        (k.exact + k.approximate.values().sum::<usize>() > 0).then_some(k)
    }

    /// `1168 exact`, or `414 exact, 700 tokenize_deadline, 86 tokenize_busy`.
    pub fn cell(&self) -> String {
        std::iter::once(format!("{} exact", self.exact)).chain(self.approximate.iter().map(|(why, n)| format!("{n} {why}"))).collect::<Vec<_>>().join(", ")
    }
}

/// Points of the empirical CDF of successful TTFTs: (ttft_s, fraction <= ttft_s).
pub fn ttft_cdf(samples: &[Sample]) -> Vec<(f64, f64)> {
    let v = sorted(samples.iter().filter(|s| s.ok).filter_map(|s| s.ttft_s));
    let n = v.len() as f64;
    v.iter().enumerate().map(|(i, &t)| (t, (i + 1) as f64 / n)).collect()
}

#[cfg(test)]
mod tests;
