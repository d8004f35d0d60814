//! `kvroute-bench`: compare routing policies on a kvroute stack (see bench/README.md).
//! Thin: parse flags, build the workload, start or attach to the stack, run, write results.

mod cli;
mod output;
mod stack_cmd;

use anyhow::Result;
use clap::{Parser, Subcommand};
use kvroute_bench::workload::trace;
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
    Stack(stack_cmd::StackArgs),
    /// Write a synthetic Mooncake-format trace (the shipped sample is made by this).
    GenTrace {
        #[arg(long, default_value = "bench/traces/sample.jsonl")]
        out: PathBuf,
        #[arg(long, default_value_t = 240)]
        requests: usize,
        #[arg(long, default_value_t = 1.0)]
        rate: f64,
        #[arg(long, default_value_t = 12)]
        roots: u64,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// Redraw the table and plots from a report.json.
    Report {
        json: PathBuf,
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Stack(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(stack_cmd::run(args))
        }
        Cmd::GenTrace { out, requests, rate, roots, seed } => {
            let recs = trace::synthesize(&trace::SynthSpec { requests, rate_per_s: rate, roots, seed });
            let mut text = String::new();
            for r in &recs {
                text.push_str(&serde_json::to_string(r)?);
                text.push('\n');
            }
            std::fs::write(&out, text)?;
            println!("wrote {} records to {}", recs.len(), out.display());
            Ok(())
        }
        Cmd::Report { json, out } => {
            let report: kvroute_bench::report::RunReport = serde_json::from_slice(&std::fs::read(&json)?)?;
            let dir = out.unwrap_or_else(|| json.parent().map(PathBuf::from).unwrap_or_default());
            output::write(&report, &dir)?;
            print!("{}", kvroute_bench::report::table(&report));
            Ok(())
        }
    }
}
