//! Command-line arguments shared by the subcommands, and the translation of workload flags
//! into a [`Workload`]. Kept out of `main.rs` so that stays a dispatcher.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use kvroute_bench::bounds::{self, capacity::SimFlags, Capacity};
use kvroute_bench::compare::{CompareSpec, DEFAULT_POLICIES, POLICIES};
use kvroute_bench::peer_router::SGLANG_ROUTER;
use kvroute_bench::runner::{Arrival, RunSpec};
use kvroute_bench::stats::Slo;
use kvroute_bench::workload::{
    independent, multi_turn, production, shared_prefix, trace, PromptMode, Workload,
};
use production::ProductionSpec;
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
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_POLICIES.map(String::from))]
    pub policies: Vec<String>,
    /// The real SGLang router for the `sglang_router` row (default: `$SGLANG_ROUTER`, then
    /// `.cache/venv/bin/sglang-router`, then `PATH`; `pip install sglang-router`).
    #[arg(long)]
    pub sglang_router: Option<std::path::PathBuf>,
    /// The real router's `--policy`.
    #[arg(long, default_value = "cache_aware")]
    pub sglang_router_policy: String,
    /// An extra `sglang-router launch` flag, repeatable (its queue, off by default:
    /// `--sglang-router-arg=--max-concurrent-requests --sglang-router-arg=64`).
    #[arg(long, allow_hyphen_values = true)]
    pub sglang_router_arg: Vec<String>,
    /// Offered rate(s) in requests/s (sessions/s for multi-turn), in simulated time (the
    /// real rate is this divided by --time-scale); several = a sweep.
    #[arg(long, value_delimiter = ',', default_values_t = [1.0])]
    pub rate: Vec<f64>,
    /// Service classes by share of sessions, e.g. `interactive=0.2,batch=0.8`: each session is
    /// sent as tenant `class-<name>` (trusted from loopback), and the report adds a TTFT line
    /// per class. The class only changes the order of picks with `--scheduling`.
    #[arg(long, value_delimiter = ',', value_parser = parse_class)]
    pub classes: Vec<(String, f64)>,
    /// Name each pass `POLICY+VARIANT`: what this run's stack adds (`queue` with
    /// --scheduling, `flow_control` with llm-d's settings), so that the reports of runs with
    /// different stack settings merge into one table (`kvroute-bench report A B ...`).
    #[arg(long, value_parser = parse_variant)]
    pub variant: Option<String>,
    /// Run every policy this many times, round after round (drift over the run reaches every
    /// policy alike); the table adds each policy's medians over the rounds.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
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
            if !POLICIES.contains(&p.as_str()) && p != SGLANG_ROUTER {
                bail!("unknown policy {p}; known: {}, and {SGLANG_ROUTER} (the real SGLang router)", POLICIES.join(", "));
            }
        }
        if self.rate.iter().any(|r| !(*r > 0.0)) {
            bail!("--rate values must be > 0");
        }
        kvroute_bench::target::ensure_loopback(base_url).context("--url")?;
        if self.repeat == 0 {
            bail!("--repeat must be at least 1");
        }
        Ok(CompareSpec {
            policies: self.policies.clone(),
            repeat: self.repeat,
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
                classes: self.classes.clone(),
            },
            slo: Slo { ttft_s: self.slo_ttft_s, attainment: self.slo_attainment },
            settle: Duration::from_secs_f64(self.settle_s),
            drain_limit: Duration::from_secs_f64(self.request_timeout_s.min(120.0)),
            time_scale,
            progress: !self.no_progress,
            peer: None,
            variant: self.variant.clone(),
        })
    }
}

fn parse_variant(s: &str) -> std::result::Result<String, String> {
    match !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        true => Ok(s.to_string()),
        false => Err(format!("{s:?}: a variant is letters, digits, '_' and '-'")),
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Shape {
    /// The small sample's shape: a few shared roots, some conversations (sample.jsonl).
    Synthetic,
    /// Conversations with heavy-tailed think time, a universal system block, app prompts,
    /// long-tailed prompts up to the model's context (see workload/production.rs).
    Production,
    /// Conversations of long fresh prompts (~12k tokens on average, up to the context, most of
    /// each new): `ProductionSpec::long_fresh`, its own seed and defaults (the production
    /// flags do not apply).
    LongFresh,
}

/// `gen-trace`: write a Mooncake JSONL trace.
#[derive(Args, Debug)]
pub struct GenTraceArgs {
    #[arg(long, value_enum, default_value = "synthetic")]
    pub shape: Shape,
    /// Default: bench/traces/sample.jsonl (synthetic), bench/traces/production.jsonl (production).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// synthetic: number of requests.
    #[arg(long, default_value_t = 240)]
    pub requests: usize,
    /// synthetic: requests/s (default 1); production: conversation arrivals/s (default 1).
    #[arg(long)]
    pub rate: Option<f64>,
    /// synthetic: shared roots.
    #[arg(long, default_value_t = 12)]
    pub roots: u64,
    /// Default 7 (synthetic, the shipped sample) or 11 (production).
    #[arg(long)]
    pub seed: Option<u64>,
    /// production: conversations.
    #[arg(long, default_value_t = ProductionSpec::default().conversations)]
    pub conversations: usize,
    /// production: mean turns per conversation (geometric).
    #[arg(long, default_value_t = ProductionSpec::default().mean_turns)]
    pub mean_turns: f64,
    #[arg(long, default_value_t = ProductionSpec::default().max_turns)]
    pub max_turns: usize,
    /// production: median think time between a conversation's turns (lognormal), seconds.
    #[arg(long, default_value_t = ProductionSpec::default().think_median_s)]
    pub think_median_s: f64,
    /// production: the think time's lognormal shape (larger = heavier tail).
    #[arg(long, default_value_t = ProductionSpec::default().think_sigma)]
    pub think_sigma: f64,
    /// production: median first-message tokens (lognormal), after the shared prefixes.
    #[arg(long, default_value_t = ProductionSpec::default().first_median_tokens)]
    pub first_median_tokens: f64,
    #[arg(long, default_value_t = ProductionSpec::default().first_sigma)]
    pub first_sigma: f64,
    /// production: median follow-up message tokens (lognormal).
    #[arg(long, default_value_t = ProductionSpec::default().followup_median_tokens)]
    pub followup_median_tokens: f64,
    #[arg(long, default_value_t = ProductionSpec::default().followup_sigma)]
    pub followup_sigma: f64,
    /// production: mean answer tokens (lognormal).
    #[arg(long, default_value_t = ProductionSpec::default().output_mean_tokens)]
    pub output_mean_tokens: f64,
    #[arg(long, default_value_t = ProductionSpec::default().output_sigma)]
    pub output_sigma: f64,
    #[arg(long, default_value_t = ProductionSpec::default().max_output_tokens)]
    pub max_output_tokens: u32,
    /// production: prompt + answer of every request fit this (the sims' --max-model-len).
    #[arg(long, default_value_t = ProductionSpec::default().max_model_len)]
    pub max_model_len: usize,
    /// production: shared application prompts (0 = none) ...
    #[arg(long, default_value_t = ProductionSpec::default().apps)]
    pub apps: u64,
    /// ... the fraction of conversations that carry one ...
    #[arg(long, default_value_t = ProductionSpec::default().app_fraction)]
    pub app_fraction: f64,
    /// ... each 1..=N blocks of 512 tokens ...
    #[arg(long, default_value_t = ProductionSpec::default().app_max_blocks)]
    pub app_max_blocks: usize,
    /// ... with Zipf popularity of this exponent.
    #[arg(long, default_value_t = ProductionSpec::default().app_zipf)]
    pub app_zipf: f64,
    /// production: keep only the first this many seconds of traffic (a window).
    #[arg(long)]
    pub duration_s: Option<f64>,
}

impl GenTraceArgs {
    pub fn production_spec(&self) -> ProductionSpec {
        let d = ProductionSpec::default();
        ProductionSpec {
            conversations: self.conversations,
            rate_per_s: self.rate.unwrap_or(d.rate_per_s),
            mean_turns: self.mean_turns,
            max_turns: self.max_turns,
            think_median_s: self.think_median_s,
            think_sigma: self.think_sigma,
            first_median_tokens: self.first_median_tokens,
            first_sigma: self.first_sigma,
            followup_median_tokens: self.followup_median_tokens,
            followup_sigma: self.followup_sigma,
            output_mean_tokens: self.output_mean_tokens,
            output_sigma: self.output_sigma,
            max_output_tokens: self.max_output_tokens,
            max_model_len: self.max_model_len,
            apps: self.apps,
            app_fraction: self.app_fraction,
            app_max_blocks: self.app_max_blocks,
            app_zipf: self.app_zipf,
            duration_s: self.duration_s,
            seed: self.seed.unwrap_or(d.seed),
        }
    }

    pub fn run(&self) -> Result<()> {
        let (records, out, about) = match self.shape {
            Shape::Synthetic => {
                let spec = trace::SynthSpec {
                    requests: self.requests,
                    rate_per_s: self.rate.unwrap_or(1.0),
                    roots: self.roots,
                    seed: self.seed.unwrap_or(7),
                };
                (trace::synthesize(&spec), "bench/traces/sample.jsonl", String::new())
            }
            Shape::Production => {
                let reqs = production::generate(&self.production_spec())?;
                let about = production::describe(&reqs);
                (production::records(&reqs), "bench/traces/production.jsonl", about)
            }
            Shape::LongFresh => {
                let reqs = production::generate(&ProductionSpec::long_fresh())?;
                let about = production::describe(&reqs);
                (production::records(&reqs), "bench/traces/long-fresh.jsonl", about)
            }
        };
        let out = self.out.clone().unwrap_or_else(|| PathBuf::from(out));
        let mut text = String::new();
        for r in &records {
            text.push_str(&serde_json::to_string(r)?);
            text.push('\n');
        }
        std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
        println!("wrote {} records to {}", records.len(), out.display());
        if !about.is_empty() {
            println!("{about}");
        }
        Ok(())
    }
}

/// How the oracle bound learns the fleet's KV capacity (see bounds/capacity.rs).
#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct CapacityArgs {
    /// The fleet's total KV capacity in tokens for the oracle bound, instead of the
    /// workers' vllm:cache_config_info or the --workers / --sim-arg flags.
    #[arg(long)]
    pub oracle_capacity_tokens: Option<u64>,
}

impl CapacityArgs {
    /// From the workers' metrics texts when given and complete, else the flags.
    pub fn resolve(&self, workers: usize, sim_args: &[String], metrics: Option<&[String]>) -> Capacity {
        let flags = Capacity::from_sim_args(workers, sim_args);
        let cpu = SimFlags::parse(sim_args).cpu_total(workers);
        let cap = metrics.and_then(|m| Capacity::from_cache_config(m, cpu)).unwrap_or(flags);
        match self.oracle_capacity_tokens {
            Some(t) => cap.with_total_tokens(t),
            None => cap,
        }
    }
}

/// `bounds`: a workload's reuse bounds without running anything.
#[derive(Args, Debug)]
pub struct BoundsArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub capacity: CapacityArgs,
    /// Simulated workers the capacity is for.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// The sims' flags, as for `stack` (--sim-arg=--num-gpu-blocks --sim-arg=3000).
    #[arg(long, allow_hyphen_values = true)]
    pub sim_arg: Vec<String>,
    /// Also write the bounds as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl BoundsArgs {
    pub fn run(&self) -> Result<()> {
        let workload = self.workload.build().context("building the workload")?;
        let capacity = self.capacity.resolve(self.workers, &self.sim_arg, None);
        let b = bounds::of_workload(&workload, self.workload.seed, capacity);
        println!("{}", b.summary());
        if let Some(p) = &self.json {
            std::fs::write(p, serde_json::to_string_pretty(&b)?).with_context(|| format!("writing {}", p.display()))?;
            println!("wrote {}", p.display());
        }
        Ok(())
    }
}

/// `name=share` with a share > 0.
fn parse_class(s: &str) -> Result<(String, f64), String> {
    let (name, share) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected name=share"))?;
    let share: f64 = share.parse().map_err(|_| format!("{s:?}: the share is not a number"))?;
    if name.is_empty() || !(share > 0.0) || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(format!("{s:?}: a class name and a share > 0"));
    }
    Ok((name.to_string(), share))
}
