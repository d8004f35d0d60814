//! Starting N workers in one process: port layout, publishers, HTTP listeners.
//!
//! Layout: worker i serves HTTP on `http_port + i`. With `dp_size` ranks (default 1) its
//! ZMQ ports start at `base = zmq_port + 2 * dp_size * i`: rank r publishes KV events on
//! `tcp://host:(base + r)` and answers replay requests on `base + dp_size + r`. So each
//! worker's configured ports are rank 0's (`base`, `base + dp_size`) and rank r's are those
//! plus r, vLLM's rule, with no overlap between ranks or workers; with one rank this is the
//! original layout (`zmq_port + 2i`, `zmq_port + 2i + 1`). A port of 0 asks the OS for a
//! free one per socket (tests); the real ports are in the layout, and then the "+ r" rule
//! does not hold.

use crate::answer::Answerer;
use crate::chat::ChatTokenizer;
use crate::engine::EngineConfig;
use crate::events::{spawn_publisher, EventEncoding, PubCommand, PublisherConfig, PublisherError, PublisherHandle};
use crate::dp::DpWorker;
use crate::http::{app, AppState, Faults, ResponseStore, RESPONSES_CAPACITY};
use crate::ids::WorkerId;
use crate::worker::{Worker, WorkerSpec};
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub workers: usize,
    /// The first worker's id (`x-sim-worker`, layout, logs); worker i is `first_worker_id + i`.
    /// Lets one process per worker stand for one fleet (kill one, the others stay).
    pub first_worker_id: u32,
    /// Data-parallel ranks per worker (vLLM's `--data-parallel-size`), at least 1.
    pub dp_size: usize,
    pub host: String,
    pub http_port: u16,
    pub zmq_port: u16,
    pub model: String,
    pub engine: EngineConfig,
    /// Per-worker engine overrides (index -> config); others use `engine`.
    pub overrides: Vec<(usize, EngineConfig)>,
    pub topic: String,
    pub buffer_steps: usize,
    pub encoding: EventEncoding,
    pub events: bool,
    pub drop_fraction: f64,
    /// Whether `store: true` Responses are kept (vLLM: `VLLM_ENABLE_RESPONSES_API_STORE=1`).
    pub responses_store: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            workers: 1,
            first_worker_id: 0,
            dp_size: 1,
            host: "127.0.0.1".into(),
            http_port: 8100,
            zmq_port: 5600,
            model: "kvroute/sim-27b-fp8".into(),
            engine: EngineConfig::default(),
            overrides: Vec::new(),
            topic: String::new(),
            buffer_steps: 10_000,
            encoding: EventEncoding::Map,
            events: true,
            drop_fraction: 0.0,
            responses_store: true,
        }
    }
}

/// Where one worker listens. `kv_events` / `kv_replay` are rank 0's, the endpoints a
/// subscriber configures (adding r for rank r); `ranks` lists every rank's actual ones.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerLayout {
    pub worker: u32,
    pub http: String,
    pub kv_events: Option<String>,
    pub kv_replay: Option<String>,
    pub dp_size: usize,
    pub ranks: Vec<RankLayout>,
    pub block_size: usize,
    /// Per rank (each rank has its own KV cache of this size).
    pub num_gpu_blocks: usize,
    pub model: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct RankLayout {
    pub dp_rank: u32,
    pub kv_events: Option<String>,
    pub kv_replay: Option<String>,
}

pub struct Cluster {
    pub workers: Vec<DpWorker>,
    pub layout: Vec<WorkerLayout>,
    servers: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot bind {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error(transparent)]
    Publisher(#[from] PublisherError),
    #[error("port arithmetic overflows u16 for worker {0}")]
    Port(usize),
}

fn port(base: u16, offset: usize, i: usize) -> Result<u16, ClusterError> {
    if base == 0 {
        return Ok(0);
    }
    u16::try_from(base as usize + offset).map_err(|_| ClusterError::Port(i))
}

/// Resolve `tcp://host:0` to the port libzmq actually bound.
fn zmq_addr(host: &str, p: u16) -> String {
    format!("tcp://{host}:{}", if p == 0 { "*".to_string() } else { p.to_string() })
}

/// Offsets from `zmq_port` of worker i's rank r: `(events, replay)`. See the module docs.
pub fn zmq_offsets(dp_size: usize, worker: usize, rank: usize) -> (usize, usize) {
    let base = 2 * dp_size * worker;
    (base + rank, base + dp_size + rank)
}

/// One rank's publisher and the endpoints it bound.
type Publisher = (Option<PublisherHandle>, RankLayout);

fn start_publisher(ctx: &zmq::Context, cfg: &ClusterConfig, i: usize, rank: usize) -> Result<Publisher, ClusterError> {
    let none = RankLayout { dp_rank: rank as u32, kv_events: None, kv_replay: None };
    if !cfg.events {
        return Ok((None, none));
    }
    let (events, replay) = zmq_offsets(cfg.dp_size, i, rank);
    let ep = zmq_addr(&cfg.host, port(cfg.zmq_port, events, i)?);
    let rp = zmq_addr(&cfg.host, port(cfg.zmq_port, replay, i)?);
    let (p, ep, rp) = spawn_publisher(
        ctx,
        PublisherConfig { endpoint: ep, replay_endpoint: Some(rp), topic: cfg.topic.clone(), buffer_steps: cfg.buffer_steps, hwm: 100_000 },
    )?;
    if cfg.drop_fraction > 0.0 {
        p.send(PubCommand::SetDropFraction(cfg.drop_fraction));
    }
    Ok((Some(p), RankLayout { kv_events: Some(ep), kv_replay: rp, ..none }))
}

impl Cluster {
    pub async fn start(cfg: ClusterConfig, tokenizer: Arc<ChatTokenizer>) -> Result<Cluster, ClusterError> {
        let cfg = ClusterConfig { dp_size: cfg.dp_size.max(1), ..cfg };
        let ctx = zmq::Context::new();
        let mut cluster = Cluster { workers: Vec::new(), layout: Vec::new(), servers: Vec::new() };
        // One answerer for all workers: they share the tokenizer, so the same filler words.
        let answers = Arc::new(Answerer::new(tokenizer.clone()));
        for i in 0..cfg.workers {
            let engine = cfg.overrides.iter().find(|(w, _)| *w == i).map(|(_, e)| e.clone()).unwrap_or(cfg.engine.clone());
            let (mut workers, mut ranks) = (Vec::new(), Vec::new());
            for r in 0..cfg.dp_size {
                let (publisher, rank) = start_publisher(&ctx, &cfg, i, r)?;
                workers.push(Worker::spawn(WorkerSpec {
                    id: WorkerId(cfg.first_worker_id + i as u32),
                    model: cfg.model.clone(),
                    dp_rank: r as u32,
                    engine: engine.clone(),
                    publisher,
                    encoding: cfg.encoding,
                }));
                ranks.push(rank);
            }
            let addr = format!("{}:{}", cfg.host, port(cfg.http_port, i, i)?);
            let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|source| ClusterError::Bind { addr: addr.clone(), source })?;
            let http = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);
            let layout = WorkerLayout {
                worker: cfg.first_worker_id + i as u32,
                http: format!("http://{http}"),
                kv_events: ranks[0].kv_events.clone(),
                kv_replay: ranks[0].kv_replay.clone(),
                dp_size: cfg.dp_size,
                ranks,
                block_size: engine.block_size,
                num_gpu_blocks: engine.num_gpu_blocks,
                model: cfg.model.clone(),
            };
            let worker = DpWorker::new(workers);
            let faults = Faults { drop_fraction: cfg.drop_fraction, slowdown: 1.0, ..Faults::default() };
            let state = AppState {
                worker: worker.clone(),
                tokenizer: tokenizer.clone(),
                answers: answers.clone(),
                faults: Arc::new(Mutex::new(vec![faults; cfg.dp_size])),
                layout: Arc::new(serde_json::to_value(&layout).unwrap_or_default()),
                responses: Arc::new(ResponseStore::new(cfg.responses_store, RESPONSES_CAPACITY)),
            };
            let router = app(state);
            cluster.servers.push(tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, router).await {
                    tracing::error!(error = %e, "http server stopped");
                }
            }));
            cluster.workers.push(worker);
            cluster.layout.push(layout);
        }
        Ok(cluster)
    }

    /// Wait until every HTTP server ends (they run until the process stops).
    pub async fn wait(self) {
        for s in self.servers {
            let _ = s.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::zmq_offsets;
    use std::collections::BTreeSet;

    #[test]
    fn one_rank_keeps_the_original_layout() {
        for i in 0..8 {
            assert_eq!(zmq_offsets(1, i, 0), (2 * i, 2 * i + 1));
        }
    }

    #[test]
    fn ranks_are_the_configured_ports_plus_r_and_never_collide() {
        for dp in 1..=4 {
            let mut seen = BTreeSet::new();
            for i in 0..5 {
                let (events0, replay0) = zmq_offsets(dp, i, 0);
                for r in 0..dp {
                    let (e, p) = zmq_offsets(dp, i, r);
                    assert_eq!((e, p), (events0 + r, replay0 + r), "vLLM's rule: rank r = port + r");
                    assert!(seen.insert(e) && seen.insert(p), "dp {dp} worker {i} rank {r} collides");
                }
            }
            assert_eq!(seen.len(), 5 * 2 * dp, "dense: 2 * dp_size ports per worker");
            assert_eq!(seen.last(), Some(&(5 * 2 * dp - 1)));
        }
    }
}
