//! `kvroute-sim`: run N simulated vLLM workers in one process. Thin: parse flags, build the
//! cluster, print its layout as one JSON line on stdout, serve until killed.

use anyhow::{bail, Context, Result};
use clap::Parser;
use kvroute_sim::chat::ChatTokenizer;
use kvroute_sim::cluster::{Cluster, ClusterConfig};
use kvroute_sim::engine::{EngineConfig, OffloadConfig, StepProfile};
use kvroute_sim::events::EventEncoding;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(about = "Simulated vLLM workers: OpenAI API, prefix cache, KV events over ZMQ, metrics")]
struct Args {
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Id of the first worker (`x-sim-worker`); worker i is first-worker-id + i. For one
    /// process per worker standing for one fleet.
    #[arg(long, default_value_t = 0)]
    first_worker_id: u32,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Worker i serves HTTP on http-port + i.
    #[arg(long, default_value_t = 8100)]
    http_port: u16,
    /// Worker i publishes on zmq-port + 2i and answers replay on zmq-port + 2i + 1; with
    /// --dp-size N its rank r uses zmq-port + 2Ni + r and zmq-port + 2Ni + N + r.
    #[arg(long, default_value_t = 5600)]
    zmq_port: u16,
    /// Data-parallel ranks per worker (vLLM's --data-parallel-size): each its own engine,
    /// KV cache and event publisher, behind the worker's one HTTP endpoint.
    #[arg(long, default_value_t = 1)]
    dp_size: usize,
    #[arg(long, default_value = "kvroute/sim-27b-fp8")]
    model: String,
    /// Directory with tokenizer.json + tokenizer_config.json (see tokenize/fetch-tokenizer.sh).
    #[arg(long, env = "KVROUTE_TOKENIZER_DIR")]
    tokenizer_dir: Option<PathBuf>,
    /// Multiplies every step duration (0.1 = ten times faster than the profile).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    #[arg(long, default_value_t = 5600)]
    num_gpu_blocks: usize,
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    #[arg(long, default_value_t = 2048)]
    max_num_batched_tokens: usize,
    #[arg(long, default_value_t = 32768)]
    max_model_len: usize,
    /// Without ignore_eos, generation stops after this many tokens.
    #[arg(long, default_value_t = 128)]
    eos_after: usize,
    #[arg(long, default_value_t = 36.0)]
    step_overhead_ms: f64,
    #[arg(long, default_value_t = 300.0)]
    prefill_us_per_token: f64,
    #[arg(long, default_value_t = 600.0)]
    decode_us_per_seq: f64,
    /// KV cache bytes per token (all layers, K+V): what a CPU offload copy moves per token.
    #[arg(long, default_value_t = 163_840)]
    kv_bytes_per_token: u64,
    /// CPU offload tier size in KV blocks (vLLM's --kv-offloading-size, in blocks); 0 = off.
    #[arg(long, default_value_t = 0)]
    cpu_blocks: usize,
    /// Host-to-device bandwidth (GB/s) a reload from the CPU tier copies at.
    #[arg(long, default_value_t = 25.0)]
    h2d_gb_per_s: f64,
    /// Device-to-host bandwidth (GB/s) a store into the CPU tier copies at.
    #[arg(long, default_value_t = 25.0)]
    d2h_gb_per_s: f64,
    /// CPU-tier BlockStored events carry tokens, parent and block size (vLLM's
    /// `self_describing_kv_events`) instead of placeholders.
    #[arg(long)]
    self_describing_kv_events: bool,
    /// Per-worker overrides, repeatable: `2:num_gpu_blocks=1000,step_overhead_ms=50`.
    #[arg(long = "worker-override")]
    worker_override: Vec<String>,
    #[arg(long, default_value = "")]
    topic: String,
    #[arg(long, default_value_t = 10_000)]
    buffer_steps: usize,
    /// Encode events in the pre-0.26 positional-array form.
    #[arg(long)]
    legacy_events: bool,
    /// Disable KV event publishing entirely.
    #[arg(long)]
    no_events: bool,
    /// Drop this fraction of event messages (sequence numbers still advance).
    #[arg(long, default_value_t = 0.0)]
    drop_fraction: f64,
    /// Keep `store: true` Responses API responses in each worker's memory (GET, cancel,
    /// previous_response_id). vLLM does so only with VLLM_ENABLE_RESPONSES_API_STORE=1 (and
    /// then ignores `store` silently otherwise); `--responses-store false` serves that default.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    responses_store: bool,
}

fn apply_override(base: &EngineConfig, spec: &str) -> Result<(usize, EngineConfig)> {
    let (idx, kvs) = spec.split_once(':').context("override must look like `INDEX:key=value,...`")?;
    let idx: usize = idx.parse().context("override index")?;
    let mut e = base.clone();
    for kv in kvs.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').context("override entries are key=value")?;
        let f: f64 = v.parse().with_context(|| format!("value of {k}"))?;
        match k {
            "num_gpu_blocks" => e.num_gpu_blocks = f as usize,
            "max_num_seqs" => e.max_num_seqs = f as usize,
            "max_num_batched_tokens" => e.max_num_batched_tokens = f as usize,
            "step_overhead_ms" => e.profile.overhead_s = f / 1e3,
            "prefill_us_per_token" => e.profile.per_prefill_token_s = f / 1e6,
            "decode_us_per_seq" => e.profile.per_running_seq_s = f / 1e6,
            "kv_bytes_per_token" => e.profile.kv_bytes_per_token = f as u64,
            "cpu_blocks" => e.offload.cpu_blocks = f as usize,
            "h2d_gb_per_s" => e.offload.h2d_gb_per_s = f,
            "d2h_gb_per_s" => e.offload.d2h_gb_per_s = f,
            "time_scale" => e.time_scale = f,
            _ => bail!("unknown override key {k}"),
        }
    }
    Ok((idx, e))
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    if a.time_scale <= 0.0 || !a.time_scale.is_finite() {
        bail!("--time-scale must be positive");
    }
    if !(a.h2d_gb_per_s > 0.0 && a.d2h_gb_per_s > 0.0) {
        bail!("--h2d-gb-per-s and --d2h-gb-per-s must be positive");
    }
    if !(1..=256).contains(&a.dp_size) {
        bail!("--dp-size must be in 1..=256");
    }
    let engine = EngineConfig {
        block_size: a.block_size.max(1),
        num_gpu_blocks: a.num_gpu_blocks,
        max_num_seqs: a.max_num_seqs.max(1),
        max_num_batched_tokens: a.max_num_batched_tokens.max(1),
        max_model_len: a.max_model_len,
        eos_after: a.eos_after,
        profile: StepProfile {
            overhead_s: a.step_overhead_ms / 1e3,
            per_prefill_token_s: a.prefill_us_per_token / 1e6,
            per_running_seq_s: a.decode_us_per_seq / 1e6,
            kv_bytes_per_token: a.kv_bytes_per_token,
        },
        time_scale: a.time_scale,
        offload: OffloadConfig {
            cpu_blocks: a.cpu_blocks,
            h2d_gb_per_s: a.h2d_gb_per_s,
            d2h_gb_per_s: a.d2h_gb_per_s,
            self_describing_events: a.self_describing_kv_events,
        },
    };
    let overrides = a.worker_override.iter().map(|s| apply_override(&engine, s)).collect::<Result<Vec<_>>>()?;
    let tokenizer = match &a.tokenizer_dir {
        Some(dir) => ChatTokenizer::from_dir(dir).with_context(|| format!("loading tokenizer from {}", dir.display()))?,
        None => {
            tracing::warn!("no --tokenizer-dir / KVROUTE_TOKENIZER_DIR: using byte-level fallback tokenization");
            ChatTokenizer::byte_fallback()
        }
    };
    let cfg = ClusterConfig {
        workers: a.workers,
        first_worker_id: a.first_worker_id,
        dp_size: a.dp_size,
        host: a.host,
        http_port: a.http_port,
        zmq_port: a.zmq_port,
        model: a.model,
        engine,
        overrides,
        topic: a.topic,
        buffer_steps: a.buffer_steps.max(1),
        encoding: if a.legacy_events { EventEncoding::Legacy } else { EventEncoding::Map },
        events: !a.no_events,
        drop_fraction: a.drop_fraction.clamp(0.0, 1.0),
        responses_store: a.responses_store,
    };
    let cluster = Cluster::start(cfg, Arc::new(tokenizer)).await?;
    println!("{}", serde_json::json!({ "workers": cluster.layout, "tokenizer": cluster_tokenizer_kind(&a.tokenizer_dir) }));
    tokio::select! {
        _ = cluster.wait() => {}
        _ = tokio::signal::ctrl_c() => tracing::info!("shutting down"),
    }
    Ok(())
}

fn cluster_tokenizer_kind(dir: &Option<PathBuf>) -> &'static str {
    if dir.is_some() { "hugging-face" } else { "byte-fallback" }
}
