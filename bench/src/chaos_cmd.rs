//! `kvroute-bench chaos`: start the stack (the production topology: `--replicas 2
//! --redis-shards 3`), run every failure scenario in turn under bounded load, print and write
//! the table (`chaos.md`, `chaos.json` in `--out`), stop everything.

use crate::stack_cmd::LaunchArgs;
use anyhow::{bail, Result};
use clap::Args;
use kvroute_bench::chaos::{self, ChaosConfig, Fault};
use kvroute_bench::stack::Stack;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct ChaosArgs {
    #[command(flatten)]
    pub launch: LaunchArgs,
    /// Requests per scenario.
    #[arg(long, default_value_t = 240)]
    pub requests: usize,
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Prompt length (token ids; six shared prefixes).
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 32)]
    pub output_tokens: u32,
    /// The fault is injected once this many requests of a scenario are done.
    #[arg(long, default_value_t = 60)]
    pub fault_after: usize,
    /// How long a killed process stays dead / a frozen one frozen, seconds.
    #[arg(long, default_value_t = 4.0)]
    pub fault_secs: f64,
    /// How long the "dead for long" scenario keeps a state replica dead, seconds (0: skip it).
    #[arg(long, default_value_t = 60.0)]
    pub dead_secs: f64,
    /// How long the frozen-worker scenario keeps a worker frozen, seconds (0: skip it).
    #[arg(long, default_value_t = 15.0)]
    pub worker_freeze_secs: f64,
    /// Blocks the flooding worker announces (0: skip that scenario).
    #[arg(long, default_value_t = 1_000_000)]
    pub flood_blocks: u64,
    /// A replica's in-flight count within this of the truth counts as equal.
    #[arg(long, default_value_t = 2)]
    pub tolerance: u64,
    #[arg(long, default_value = "kvroute/sim-27b-fp8")]
    pub model: String,
    #[arg(long, default_value = "bench/results/chaos")]
    pub out: PathBuf,
}

pub async fn run(args: ChaosArgs) -> Result<()> {
    let cfg = args.launch.config(&args.model, &args.out.join("stack"))?;
    if cfg.workers < 2 {
        bail!("chaos needs at least 2 workers (one is killed and one drained)");
    }
    let (replicas, shards) = (cfg.replicas, cfg.redis_shards);
    eprintln!("starting {} workers, {replicas} state replica(s), {shards} Redis shard(s) and Envoy (logs in {})", cfg.workers, cfg.work_dir.display());
    let mut stack = Stack::start(cfg).await?;
    let mut scenarios = vec![Fault::None, Fault::KillReplica(0), Fault::FreezeReplica(0)];
    if replicas > 1 && args.dead_secs > 0.0 {
        scenarios.push(Fault::ReplicaDead(0));
    }
    scenarios.push(Fault::KillWorker(1));
    if args.worker_freeze_secs > 0.0 {
        scenarios.push(Fault::FreezeWorker(1));
    }
    if args.flood_blocks > 0 {
        scenarios.push(Fault::FloodWorker(stack.config.workers - 1));
    }
    if shards > 0 {
        scenarios.push(Fault::KillShard(0));
    }
    // Last: a drained worker stays removed.
    scenarios.push(Fault::DrainWorker(2 % stack.config.workers));
    let load = ChaosConfig {
        requests: args.requests,
        concurrency: args.concurrency,
        prompt_tokens: args.prompt_tokens,
        output_tokens: args.output_tokens,
        fault_after: args.fault_after,
        fault_secs: args.fault_secs,
        dead_secs: args.dead_secs,
        worker_freeze_secs: args.worker_freeze_secs,
        flood_blocks: args.flood_blocks,
        tolerance: args.tolerance,
        model: args.model.clone(),
    };
    let mut results = Vec::new();
    for fault in scenarios {
        eprintln!("scenario: {}", fault.label());
        let r = chaos::run(&mut stack, fault, &load).await?;
        eprintln!("  {} / {} failed ({} beyond those running on a killed worker)", r.failed, r.total, r.failed_beyond_running);
        results.push(r);
        // Let the restored parts settle (health scrapes, subscriptions) before the next one.
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    drop(stack);
    let table = chaos::table(&results);
    print!("\n{table}");
    std::fs::create_dir_all(&args.out)?;
    let header = format!(
        "{} workers, {replicas} state replica(s), {shards} Redis shard(s); {} streamed requests per scenario, {} at a time, fault after {}, held {} s\n\n",
        args.launch.workers, args.requests, args.concurrency, args.fault_after, args.fault_secs
    );
    std::fs::write(args.out.join("chaos.md"), format!("{header}{table}"))?;
    std::fs::write(args.out.join("chaos.json"), serde_json::to_vec_pretty(&results)?)?;
    println!("wrote {}", args.out.join("chaos.md").display());
    Ok(())
}
