//! `kvroute-bench soak`: the production topology under production-shaped load for a long time
//! (an hour by default) with a fault every few minutes; writes `soak.md` and `soak.json`.

use crate::stack_cmd::LaunchArgs;
use anyhow::Result;
use clap::Args;
use kvroute_bench::soak::{self, SoakConfig};
use kvroute_bench::stack::Stack;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    #[command(flatten)]
    pub launch: LaunchArgs,
    #[arg(long, default_value_t = 60.0)]
    pub minutes: f64,
    /// A fault starts this often, seconds.
    #[arg(long, default_value_t = 240.0)]
    pub fault_every: f64,
    /// How long a killed process stays dead / a frozen one frozen, seconds.
    #[arg(long, default_value_t = 4.0)]
    pub fault_secs: f64,
    #[arg(long, default_value_t = 10.0)]
    pub sample_secs: f64,
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 2048)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 64)]
    pub output_tokens: u32,
    /// A replica's in-flight count within this of the truth counts as equal.
    #[arg(long, default_value_t = 2)]
    pub tolerance: u64,
    #[arg(long, default_value = "kvroute/sim-27b-fp8")]
    pub model: String,
    #[arg(long, default_value = "bench/results/soak")]
    pub out: PathBuf,
    /// Start nothing: write `soak.md` and `soak-rss.svg` again from this `soak.json`.
    #[arg(long)]
    pub replot: Option<PathBuf>,
}

pub async fn run(args: SoakArgs) -> Result<()> {
    if let Some(json) = &args.replot {
        let report: soak::SoakReport = serde_json::from_slice(&std::fs::read(json)?)?;
        return write(&args.out, &report, false);
    }
    let cfg = args.launch.config(&args.model, &args.out.join("stack"))?;
    eprintln!("starting {} workers, {} state replica(s), {} Redis shard(s) and Envoy (logs in {})", cfg.workers, cfg.replicas, cfg.redis_shards, cfg.work_dir.display());
    let mut stack = Stack::start(cfg).await?;
    let soak_cfg = SoakConfig {
        duration: Duration::from_secs_f64(args.minutes * 60.0),
        fault_every: Duration::from_secs_f64(args.fault_every),
        fault_secs: args.fault_secs,
        sample_every: Duration::from_secs_f64(args.sample_secs),
        concurrency: args.concurrency,
        prompt_tokens: args.prompt_tokens,
        output_tokens: args.output_tokens,
        model: args.model.clone(),
        tolerance: args.tolerance,
    };
    let report = soak::run(&mut stack, &soak_cfg).await?;
    drop(stack);
    write(&args.out, &report, true)
}

fn write(out: &std::path::Path, report: &soak::SoakReport, json: bool) -> Result<()> {
    let md = soak::markdown(report);
    print!("\n{md}");
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("soak.md"), &md)?;
    if json {
        std::fs::write(out.join("soak.json"), serde_json::to_vec_pretty(report)?)?;
    }
    std::fs::write(out.join("soak-rss.svg"), soak::rss_svg(report))?;
    println!("wrote {}", out.join("soak.md").display());
    Ok(())
}
