//! `kvroute-bench stack`: start the stack (or attach to one), compare the policies, write
//! the results, stop what was started — also on Ctrl-C, where the stack guard is dropped
//! before the process exits.

use crate::cli::{CapacityArgs, CompareArgs, WorkloadArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use kvroute_bench::bounds;
use kvroute_bench::compare;
use kvroute_bench::control::Control;
use kvroute_bench::peer_router::{PeerRouter, SGLANG_ROUTER};
use kvroute_bench::report::table;
use kvroute_bench::stack::{Ports, Stack, StackConfig};
use std::path::PathBuf;

#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct StackArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub compare: CompareArgs,
    #[command(flatten)]
    pub capacity: CapacityArgs,
    /// Run against an already-running stack (--url, --state-url, --worker-url) instead.
    #[arg(long)]
    pub attach: bool,
    /// attach: Envoy's listener.
    #[arg(long, default_value = "http://127.0.0.1:10000")]
    pub url: String,
    /// attach: the state service.
    #[arg(long, default_value = "http://127.0.0.1:9000")]
    pub state_url: String,
    /// attach: each simulated worker's base URL (repeat or comma-separate).
    #[arg(long, value_delimiter = ',')]
    pub worker_url: Vec<String>,
    /// The state service's admin token (attach); the generated one otherwise.
    #[arg(long, env = "KVROUTE_ADMIN_TOKEN", hide_env_values = true)]
    #[serde(skip)]
    pub admin_token: Option<String>,
    #[command(flatten)]
    pub launch: LaunchArgs,
}

/// What to start: workers, ports, binaries, the state service's topology.
#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct LaunchArgs {
    /// Simulated workers to start.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Envoy listens on BASE, its admin on BASE+1, the state service on BASE+2, workers on
    /// BASE+100.., their ZMQ sockets on BASE+200...
    #[arg(long, default_value_t = 18000)]
    pub port_base: u16,
    /// The sims' time scale (0.25 = four times faster than the L40S/27B profile); with
    /// --attach, say what the running sims use. Reports are in simulated seconds.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Where kvroute-sim and kvroute-state are.
    #[arg(long, default_value = "target/release")]
    pub bin_dir: PathBuf,
    #[arg(long, env = "ENVOY", default_value = ".cache/venv/bin/envoy")]
    pub envoy: PathBuf,
    #[arg(long, default_value = "target/wasm32-wasip1/release/kvroute_filter.wasm")]
    pub wasm: PathBuf,
    /// Tokenizer for the sims' chat endpoint (see tokenize/fetch-tokenizer.sh).
    #[arg(long, env = "KVROUTE_TOKENIZER_DIR")]
    pub tokenizer_dir: Option<PathBuf>,
    /// Extra kvroute-sim flag, repeatable: --sim-arg=--num-gpu-blocks --sim-arg=3000.
    #[arg(long, allow_hyphen_values = true)]
    pub sim_arg: Vec<String>,
    /// Queue picks in the state service while every worker is saturated ([scheduling]).
    #[arg(long)]
    pub scheduling: bool,
    /// A `[scheduling]` setting for --scheduling, repeatable: --scheduling-set max_unstarted=1.
    #[arg(long, value_parser = parse_setting)]
    pub scheduling_set: Vec<(String, String)>,
    #[command(flatten)]
    pub topology: TopologyArgs,
}

impl LaunchArgs {
    /// The stack these flags describe, serving `model`, its configs and logs in `work_dir`.
    pub fn config(&self, model: &str, work_dir: &std::path::Path) -> Result<StackConfig> {
        if self.workers == 0 || !(self.time_scale > 0.0) {
            bail!("--workers must be > 0 and --time-scale > 0");
        }
        Ok(StackConfig {
            sim_bin: abs(&self.bin_dir.join("kvroute-sim"))?,
            state_bin: abs(&self.bin_dir.join("kvroute-state"))?,
            envoy_bin: abs(&self.envoy)?,
            wasm: abs(&self.wasm)?,
            workers: self.workers,
            ports: Ports::from_base(self.port_base),
            model: model.to_string(),
            time_scale: self.time_scale,
            admin_token: format!("bench-{}", std::process::id()),
            api_token: random_token(),
            tokenizer_dir: self.tokenizer_dir.as_ref().map(abs).transpose()?,
            sim_args: self.sim_arg.clone(),
            work_dir: abs(&work_dir.to_path_buf())?,
            replicas: self.topology.replicas,
            redis_shards: self.topology.redis_shards,
            redis_bin: resolve_bin(&self.topology.redis_bin)?,
            scheduling: self.scheduling,
            scheduling_set: self.scheduling_set.clone(),
            tenant_header: self.scheduling,
        })
    }
}

/// The state service's topology: one replica on the in-memory store (default), or the
/// production one, several replicas on sharded Redis behind Envoy's `kvroute_state` cluster.
#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct TopologyArgs {
    /// State service replicas (more than one needs --redis-shards).
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Redis shards to start (`redis-server` processes on BASE+300..); 0 = in-memory store.
    #[arg(long, default_value_t = 0)]
    pub redis_shards: usize,
    #[arg(long, env = "REDIS_SERVER", default_value = "redis-server")]
    pub redis_bin: PathBuf,
}

fn abs(p: &PathBuf) -> Result<PathBuf> {
    Ok(if p.is_absolute() { p.clone() } else { std::env::current_dir()?.join(p) })
}

fn resolve_bin(p: &PathBuf) -> Result<PathBuf> {
    if p.components().count() == 1 {
        if let Some(found) = std::env::var_os("PATH").and_then(|path| std::env::split_paths(&path).map(|d| d.join(p)).find(|c| c.is_file())) {
            return Ok(found);
        }
    }
    abs(p)
}

async fn start(args: &StackArgs) -> Result<Stack> {
    let mut cfg = args.launch.config(&args.workload.model, &args.compare.out.join("stack"))?;
    cfg.tenant_header |= !args.compare.classes.is_empty();
    eprintln!("starting {} workers, the state service and Envoy (logs in {})", cfg.workers, cfg.work_dir.display());
    Ok(Stack::start(cfg).await?)
}

pub async fn run(args: StackArgs) -> Result<()> {
    if args.launch.workers == 0 || !(args.launch.time_scale > 0.0) {
        bail!("--workers must be > 0 and --time-scale > 0");
    }
    let workload = args.workload.build().context("building the workload")?;
    eprintln!("workload {}: {} requests in {} sessions", workload.name, workload.num_requests(), workload.sessions.len());
    let mut stack = None;
    let (url, control) = if args.attach {
        if args.worker_url.is_empty() {
            bail!("--attach needs --worker-url for each simulated worker (cache resets and hit ratios)");
        }
        let c = Control::new(args.state_url.clone(), args.admin_token.clone(), args.worker_url.clone())?;
        (args.url.clone(), c)
    } else {
        let s = tokio::select! {
            s = start(&args) => s?,
            _ = tokio::signal::ctrl_c() => bail!("interrupted while starting the stack"),
        };
        let c = Control::new(s.state_url(), Some(s.config.admin_token.clone()), s.worker_urls())?;
        let url = s.envoy_url();
        stack = Some(s);
        (url, c)
    };
    let mut spec = args.compare.spec(&url, &args.workload.model, args.workload.seed, args.launch.time_scale)?;
    if spec.policies.iter().any(|p| p == SGLANG_ROUTER) {
        if matches!(args.workload.prompt_mode, kvroute_bench::workload::PromptMode::Tokens) {
            bail!("the {SGLANG_ROUTER} row needs --prompt-mode chat: the real router takes only text prompts (a token-id prompt is a 422)");
        }
        let root = std::env::var_os("KVROUTE_ROOT").map_or_else(|| PathBuf::from("."), PathBuf::from);
        let Some(bin) = PeerRouter::find(args.compare.sglang_router.as_deref(), &root) else {
            bail!("the {SGLANG_ROUTER} row needs the real router: pip install sglang-router (into .cache/venv), or --sglang-router PATH");
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).context("a port for sglang-router")?.port();
        let work_dir = args.compare.out.join("stack");
        std::fs::create_dir_all(&work_dir)?;
        let (policy, extra) = (args.compare.sglang_router_policy.clone(), args.compare.sglang_router_arg.clone());
        spec.peer = Some(PeerRouter { bin, workers: control.workers.clone(), port, work_dir, policy, extra });
    }
    let params = serde_json::to_value(&args)?;
    // The oracle bound's capacity: what the workers report, else the flags they got.
    let n_workers = if args.attach { args.worker_url.len() } else { args.launch.workers };
    let metrics = control.worker_metrics().await;
    let capacity = args.capacity.resolve(n_workers, &args.launch.sim_arg, metrics.as_deref());
    let reuse_bounds = bounds::of_workload(&workload, args.workload.seed, capacity);
    eprintln!("{}", reuse_bounds.summary());
    let pct = |v: Option<f64>| v.map_or("n/a".into(), |h| format!("{:.1}%", h * 100.0));
    let run = compare::compare(&workload, &control, &spec, params, Some(reuse_bounds), |p| {
        let s = &p.summary;
        eprintln!(
            "  {:<18} ttft p50 {:>7.3} s  p90 {:>7.3} s  goodput {:>6.1}/min  vllm hit {}  reuse {} ({} of oracle)",
            p.name(spec.repeat > 1),
            s.ttft_p50.unwrap_or(f64::NAN),
            s.ttft_p90.unwrap_or(f64::NAN),
            s.goodput.per_min,
            pct(p.cache_hit_ratio),
            pct(p.first_scheduled.as_ref().and_then(|r| r.total)),
            pct(p.share_of_oracle),
        );
    });
    let report = tokio::select! {
        r = run => r,
        _ = tokio::signal::ctrl_c() => {
            drop(stack.take());
            bail!("interrupted; everything the benchmark started has been stopped");
        }
    };
    drop(stack.take());
    let report = report?;
    print!("\n{}", table(&report));
    for p in crate::output::write(&report, &args.compare.out)? {
        println!("wrote {p}");
    }
    Ok(())
}

/// A fresh 64-hex-digit credential for one stack run.
fn random_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `key=value`, a TOML key and a scalar value as TOML writes it (`1`, `0.8`, `true`, `"x"`).
fn parse_setting(s: &str) -> std::result::Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected key=value"))?;
    let (k, v) = (k.trim(), v.trim());
    if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("{k:?}: not a setting name"));
    }
    let quoted = v.len() >= 2 && v.starts_with('"') && v.ends_with('"') && !v[1..v.len() - 1].contains(['"', '\\']);
    if !(quoted || v == "true" || v == "false" || v.parse::<f64>().is_ok()) {
        return Err(format!("{v:?}: expected a number, true, false or a quoted string"));
    }
    Ok((k.into(), v.into()))
}
