//! Starting N workers in one process: port layout, publishers, HTTP listeners.
//!
//! Layout: worker i serves HTTP on `http_port + i`, publishes KV events on
//! `tcp://host:(zmq_port + 2i)` and answers replay requests on `zmq_port + 2i + 1`.
//! A port of 0 asks the OS for a free one (tests); the real ports are in the layout.

use crate::chat::ChatTokenizer;
use crate::engine::EngineConfig;
use crate::events::{spawn_publisher, EventEncoding, PubCommand, PublisherConfig, PublisherError};
use crate::http::{app, AppState, Faults};
use crate::ids::WorkerId;
use crate::worker::{Worker, WorkerSpec};
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub workers: usize,
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
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            workers: 1,
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
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct WorkerLayout {
    pub worker: u32,
    pub http: String,
    pub kv_events: Option<String>,
    pub kv_replay: Option<String>,
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    pub model: String,
}

pub struct Cluster {
    pub workers: Vec<Worker>,
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

impl Cluster {
    pub async fn start(cfg: ClusterConfig, tokenizer: Arc<ChatTokenizer>) -> Result<Cluster, ClusterError> {
        let ctx = zmq::Context::new();
        let mut cluster = Cluster { workers: Vec::new(), layout: Vec::new(), servers: Vec::new() };
        for i in 0..cfg.workers {
            let engine = cfg.overrides.iter().find(|(w, _)| *w == i).map(|(_, e)| e.clone()).unwrap_or(cfg.engine.clone());
            let (publisher, kv_events, kv_replay) = if cfg.events {
                let ep = zmq_addr(&cfg.host, port(cfg.zmq_port, 2 * i, i)?);
                let rp = zmq_addr(&cfg.host, port(cfg.zmq_port, 2 * i + 1, i)?);
                let (p, ep, rp) = spawn_publisher(
                    &ctx,
                    PublisherConfig { endpoint: ep, replay_endpoint: Some(rp), topic: cfg.topic.clone(), buffer_steps: cfg.buffer_steps, hwm: 100_000 },
                )?;
                if cfg.drop_fraction > 0.0 {
                    p.send(PubCommand::SetDropFraction(cfg.drop_fraction));
                }
                (Some(p), Some(ep), rp)
            } else {
                (None, None, None)
            };
            let addr = format!("{}:{}", cfg.host, port(cfg.http_port, i, i)?);
            let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|source| ClusterError::Bind { addr: addr.clone(), source })?;
            let http = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);
            let layout = WorkerLayout {
                worker: i as u32,
                http: format!("http://{http}"),
                kv_events,
                kv_replay,
                block_size: engine.block_size,
                num_gpu_blocks: engine.num_gpu_blocks,
                model: cfg.model.clone(),
            };
            let worker = Worker::spawn(WorkerSpec {
                id: WorkerId(i as u32),
                model: cfg.model.clone(),
                dp_rank: 0,
                engine,
                publisher,
                encoding: cfg.encoding,
            });
            let state = AppState {
                worker: worker.clone(),
                tokenizer: tokenizer.clone(),
                faults: Arc::new(Mutex::new(Faults { drop_fraction: cfg.drop_fraction, stop_publishing: false, slowdown: 1.0 })),
                layout: Arc::new(serde_json::to_value(&layout).unwrap_or_default()),
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
