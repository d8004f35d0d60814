//! `kvroute-bench up`: start the stack and leave it running for your own clients (the
//! official OpenAI and Anthropic SDKs, curl) until Ctrl-C; then stop everything it started.

use crate::stack_cmd::LaunchArgs;
use anyhow::{bail, Result};
use clap::Args;
use kvroute_bench::stack::Stack;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    pub launch: LaunchArgs,
    /// The model the simulated workers serve (what clients put in `model`).
    #[arg(long, default_value = "kvroute/sim-27b-fp8")]
    pub model: String,
    /// Generated configs and process logs.
    #[arg(long, default_value = "bench/results/up")]
    pub work_dir: PathBuf,
}

pub async fn run(args: UpArgs) -> Result<()> {
    let cfg = args.launch.config(&args.model, &args.work_dir)?;
    eprintln!(
        "starting {} simulated workers, {} state replica(s) and Envoy with the kvroute filter (logs in {})",
        cfg.workers,
        cfg.replicas,
        cfg.work_dir.display()
    );
    let stack = tokio::select! {
        s = Stack::start(cfg) => s?,
        _ = tokio::signal::ctrl_c() => bail!("interrupted while starting the stack"),
    };
    let (envoy, state, ports, token) = (stack.envoy_url(), stack.state_url(), &stack.config.ports, &stack.config.api_token);
    println!(
        r#"
kvroute is up. Point any OpenAI or Anthropic client at Envoy:

  OpenAI SDK     base_url = "{envoy}/v1"   (any api_key)
  Anthropic SDK  base_url = "{envoy}"      (any api_key)
  model          "{model}"

  python3 -c 'from openai import OpenAI; c = OpenAI(base_url="{envoy}/v1", api_key="x")
  print(c.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "hi"}}]).choices[0].message.content)'

What kvroute sees:
  workers, load, cache   curl -H "Authorization: Bearer {token}" {state}/v1/workers
  state metrics          {state}/metrics
  filter metrics         http://127.0.0.1:{admin}/stats?filter=kvroute
  each worker            {workers}

Ctrl-C stops everything."#,
        model = args.model,
        admin = ports.envoy_admin,
        workers = stack.worker_urls().join(" "),
    );
    tokio::signal::ctrl_c().await?;
    eprintln!("stopping");
    drop(stack);
    Ok(())
}
