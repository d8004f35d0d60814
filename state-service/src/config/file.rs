//! The config file's shape, with every default in one place.

use kvroute_score::Policy;
use super::store::{RedisConfig, StoreKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// vLLM's default `--block-size`.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: SocketAddr,
    /// Bearer token for `/admin/*`. Without one the admin API is disabled (403).
    pub admin_token: Option<String>,
    /// File holding the admin token (read at start, trimmed); instead of `admin_token`.
    pub admin_token_file: Option<PathBuf>,
    /// Bearer token the proxy (the filter's `state_token`) must send on `/v1/*`: pick, report
    /// and the read views. At least 32 characters. Without one the API is open (logged).
    /// Env `KVROUTE_API_TOKEN` overrides it.
    pub api_token: Option<String>,
    /// File holding the API token (read at start, trimmed); instead of `api_token`.
    pub api_token_file: Option<PathBuf>,
    pub policy: Policy,
    /// Seeds tie-breaking and assignment ids (tests, reproducible benchmarks).
    pub seed: Option<u64>,
    /// Must equal the filter's text chunk size (core::keys::DEFAULT_TEXT_CHUNK_BYTES).
    pub text_chunk_bytes: u32,
    /// Bound of the learned text-chunk map (kvroute picks without exact keys).
    pub approx_capacity: usize,
    /// Consecutive failed scrapes after which a worker is taken out of picks.
    pub unhealthy_after: u32,
    /// kvroute policy: TTFT predictions within this fraction of the fastest count as tied,
    /// and the tie goes to the worker with the longest cached prefix (score::select).
    /// 0.3 from the shared-prefix benchmark (bench/README.md): 0.1 spilled groups to cold
    /// workers under load (p90 4.5 s, hit ratio 74%), 0.3 and 0.6 kept them (p90 3.5 s,
    /// 85%); the online calibration underestimates prefill cost under batching by ~30%.
    pub affinity_tolerance: f64,
    /// kvroute policy: the weight of a placement's cost to the requests queued behind it
    /// (score::model::placement_cost): 1 charges each waiting request the prefill it would
    /// wait for beyond what the warmest placement computes (Little's law), 0 picks on
    /// predicted TTFT alone, more keeps conversations on their worker longer at the cost of
    /// longer queues there. 2 (the default) measured best on
    /// the production-shaped trace (bench/README.md "Placement cost": 1 and 4 were worse): the
    /// queue counted is the movers' (the worker holding the prompt is left out), and requests
    /// arriving while the prefill runs wait for it too.
    pub queue_externality: f64,
    pub timeouts: Timeouts,
    /// Defaults for every worker's cost model; a worker may override them.
    pub priors: Priors,
    pub models: BTreeMap<String, ModelConfig>,
    /// The model a request without one is served by (vLLM serves a request with no `model`,
    /// or an empty one, by its first served model). Unset: the fleet's model when it serves
    /// one; with several, such a request is not routed (it still is admitted and charged).
    pub default_model: Option<String>,
    pub workers: Vec<WorkerConfig>,
    /// Workers found by DNS or in a watched file (`[[worker_groups]]`, see `groups.rs`).
    pub worker_groups: Vec<super::groups::WorkerGroup>,
    /// `memory` (default) or `redis` (several replicas act as one; see `[redis]`).
    pub store: StoreKind,
    pub redis: RedisConfig,
    /// How text and chat prompts become token ids (local tokenizer, worker `/tokenize`).
    pub tokenization: Tokenization,
    /// Failover hints, load shedding and draining.
    pub resilience: Resilience,
    /// Endpoints / clusters a worker may have (exact, or with `*`: `10.1.0.*:8000`,
    /// `vllm_*`); empty: any. Applies to configured workers, admin registrations and workers
    /// adopted from another replica through Redis alike (the filter's `allowed_targets` is
    /// the proxy-side twin).
    pub allowed_targets: Vec<String>,
    /// Tenants' budgets (see the README's "Tenants and budgets").
    pub tenancy: crate::tenancy::TenancyConfig,
    /// Which worker stores each Responses API response (see `responses.rs`).
    pub responses: crate::stored::ResponsesConfig,
    /// Queueing picks while every worker is saturated (see `sched.rs`).
    pub scheduling: crate::sched::SchedulingConfig,
    /// Pools of workers by label (see `pools.rs`).
    pub pools: std::collections::BTreeMap<String, crate::pools::PoolConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 9000)),
            admin_token: None,
            admin_token_file: None,
            api_token: None,
            api_token_file: None,
            policy: Policy::Kvroute,
            seed: None,
            text_chunk_bytes: kvroute_core::keys::DEFAULT_TEXT_CHUNK_BYTES as u32,
            approx_capacity: 100_000,
            unhealthy_after: 3,
            affinity_tolerance: 0.3,
            queue_externality: 2.0,
            timeouts: Timeouts::default(),
            priors: Priors::default(),
            models: BTreeMap::new(),
            default_model: None,
            workers: Vec::new(),
            worker_groups: Vec::new(),
            store: StoreKind::Memory,
            redis: RedisConfig::default(),
            tokenization: Tokenization::default(),
            resilience: Resilience::default(),
            allowed_targets: Vec::new(),
            tenancy: crate::tenancy::TenancyConfig::default(),
            responses: crate::stored::ResponsesConfig::default(),
            scheduling: crate::sched::SchedulingConfig::default(),
            pools: Default::default(),
        }
    }
}

/// What keeps a failing worker or an overloaded service from failing requests.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Resilience {
    /// Next-best workers each pick names for the proxy to fail over to (the override-host
    /// list; Envoy's retry moves down it).
    pub fallback_workers: usize,
    /// Picks decided at once; more wait for a slot up to `pick_queue_ms`.
    pub max_concurrent_picks: usize,
    /// How long a pick may wait for a slot before it is answered 429 "overloaded" (the proxy
    /// then falls back at once). Keep it below the filter's `pick_timeout_ms`, so a pick is
    /// either decided in time or refused in time, never timed out.
    pub pick_queue_ms: u64,
    /// A draining worker is removed when its last in-flight request ends, or after this.
    pub drain_timeout_ms: u64,
    /// Most assignments held; past it the oldest is freed (`kvroute_assignments_evicted_total`).
    pub max_assignments: usize,
    /// Each engine's index holds at most this many times the blocks its worker reports
    /// (`vllm:cache_config_info` GPU + CPU blocks, spread over its engines; plus 256): past
    /// it the oldest are dropped, counted as `events_rejected{kind="over_capacity"}`. vLLM
    /// evicts and says so, so only an engine reporting more than it has reaches it. 0: no
    /// bound. Unbounded until the first scrape that reports capacity.
    pub index_capacity_factor: f64,
}

impl Default for Resilience {
    fn default() -> Self {
        Resilience { fallback_workers: 2, max_concurrent_picks: 256, pick_queue_ms: 20, drain_timeout_ms: 120_000, max_assignments: 200_000, index_capacity_factor: 2.0 }
    }
}

/// Every duration, in milliseconds.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Timeouts {
    pub scrape_interval_ms: u64,
    pub scrape_timeout_ms: u64,
    /// An assignment nobody reported complete or cancelled is freed after this.
    pub assignment_ttl_ms: u64,
    /// An assignment without a first-token report is freed after this.
    pub first_token_ttl_ms: u64,
    /// How long a pick credits the chosen worker with the request's keys.
    pub speculative_ttl_ms: u64,
    /// An engine silent for longer is shown as stale in `/v1/workers`.
    pub staleness_ms: u64,
    /// A connection that has not sent a complete request head within this is closed (slow
    /// or silent clients).
    pub header_read_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            scrape_interval_ms: 200,
            scrape_timeout_ms: 150,
            assignment_ttl_ms: 600_000,
            first_token_ttl_ms: 120_000,
            speculative_ttl_ms: 2_000,
            staleness_ms: 30_000,
            header_read_ms: 10_000,
        }
    }
}

/// Cost-model priors: where online calibration starts.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Priors {
    /// Prefill cost of one uncached prompt token.
    pub per_token_ms: f64,
    /// Fixed cost of one scheduler step (weights read, kernel launches, sampling).
    pub overhead_ms: f64,
    /// Cost of each running sequence in a step (its decode interleaved with prefill).
    pub decode_ms_per_running: f64,
    /// Prompt size assumed for waiting requests we did not route ourselves.
    pub default_request_tokens: u32,
    /// vLLM's `--max-num-batched-tokens`: tokens per scheduler step. vLLM's default for the
    /// OpenAI server is 2048 on GPUs under 70 GB, 8192 on H100/H200, 16384 from 160 GB up.
    pub max_num_batched_tokens: u32,
    /// Loading one token's KV from a CPU offloading tier into the GPU (vLLM's offloading
    /// connector): KV bytes per token / host-to-device bandwidth. 0.01 ms: ~250 KB per token
    /// (a 27B GQA model in FP8) over ~25 GB/s of PCIe 4.0 x16; 10x cheaper than the prefill
    /// prior, so an offloaded prefix is worth keeping but less than a GPU one.
    pub reload_ms_per_token: f64,
}

impl Default for Priors {
    fn default() -> Self {
        Priors {
            per_token_ms: 0.1,
            overhead_ms: 15.0,
            decode_ms_per_running: 0.5,
            default_request_tokens: 512,
            max_num_batched_tokens: 2048,
            reload_ms_per_token: 0.01,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// vLLM's `--block-size` for this model; every worker of the model must use it.
    pub block_size: Option<u32>,
    /// Directory with the model's `tokenizer.json` and `tokenizer_config.json` (chat
    /// template). Defaults to `tokenization.default_tokenizer_dir`. A missing or broken
    /// directory does not stop the service: the model's picks use the next tokenization path.
    pub tokenizer_dir: Option<PathBuf>,
    /// vLLM's `--max-model-len` for this model (prompt plus output of one sequence); default
    /// `tenancy.max_model_len`. A request without an output limit is reserved up to it.
    pub max_model_len: Option<u32>,
}

/// Tokenization of text and chat prompts, tried in order: the local tokenizer, the worker's
/// `/tokenize`, then approximate text-chunk keys.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Tokenization {
    /// Tokenizer of every model without its own `tokenizer_dir` (`--tokenizer-dir`,
    /// `KVROUTE_TOKENIZER_DIR`).
    pub default_tokenizer_dir: Option<PathBuf>,
    /// Bound of each model's piece cache (warm conversation turns encode only new text).
    pub cache_bytes: usize,
    /// Prompts up to this size are tokenized on the request's task; larger ones on tokio's
    /// blocking pool, so a cold long prompt never stalls the runtime.
    pub inline_max_bytes: usize,
    /// Ask a worker's vLLM `/tokenize` when the local tokenizer cannot help.
    pub worker_fallback: bool,
    /// Bound of one worker `/tokenize` call; it sits on the pick's critical path.
    pub worker_timeout_ms: u64,
    /// After a failed worker call, skip the worker path of that model for this long.
    pub worker_retry_ms: u64,
    /// Most bytes of not-yet-cached text one pick encodes; a longer prompt is keyed exactly
    /// up to the last message boundary within the budget, or up to a space inside the message
    /// or text that does not fit (32 KiB: ~8k tokens, ~11 ms cold on a shared 2-core VM;
    /// shared prefixes, history and text an earlier prompt repeated are cached pieces, in
    /// 2 KiB chunks inside long messages, and cost nothing). Where no such point is
    /// exact (no space within the budget, a tokenizer that cannot be cut at spaces) the pick
    /// routes on text chunks (`truncated`, `too_long`).
    pub max_encode_bytes: usize,
    /// Cache-missing bytes a pick encodes first (4 KiB, ~1k tokens, ~1 ms): routing needs a
    /// prompt's keys only until no worker holds them, so a prompt that has left every worker's
    /// cache by then is keyed exactly that far and the rest estimated; only one whose encoded
    /// blocks are all held somewhere is encoded on, up to `max_encode_bytes`.
    pub probe_bytes: usize,
    /// How long a pick waits for a local encoding before routing on text chunks; below the
    /// filter's pick timeout (50 ms by default) so the answer still arrives in time.
    pub deadline_ms: u64,
    /// Encodings on the blocking pool at once; more picks than this route on text chunks at
    /// once rather than queueing behind them.
    pub max_concurrent: usize,
}

impl Default for Tokenization {
    fn default() -> Self {
        Tokenization {
            default_tokenizer_dir: None,
            cache_bytes: 64 << 20,
            inline_max_bytes: 4096,
            worker_fallback: true,
            worker_timeout_ms: 25,
            worker_retry_ms: 1000,
            max_encode_bytes: 32 << 10,
            probe_bytes: 4 << 10,
            deadline_ms: 30,
            max_concurrent: 4,
        }
    }
}

/// One vLLM server. With data parallelism it runs `dp_ranks` engines, rank r publishing on
/// the configured event/replay ports + r.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// Required (a group's template leaves it out: the group derives it).
    #[serde(default)]
    pub id: String,
    /// Required (a file group's entries may name it instead of the template).
    #[serde(default)]
    pub model: String,
    /// `host:port` the proxy routes to (endpoint-override mode).
    #[serde(default)]
    pub endpoint: String,
    /// Labels pools select workers by (`[pools.NAME] labels`), e.g. `{ sensitivity = "restricted" }`.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Cluster name (cluster-header mode).
    #[serde(default)]
    pub cluster: String,
    /// ZMQ endpoint of rank 0's KV-event publisher, e.g. `tcp://10.0.0.5:5557`.
    #[serde(default)]
    pub events_endpoint: Option<String>,
    /// ZMQ endpoint of rank 0's replay socket.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    #[serde(default)]
    pub topic: String,
    /// e.g. `http://10.0.0.5:8000/metrics`; without it load comes from assignments only.
    #[serde(default)]
    pub metrics_url: Option<String>,
    /// Defaults to the model's block size.
    #[serde(default)]
    pub block_size: Option<u32>,
    #[serde(default = "one")]
    pub dp_ranks: u32,
    #[serde(default)]
    pub per_token_ms: Option<f64>,
    #[serde(default)]
    pub overhead_ms: Option<f64>,
    /// Defaults to `priors.max_num_batched_tokens`.
    #[serde(default)]
    pub max_num_batched_tokens: Option<u32>,
    /// Defaults to `priors.reload_ms_per_token` (the worker's CPU-to-GPU KV load cost).
    #[serde(default)]
    pub reload_ms_per_token: Option<f64>,
    /// LoRA adapters the worker serves (vLLM `--lora-modules NAME=PATH`). A request whose
    /// `model` names one is routed among these workers and matched against the blocks vLLM
    /// stored with that `lora_name`; it is tokenized with `model`'s tokenizer.
    #[serde(default)]
    pub lora_adapters: Vec<String>,
}

fn one() -> u32 {
    1
}

impl WorkerConfig {
    /// A worker with only the required fields set (tests, registration).
    pub fn new(id: &str, model: &str) -> Self {
        WorkerConfig {
            id: id.to_string(),
            model: model.to_string(),
            endpoint: String::new(),
            labels: Default::default(),
            cluster: String::new(),
            events_endpoint: None,
            replay_endpoint: None,
            topic: String::new(),
            metrics_url: None,
            block_size: None,
            dp_ranks: 1,
            per_token_ms: None,
            overhead_ms: None,
            max_num_batched_tokens: None,
            lora_adapters: Vec::new(),
            reload_ms_per_token: None,
        }
    }

    /// Whether a request for `model` (a base model or a LoRA adapter name) can go here.
    pub fn serves(&self, model: &str) -> bool {
        self.model == model || self.lora_adapters.iter().any(|a| a == model)
    }

    /// Rank `rank`'s endpoint: the port of `endpoint` plus `rank`, as vLLM assigns them.
    pub fn rank_endpoint(endpoint: &str, rank: u32) -> Option<String> {
        let (head, port) = endpoint.rsplit_once(':')?;
        let port: u32 = port.parse().ok()?;
        let port = u16::try_from(port + rank).ok()?;
        Some(format!("{head}:{port}"))
    }
}
