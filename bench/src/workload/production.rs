//! A production-shaped synthetic trace, written as Mooncake JSONL so it replays here
//! (`--workload trace`) and in any other tool that reads that format.
//!
//! Shape (every knob in [`ProductionSpec`], all seeded):
//! - **Conversations** start as a Poisson process at `rate_per_s` (`conversations` of them,
//!   or as many as start within `duration_s`, which also cuts later turns). Each has a geometric
//!   number of turns (mean `mean_turns`, at most `max_turns`).
//! - **Think time** between a conversation's turns (the gap between their arrivals) is
//!   lognormal with median `think_median_s` (~150 s in a public production trace) and
//!   shape `think_sigma`: most follow-ups come minutes later, some within seconds, a few
//!   after an hour — long enough for the history to be evicted.
//! - **Prefix structure.** Every request starts with one universal 512-token block (hash
//!   id 0, the system prompt every request shares). A fraction `app_fraction` of the
//!   conversations then carry one of `apps` application prompts (1..=`app_max_blocks`
//!   whole blocks, Zipf popularity with exponent `app_zipf`). Then the conversation's own
//!   first message, lognormal (median `first_median_tokens`, shape `first_sigma`: a long
//!   tail of documents and code), so most prefixes are per-conversation.
//! - **Follow-ups.** Turn k's prompt is turn k-1's prompt, then turn k-1's answer, then a
//!   new message (lognormal, median `followup_median_tokens`): `input_length` grows by
//!   exactly `output_length(k-1) + message`, and `hash_ids(k)` = `hash_ids(k-1)` + fresh
//!   ids for the blocks the growth adds, so its prefix is exactly the history. (The last
//!   block of turn k-1 may be partial; replay makes a partial block the first tokens of
//!   the same block, so turn k-1's prompt is a token prefix of turn k's.) A conversation
//!   ends early when the next turn would not fit `max_model_len` (prompt + answer).
//! - **Answers** are lognormal with mean `output_mean_tokens` (~350), at most
//!   `max_output_tokens`.
//!
//! Timestamps are integer milliseconds from the first conversation's start; records are
//! sorted by time (a follow-up always after its predecessor).

use super::text::{rng_for, Ns};
use super::trace::{TraceRecord, TRACE_BLOCK};
use crate::BenchError;
use rand::rngs::StdRng;
use rand::Rng;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct ProductionSpec {
    pub conversations: usize,
    /// Conversation arrivals per second (Poisson).
    pub rate_per_s: f64,
    pub mean_turns: f64,
    pub max_turns: usize,
    pub think_median_s: f64,
    pub think_sigma: f64,
    pub first_median_tokens: f64,
    pub first_sigma: f64,
    pub followup_median_tokens: f64,
    pub followup_sigma: f64,
    pub output_mean_tokens: f64,
    pub output_sigma: f64,
    pub max_output_tokens: u32,
    /// Prompt + answer of every request fits this (the workers' context length).
    pub max_model_len: usize,
    /// Shared application prompts (0 = none).
    pub apps: u64,
    pub app_fraction: f64,
    pub app_max_blocks: usize,
    pub app_zipf: f64,
    /// Keep only requests within this many seconds of the start (a window of traffic:
    /// conversations still open at its end are cut, as in a real trace).
    pub duration_s: Option<f64>,
    pub seed: u64,
}

impl ProductionSpec {
    /// Long fresh prompts (issue 31): conversations whose every turn brings thousands of tokens
    /// of new text (first messages ~9k tokens, follow-ups ~3k, no shared application prompts),
    /// so prompts average ~12k tokens, up to the context, and most of each is new to every
    /// worker: what a router must key in time at saturation.
    pub fn long_fresh() -> ProductionSpec {
        ProductionSpec {
            conversations: 300,
            rate_per_s: 0.5,
            mean_turns: 2.0,
            max_turns: 6,
            think_median_s: 60.0,
            think_sigma: 0.8,
            first_median_tokens: 9000.0,
            first_sigma: 0.5,
            followup_median_tokens: 3000.0,
            followup_sigma: 0.6,
            output_mean_tokens: 300.0,
            output_sigma: 0.6,
            max_output_tokens: 2048,
            apps: 0,
            seed: 31,
            ..ProductionSpec::default()
        }
    }
}

impl Default for ProductionSpec {
    fn default() -> Self {
        ProductionSpec {
            conversations: 600,
            rate_per_s: 1.0,
            mean_turns: 3.5,
            max_turns: 20,
            think_median_s: 150.0,
            think_sigma: 1.2,
            first_median_tokens: 1000.0,
            first_sigma: 1.4,
            followup_median_tokens: 120.0,
            followup_sigma: 1.2,
            output_mean_tokens: 350.0,
            output_sigma: 0.9,
            max_output_tokens: 4096,
            max_model_len: 32_768,
            apps: 16,
            app_fraction: 0.5,
            app_max_blocks: 8,
            app_zipf: 1.0,
            duration_s: None,
            seed: 11,
        }
    }
}

/// The hash id of the universal system block every request starts with.
pub const UNIVERSAL_BLOCK: u64 = 0;

/// One generated request with the conversation it belongs to (the JSONL has only
/// [`TraceRecord`]; the conversation is kept for tests and summaries).
#[derive(Clone, Debug, PartialEq)]
pub struct ProductionRequest {
    pub conversation: u64,
    pub turn: usize,
    pub record: TraceRecord,
}

/// A standard normal draw (Box-Muller; `rand` 0.8 has no normal distribution without
/// `rand_distr`).
fn std_normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>(); // (0, 1]
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Lognormal with the given median (= e^mu) and shape sigma.
pub fn lognormal(rng: &mut StdRng, median: f64, sigma: f64) -> f64 {
    median * (sigma * std_normal(rng)).exp()
}

/// Geometric on 1, 2, ... with the given mean (>= 1).
fn geometric(rng: &mut StdRng, mean: f64) -> usize {
    if mean <= 1.0 {
        return 1;
    }
    let q = 1.0 - 1.0 / mean; // P(another turn)
    let u: f64 = 1.0 - rng.gen::<f64>();
    1 + (u.ln() / q.ln()).floor().min(1e9) as usize
}

/// Index in 0..n with P(i) proportional to 1/(i+1)^s.
fn zipf(rng: &mut StdRng, cdf: &[f64]) -> usize {
    let u = rng.gen::<f64>() * cdf.last().copied().unwrap_or(0.0);
    cdf.partition_point(|&c| c <= u).min(cdf.len().saturating_sub(1))
}

fn check(spec: &ProductionSpec) -> Result<(), BenchError> {
    let positive = [
        ("rate", spec.rate_per_s),
        ("think median", spec.think_median_s),
        ("first-message median", spec.first_median_tokens),
        ("follow-up median", spec.followup_median_tokens),
        ("output mean", spec.output_mean_tokens),
    ];
    for (what, v) in positive {
        if !(v.is_finite() && v > 0.0) {
            return Err(BenchError::Workload(format!("production trace: {what} must be > 0")));
        }
    }
    for (what, v) in [("think", spec.think_sigma), ("first", spec.first_sigma), ("follow-up", spec.followup_sigma), ("output", spec.output_sigma)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(BenchError::Workload(format!("production trace: {what} sigma must be >= 0")));
        }
    }
    if spec.duration_s.is_some_and(|d| !(d.is_finite() && d > 0.0)) {
        return Err(BenchError::Workload("production trace: duration must be > 0".into()));
    }
    if spec.conversations == 0 || spec.max_turns == 0 || spec.max_output_tokens == 0 {
        return Err(BenchError::Workload("production trace: conversations, max turns and max output must be > 0".into()));
    }
    if !(1.0..).contains(&spec.mean_turns) || !(0.0..=1.0).contains(&spec.app_fraction) || !(0.0..).contains(&spec.app_zipf) {
        return Err(BenchError::Workload("production trace: mean turns >= 1, app fraction in [0, 1], zipf >= 0".into()));
    }
    if spec.apps > 0 && spec.app_max_blocks == 0 {
        return Err(BenchError::Workload("production trace: app prompts need at least one block".into()));
    }
    let longest_prefix = TRACE_BLOCK * (1 + if spec.apps > 0 { spec.app_max_blocks } else { 0 });
    if spec.max_model_len < longest_prefix + spec.max_output_tokens as usize + 1 {
        return Err(BenchError::Workload(format!(
            "production trace: max model length {} cannot hold the shared prefixes ({longest_prefix} tokens), a message and {} output tokens",
            spec.max_model_len, spec.max_output_tokens
        )));
    }
    Ok(())
}

/// Hash ids for `len` tokens: extend `ids` with fresh ids up to ceil(len / 512) blocks.
fn extend_ids(ids: &mut Vec<u64>, len: usize, next_id: &mut u64) {
    while ids.len() < len.div_ceil(TRACE_BLOCK) {
        ids.push(*next_id);
        *next_id += 1;
    }
}

/// Every request of the trace, sorted by timestamp (ties: conversation, then turn).
pub fn generate(spec: &ProductionSpec) -> Result<Vec<ProductionRequest>, BenchError> {
    check(spec)?;
    let app_blocks: Vec<usize> =
        (0..spec.apps).map(|a| rng_for(spec.seed, Ns::Prefix, a).gen_range(1..=spec.app_max_blocks)).collect();
    let mut cdf = Vec::with_capacity(spec.apps as usize);
    let mut acc = 0.0;
    for a in 0..spec.apps {
        acc += 1.0 / ((a + 1) as f64).powf(spec.app_zipf);
        cdf.push(acc);
    }
    // App a's block b has id 1 + a * app_max_blocks + b; conversation blocks come after.
    let app_id = |a: u64, b: usize| 1 + a * spec.app_max_blocks as u64 + b as u64;
    let mut next_id = 1 + spec.apps * spec.app_max_blocks as u64;
    let mut arrivals = rng_for(spec.seed, Ns::Production, u64::MAX);
    let max_out = spec.max_output_tokens as f64;
    let output_median = spec.output_mean_tokens * (-spec.output_sigma * spec.output_sigma / 2.0).exp();
    let mut start_s = 0.0;
    let mut out = Vec::new();
    for c in 0..spec.conversations as u64 {
        if c > 0 {
            start_s += -(1.0 - arrivals.gen::<f64>()).ln() / spec.rate_per_s;
        }
        if spec.duration_s.is_some_and(|d| start_s > d) {
            break;
        }
        let mut rng = rng_for(spec.seed, Ns::Production, c);
        let output = |rng: &mut StdRng| lognormal(rng, output_median, spec.output_sigma).round().clamp(1.0, max_out) as u32;
        let mut ids = vec![UNIVERSAL_BLOCK];
        if spec.apps > 0 && rng.gen_bool(spec.app_fraction) {
            let a = zipf(&mut rng, &cdf) as u64;
            ids.extend((0..app_blocks[a as usize]).map(|b| app_id(a, b)));
        }
        let shared = ids.len() * TRACE_BLOCK;
        let turns = geometric(&mut rng, spec.mean_turns).min(spec.max_turns);
        let mut out_len = output(&mut rng);
        let first = lognormal(&mut rng, spec.first_median_tokens, spec.first_sigma).round().max(1.0) as usize;
        let mut input = (shared + first).min(spec.max_model_len - out_len as usize);
        extend_ids(&mut ids, input, &mut next_id);
        let mut t_s = start_s;
        out.push(ProductionRequest {
            conversation: c,
            turn: 0,
            record: TraceRecord { timestamp: t_s, input_length: input, output_length: out_len, hash_ids: ids.clone() },
        });
        for turn in 1..turns {
            t_s += lognormal(&mut rng, spec.think_median_s, spec.think_sigma);
            let message = lognormal(&mut rng, spec.followup_median_tokens, spec.followup_sigma).round().max(1.0) as usize;
            let next_out = output(&mut rng);
            let next_input = input + out_len as usize + message;
            if next_input + next_out as usize > spec.max_model_len {
                break; // the conversation has reached the context length
            }
            (input, out_len) = (next_input, next_out);
            extend_ids(&mut ids, input, &mut next_id);
            out.push(ProductionRequest {
                conversation: c,
                turn,
                record: TraceRecord { timestamp: t_s, input_length: input, output_length: out_len, hash_ids: ids.clone() },
            });
        }
    }
    for r in &mut out {
        r.record.timestamp = (r.record.timestamp * 1000.0).round();
    }
    if let Some(d) = spec.duration_s {
        out.retain(|r| r.record.timestamp <= d * 1000.0);
    }
    out.sort_by(|a, b| {
        a.record.timestamp.total_cmp(&b.record.timestamp).then(a.conversation.cmp(&b.conversation)).then(a.turn.cmp(&b.turn))
    });
    Ok(out)
}

/// The records alone, in trace order (what the JSONL holds).
pub fn records(requests: &[ProductionRequest]) -> Vec<TraceRecord> {
    requests.iter().map(|r| r.record.clone()).collect()
}

/// A one-paragraph description of a generated trace, for `gen-trace`'s output.
pub fn describe(requests: &[ProductionRequest]) -> String {
    let n = requests.len().max(1) as f64;
    let convs = requests.iter().map(|r| r.conversation).collect::<std::collections::BTreeSet<_>>().len();
    let mut inputs: Vec<f64> = requests.iter().map(|r| r.record.input_length as f64).collect();
    inputs.sort_by(f64::total_cmp);
    let p = |q: f64| crate::stats::percentile(&inputs, q).unwrap_or(0.0);
    let out_mean = requests.iter().map(|r| r.record.output_length as f64).sum::<f64>() / n;
    let span_s = requests.last().map_or(0.0, |r| r.record.timestamp / 1000.0);
    format!(
        "{} requests in {convs} conversations over {span_s:.0} s; input tokens p50 {:.0} p90 {:.0} p99 {:.0} max {:.0}; mean output {out_mean:.0}",
        requests.len(),
        p(50.0),
        p(90.0),
        p(99.0),
        p(100.0)
    )
}

#[cfg(test)]
mod tests;
