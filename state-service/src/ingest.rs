//! KV-event ingestion: one OS thread per engine subscribes to its vLLM ZMQ publisher, decodes
//! batches and applies them to the index.
//!
//! Why threads, not tasks: the `zmq` crate is blocking, and one thread per engine keeps a slow
//! or replaying engine from delaying the others; the work per batch is microseconds.
//!
//! Per message `[topic, seq (u64 BE), payload]` (vLLM's `ZmqEventPublisher` in
//! `vllm/distributed/kv_events.py`, 0.33.0):
//! - in order (or first seen): apply;
//! - forward jump: replay the missing range from the engine's replay endpoint (bounded by
//!   `replay_timeout`), then apply the live batch; without a replay endpoint, or if replay
//!   fails or comes back incomplete, the gap is counted as unrecovered and we carry on;
//! - backwards jump: the engine restarted, so its blocks are dropped (`clear_engine`) first;
//! - same seq again: skipped.
//!
//! Joining: ZMQ drops what a publisher sends before a new subscription reaches it, so a stream
//! still silent 1 s after subscribing is caught up from the replay buffer (from the next seq
//! expected, 0 on a first join). A state service started beside engines that are already
//! warm, and quiet, learns what they hold without waiting for their next batch.
//!
//! Warm start (`resume_from`, see `seq.rs`): after subscribing, replay from the mirror's seq
//! on; live batches up to the last replayed one are duplicates. If the replay brings nothing
//! the engine may have restarted, so the tracker resumes at the mirror's seq without a floor
//! and a lower live seq resets the engine as usual.
//!
//! Nothing the engine sends can stop the thread: malformed frames, undecodable batches and
//! bad events are counted in [`IngestStats`] and skipped. A batch whose data-parallel rank is
//! not the configured one is counted and still applied to this engine: the endpoint, not the
//! payload, says which engine published it (rank r publishes on port + r).

mod replay;
mod seq;
mod stats;
mod worker;

pub use stats::{EventKind, IngestStats, RejectKind};

use kvroute_kv::index::KvIndex;
use kvroute_kv::types::EngineSlot;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Everything one engine's ingest thread needs.
#[derive(Clone, Debug)]
pub struct IngestConfig {
    pub engine: EngineSlot,
    /// The engine's PUB endpoint as a connect address. A vLLM-style bind address
    /// (`tcp://*:5557`) is accepted and means this host (see [`connect_endpoint`]).
    pub endpoint: String,
    /// The engine's replay ROUTER endpoint, if it has one.
    pub replay_endpoint: Option<String>,
    /// ZMQ subscription topic; "" = everything. A non-empty topic must match exactly.
    pub topic: String,
    /// The engine's model: the key root for blocks stored without a LoRA.
    pub model: String,
    /// vLLM's `--block-size`; blocks of any other size are not indexed.
    pub block_size: u32,
    /// The data-parallel rank this endpoint belongs to.
    pub dp_rank: u32,
    /// Longest silence tolerated from the replay endpoint before the replay is abandoned.
    pub replay_timeout: Duration,
    /// Warm start: the index already holds this engine's blocks up to this seq (a mirror).
    /// Once subscribed, the thread replays from it, so batches missed since are applied
    /// before any new one arrives.
    pub resume_from: Option<u64>,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            engine: EngineSlot(0),
            endpoint: String::new(),
            replay_endpoint: None,
            topic: String::new(),
            model: String::new(),
            block_size: 16,
            dp_rank: 0,
            replay_timeout: Duration::from_secs(2),
            resume_from: None,
        }
    }
}

/// vLLM binds its PUB on a wildcard (`tcp://*:5557`, `tcp://[::]:5557`); a subscriber cannot
/// connect to a wildcard, so such an address is taken to mean this host (the engine runs
/// next to us: a single-host deployment or a test). Remote engines must be configured with a
/// concrete address. Other endpoints are returned unchanged.
pub fn connect_endpoint(endpoint: &str) -> String {
    endpoint.replacen("tcp://*:", "tcp://127.0.0.1:", 1).replacen("tcp://[::]:", "tcp://[::1]:", 1)
}

/// The running ingest thread of one engine. Dropping it stops and joins the thread.
pub struct IngestHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl IngestHandle {
    /// Asks the thread to stop and waits for it (at most about one poll interval).
    pub fn stop(mut self) {
        self.shutdown();
    }

    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            if t.join().is_err() {
                tracing::error!("ingest thread panicked");
            }
        }
    }
}

impl Drop for IngestHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One ZMQ context (and its I/O thread) for every engine's sockets.
fn zmq_context() -> &'static zmq::Context {
    static CTX: OnceLock<zmq::Context> = OnceLock::new();
    CTX.get_or_init(zmq::Context::new)
}

/// Starts `cfg.engine`'s ingest thread.
pub fn spawn_ingest(cfg: IngestConfig, index: Arc<dyn KvIndex>, stats: Arc<IngestStats>) -> IngestHandle {
    let stop = Arc::new(AtomicBool::new(false));
    let worker = worker::Worker::new(cfg, index, stats, Arc::clone(&stop), zmq_context().clone());
    let name = format!("kv-ingest-{}", worker.engine().0);
    let thread = match std::thread::Builder::new().name(name).spawn(move || worker.run()) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::error!(error = %e, "cannot spawn ingest thread");
            None
        }
    };
    IngestHandle { stop, thread }
}

#[cfg(test)]
mod tests;
