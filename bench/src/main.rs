//! `kvroute-bench`: compare routing policies on a kvroute stack (see bench/README.md).
//! Thin: parse flags, build the workload, start or attach to the stack, run, write results.

mod chaos_cmd;
mod cli;
mod output;
mod soak_cmd;
mod stack_cmd;
mod up_cmd;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "kvroute-bench", version, about = "Load generator and routing-policy comparison for kvroute")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Start the whole stack on loopback (or --attach to a running one) and compare policies.
    Stack(Box<stack_cmd::StackArgs>),
    /// Inject each failure (state replica killed / frozen, worker killed / drained, Redis shard
    /// killed) into a started stack under bounded load; print what each cost.
    Chaos(Box<chaos_cmd::ChaosArgs>),
    /// The production topology under production-shaped load for an hour (--minutes) with a
    /// fault every few minutes: RSS per process and in-flight counts against the truth.
    Soak(Box<soak_cmd::SoakArgs>),
    /// Start the stack and keep it running for your own clients until Ctrl-C (prints the
    /// base URLs for the OpenAI and Anthropic SDKs, and where to look).
    Up(Box<up_cmd::UpArgs>),
    /// Write a Mooncake-format trace: --shape synthetic (the shipped sample) or production.
    GenTrace(Box<cli::GenTraceArgs>),
    /// Print a workload's reuse bounds (infinite cache, oracle with the fleet's KV) without a stack.
    Bounds(Box<cli::BoundsArgs>),
    /// The sensitivity classifier's precision and recall per kind on a labelled corpus
    /// (bench/sensitivity/corpus.py), and its cost at 1k / 8k / 32k-token prompts.
    Sensitivity {
        /// JSON lines {"text", "kinds"}.
        corpus: PathBuf,
        /// Timed scans per prompt size.
        #[arg(long, default_value_t = 200)]
        rounds: usize,
        /// Print up to 20 prompts scored wrong for this kind (synthetic corpora only).
        #[arg(long)]
        errors: Option<String>,
    },
    /// Redraw the table and plots from a report.json; from several (runs of one workload,
    /// e.g. one per `--variant` and round), one table with the medians over their rounds.
    Report {
        #[arg(required = true)]
        json: Vec<PathBuf>,
        /// Where to write (default: beside a single report; required for several).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Stack(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(stack_cmd::run(*args))
        }
        Cmd::Chaos(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(chaos_cmd::run(*args))
        }
        Cmd::Soak(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(soak_cmd::run(*args))
        }
        Cmd::Up(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(up_cmd::run(*args))
        }
        Cmd::GenTrace(args) => args.run(),
        Cmd::Bounds(args) => args.run(),
        Cmd::Sensitivity { corpus, rounds, errors } => {
            use kvroute_bench::sensitivity;
            let corpus = sensitivity::read_corpus(&std::fs::read_to_string(&corpus)?)?;
            if let Some(label) = errors {
                let kind = kvroute_core::sensitive::Kind::from_label(&label).ok_or_else(|| anyhow::anyhow!("unknown kind {label:?}"))?;
                let (missed, false_pos) = sensitivity::errors(&corpus, kind, 20);
                missed.iter().for_each(|t| println!("MISSED ---\n{t}\n"));
                false_pos.iter().for_each(|t| println!("FALSE ---\n{t}\n"));
                return Ok(());
            }
            print!("{}", sensitivity::table(&sensitivity::score(&corpus)?, corpus.len()));
            println!();
            print!("{}", sensitivity::cost(&corpus, &[1_000, 8_000, 32_000], rounds));
            Ok(())
        }
        Cmd::Report { json, out } => {
            let dir = match (out, json.as_slice()) {
                (Some(out), _) => out,
                (None, [one]) => one.parent().map(PathBuf::from).unwrap_or_default(),
                (None, _) => anyhow::bail!("several reports merge into a new one: say where with --out"),
            };
            let mut reports = Vec::new();
            for path in &json {
                let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                let mut report: kvroute_bench::report::RunReport = serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?;
                // Figures derived from the samples and bounds are recomputed: a report written
                // before a column existed gets it.
                let bounds = report.bounds.clone();
                report.passes.iter_mut().for_each(|p| p.relate_to(bounds.as_ref()));
                reports.push(report);
            }
            let report = match reports.len() {
                1 => reports.remove(0),
                _ => kvroute_bench::report::medians::merge(reports).map_err(anyhow::Error::msg)?,
            };
            output::write(&report, &dir)?;
            print!("{}", kvroute_bench::report::table(&report));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gen_trace_and_bounds_parse() {
        let cli = Cli::try_parse_from(["kvroute-bench", "gen-trace", "--shape", "production", "--think-median-s", "60"]).unwrap();
        let Cmd::GenTrace(args) = cli.cmd else { panic!("gen-trace") };
        let spec = args.production_spec();
        assert_eq!(spec.think_median_s, 60.0);
        let d = kvroute_bench::workload::production::ProductionSpec::default();
        assert_eq!((spec.rate_per_s, spec.seed, spec.conversations, spec.max_model_len), (d.rate_per_s, d.seed, d.conversations, d.max_model_len));
        let cli = Cli::try_parse_from([
            "kvroute-bench", "bounds", "--workload", "trace", "--sim-arg=--num-gpu-blocks", "--sim-arg=3000", "--oracle-capacity-tokens", "1000",
        ])
        .unwrap();
        let Cmd::Bounds(b) = cli.cmd else { panic!("bounds") };
        assert_eq!(b.sim_arg, ["--num-gpu-blocks", "3000"]);
        assert_eq!(b.capacity.resolve(b.workers, &b.sim_arg, None).total_tokens(), 992, "1000 tokens in 16-token blocks");
        assert_eq!(cli::CapacityArgs { oracle_capacity_tokens: None }.resolve(4, &b.sim_arg, None).gpu_blocks, 12_000);
        assert!(Cli::try_parse_from(["kvroute-bench", "stack", "--oracle-capacity-tokens", "5"]).is_ok());
    }
}
