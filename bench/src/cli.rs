//! Command-line arguments shared by the subcommands, and the translation of workload flags
//! into a [`Workload`]. Kept out of `main.rs` so that stays a dispatcher.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use kvroute_bench::compare::{CompareSpec, POLICIES};
use kvroute_bench::runner::{Arrival, RunSpec};
use kvroute_bench::stats::Slo;
use kvroute_bench::workload::{
    independent, multi_turn, shared_prefix, trace, PromptMode, Workload,
};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    SharedPrefix,
    MultiTurn,
    Independent,
    Trace,
}

#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct WorkloadArgs {
    #[arg(long, value_enum, default_value = "shared-prefix")]
    pub workload: Kind,
    /// tokens: token-id prompts to /v1/completions; chat: text to /v1/chat/completions.
    #[arg(long, value_enum, default_value = "tokens")]
    pub prompt_mode: PromptMode,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Model name sent in requests (must be one the workers and the state service know).
    #[arg(long, default_value = "kvroute/sim-27b-fp8")]
    pub model: String,
    /// shared-prefix: number of groups (G).
    #[arg(long, default_value_t = 8)]
    pub groups: u32,
    /// shared-prefix: shared prefix tokens per group (P); multi-turn: system prompt tokens.
    #[arg(long, default_value_t = 6000)]
    pub prefix_tokens: usize,
    /// shared-prefix: users per group (U).
    #[arg(long, default_value_t = 12)]
    pub users: u32,
    /// shared-prefix: question tokens (Q); multi-turn: tokens per user message.
    #[arg(long, default_value_t = 200)]
    pub question_tokens: usize,
    /// Output tokens per request (O); trace replay caps the trace's own at this.
    #[arg(long, default_value_t = 200)]
    pub output_tokens: u32,
    /// Total requests (shared-prefix default G*U; independent default 96).
    #[arg(long)]
    pub requests: Option<usize>,
    /// multi-turn: sessions and turns per session.
    #[arg(long, default_value_t = 24)]
    pub sessions: usize,
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// independent: prompt tokens (default P+Q, the same prefill work as shared-prefix).
    #[arg(long)]
    pub input_tokens: Option<usize>,
    /// trace: a Mooncake-format JSONL file.
    #[arg(long, default_value = "bench/traces/sample.jsonl")]
    pub trace: PathBuf,
    /// trace: replay speed factor (2 = twice as fast as recorded).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// trace: cut longer prompts (stay inside the workers' context length).
    #[arg(long, default_value_t = 30_000)]
    pub max_input_tokens: usize,
}

impl WorkloadArgs {
    pub fn build(&self) -> Result<Workload> {
        let w = match self.workload {
            Kind::SharedPrefix => shared_prefix::generate(&shared_prefix::SharedPrefixSpec {
                groups: self.groups,
                prefix_tokens: self.prefix_tokens,
                users: self.users,
                question_tokens: self.question_tokens,
                output_tokens: self.output_tokens,
                requests: self.requests,
                seed: self.seed,
                mode: self.prompt_mode,
            })?,
            Kind::MultiTurn => multi_turn::generate(&multi_turn::MultiTurnSpec {
                sessions: self.sessions,
                turns: self.turns,
                system_tokens: self.prefix_tokens,
                message_tokens: self.question_tokens,
                output_tokens: self.output_tokens,
                seed: self.seed,
                mode: self.prompt_mode,
            })?,
            Kind::Independent => independent::generate(&independent::IndependentSpec {
                requests: self.requests.unwrap_or(96),
                input_tokens: self.input_tokens.unwrap_or(self.prefix_tokens + self.question_tokens),
                output_tokens: self.output_tokens,
                seed: self.seed,
                mode: self.prompt_mode,
            })?,
            Kind::Trace => {
                let records = trace::load(&self.trace)?;
                let mut w = trace::to_workload(&records, &trace::ReplaySpec {
                    speed: self.speed,
                    max_input_tokens: self.max_input_tokens,
                    max_output_tokens: self.output_tokens,
                    seed: self.seed,
                    mode: self.prompt_mode,
                })?;
                if let Some(n) = self.requests {
                    w.truncate_requests(n);
                }
                w
            }
        };
        if w.num_requests() == 0 {
            bail!("the workload has no requests");
        }
        Ok(w)
    }
}

#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct CompareArgs {
    /// Policies to compare, in order.
    #[arg(long, value_delimiter = ',', default_values_t = POLICIES.map(String::from))]
    pub policies: Vec<String>,
    /// Offered rate(s) in requests/s (sessions/s for multi-turn), in simulated time (the
    /// real rate is this divided by --time-scale); several = a sweep.
    #[arg(long, value_delimiter = ',', default_values_t = [1.0])]
    pub rate: Vec<f64>,
    /// Stop sending new requests this long (real seconds) after a pass starts.
    #[arg(long, default_value_t = 600.0)]
    pub max_duration_s: f64,
    #[arg(long, default_value_t = 300.0)]
    pub request_timeout_s: f64,
    #[arg(long, default_value_t = 512)]
    pub max_inflight: usize,
    /// Goodput SLO: TTFT threshold, simulated seconds.
    #[arg(long, default_value_t = 8.0)]
    pub slo_ttft_s: f64,
    /// Goodput SLO: fraction of requests that must meet the threshold.
    #[arg(long, default_value_t = 0.9)]
    pub slo_attainment: f64,
    /// Wait after the resets before each pass, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub settle_s: f64,
    /// Where report.json, table.md and the SVG plots go.
    #[arg(long, default_value = "bench/results/tmp")]
    pub out: PathBuf,
    #[arg(long)]
    pub no_progress: bool,
}

impl CompareArgs {
    /// `time_scale`: the workers' (see [`RunSpec::time_scale`]).
    pub fn spec(&self, base_url: &str, model: &str, seed: u64, time_scale: f64) -> Result<CompareSpec> {
        for p in &self.policies {
            if !POLICIES.contains(&p.as_str()) {
                bail!("unknown policy {p}; known: {}", POLICIES.join(", "));
            }
        }
        if self.rate.iter().any(|r| !(*r > 0.0)) {
            bail!("--rate values must be > 0");
        }
        kvroute_bench::target::ensure_loopback(base_url).context("--url")?;
        Ok(CompareSpec {
            policies: self.policies.clone(),
            rates: self.rate.clone(),
            run: RunSpec {
                base_url: base_url.to_string(),
                model: model.to_string(),
                arrival: Arrival::Poisson { rate: self.rate[0] },
                seed,
                max_duration: Duration::from_secs_f64(self.max_duration_s),
                request_timeout: Duration::from_secs_f64(self.request_timeout_s),
                max_inflight: self.max_inflight,
                time_scale,
            },
            slo: Slo { ttft_s: self.slo_ttft_s, attainment: self.slo_attainment },
            settle: Duration::from_secs_f64(self.settle_s),
            drain_limit: Duration::from_secs_f64(self.request_timeout_s.min(120.0)),
            time_scale,
            progress: !self.no_progress,
        })
    }
}
