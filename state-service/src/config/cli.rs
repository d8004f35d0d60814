//! Command-line flags. Each flag also reads an environment variable, so a container can be
//! configured without a shell.

use kvroute_score::Policy;
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;

/// `kvroute-state --config path.toml [--listen 127.0.0.1:9000] [--policy kvroute]`
#[derive(Debug, Parser, Default)]
#[command(name = "kvroute-state", version, about = "kvroute state service")]
pub struct Cli {
    /// TOML config file (workers, models, timeouts).
    #[arg(long, env = "KVROUTE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Overrides `listen` from the file.
    #[arg(long, env = "KVROUTE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Overrides `policy`: kvroute | random | round_robin | least_loaded | sglang_cache_aware |
    /// llmd_default | dynamo_kv.
    #[arg(long, env = "KVROUTE_POLICY")]
    pub policy: Option<Policy>,
    /// Overrides `affinity_tolerance` (0..=1).
    #[arg(long, env = "KVROUTE_AFFINITY_TOLERANCE")]
    pub affinity_tolerance: Option<f64>,
    /// Overrides `queue_externality` (0..=10).
    #[arg(long, env = "KVROUTE_QUEUE_EXTERNALITY")]
    pub queue_externality: Option<f64>,
    /// Overrides `tokenization.default_tokenizer_dir` (models without their own `tokenizer_dir`).
    #[arg(long, env = "KVROUTE_TOKENIZER_DIR")]
    pub tokenizer_dir: Option<PathBuf>,
}
