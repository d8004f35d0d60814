//! One simulated worker at runtime: the engine behind a mutex, one tokio task that steps
//! it in (scaled) real time, and the event publisher it feeds.
//!
//! The task sleeps until the end of each step before delivering that step's tokens, so a
//! client sees exactly the engine's timing. Between requests it parks on a `Notify`, so an
//! idle worker costs nothing. A client that disconnects is noticed when its next token
//! cannot be delivered, and the request is aborted (its blocks freed) like vLLM does.

use crate::engine::{Engine, EngineConfig, EngineError, KvEvent, NewRequest, TokenOut};
use crate::events::{encode_batch, EventEncoding, PubCommand, PublisherHandle};
use crate::ids::{RequestId, WorkerId};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, Notify};

/// What a request's stream receives: tokens, then either a `finished` token or a drop of
/// the channel (engine restarted).
pub type TokenRx = mpsc::UnboundedReceiver<TokenOut>;

pub struct WorkerInner {
    pub engine: Engine,
    senders: HashMap<RequestId, mpsc::UnboundedSender<TokenOut>>,
    pub restarts: u64,
}

/// Cheap-to-clone handle shared by the HTTP handlers and the engine task.
#[derive(Clone)]
pub struct Worker {
    pub id: WorkerId,
    pub model: Arc<str>,
    pub dp_rank: u32,
    pub inner: Arc<Mutex<WorkerInner>>,
    notify: Arc<Notify>,
    next_id: Arc<AtomicU64>,
    started: Instant,
    publisher: Option<PublisherHandle>,
    encoding: EventEncoding,
}

pub struct WorkerSpec {
    pub id: WorkerId,
    pub model: String,
    pub dp_rank: u32,
    pub engine: EngineConfig,
    pub publisher: Option<PublisherHandle>,
    pub encoding: EventEncoding,
}

impl Worker {
    /// Build the worker and spawn its engine task on the current tokio runtime.
    pub fn spawn(spec: WorkerSpec) -> Worker {
        let w = Worker {
            id: spec.id,
            model: spec.model.into(),
            dp_rank: spec.dp_rank,
            inner: Arc::new(Mutex::new(WorkerInner {
                engine: Engine::new(spec.engine),
                senders: HashMap::new(),
                restarts: 0,
            })),
            notify: Arc::new(Notify::new()),
            next_id: Arc::new(AtomicU64::new(1)),
            started: Instant::now(),
            publisher: spec.publisher,
            encoding: spec.encoding,
        };
        tokio::spawn(w.clone().run());
        w
    }

    pub fn publisher(&self) -> Option<&PublisherHandle> {
        self.publisher.as_ref()
    }

    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Queue a request; validation errors come back synchronously.
    pub fn submit(&self, mut req: NewRequest) -> Result<(RequestId, TokenRx), EngineError> {
        req.id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let id = req.id;
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut inner = self.inner.lock();
            let now = self.now();
            inner.engine.add_request(req, now)?;
            inner.senders.insert(id, tx);
        }
        self.notify.notify_one();
        Ok((id, rx))
    }

    /// Simulated engine restart: requests in flight fail, the cache empties, event
    /// sequence numbers restart at 0 and the replay buffer is cleared.
    pub fn restart(&self) {
        let mut inner = self.inner.lock();
        let cfg = inner.engine.config().clone();
        let slowdown = inner.engine.slowdown();
        inner.engine = Engine::new(cfg);
        inner.engine.set_slowdown(slowdown);
        inner.senders.clear();
        inner.restarts += 1;
        if let Some(p) = &self.publisher {
            p.send(PubCommand::Restart);
        }
    }

    /// vLLM's `/reset_prefix_cache`; publishes `AllBlocksCleared` at once on success.
    /// `reset_external` also empties the CPU offload tier (`?reset_external=true`).
    pub fn reset_prefix_cache(&self, reset_external: bool) -> bool {
        let mut inner = self.inner.lock();
        let ok = inner.engine.reset_prefix_cache(reset_external);
        let events = inner.engine.take_pending_events();
        drop(inner);
        self.publish(&events);
        ok
    }

    fn publish(&self, events: &[KvEvent]) {
        if events.is_empty() {
            return;
        }
        if let Some(p) = &self.publisher {
            let ts = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
            p.send(PubCommand::Batch(encode_batch(ts, events, self.dp_rank, self.encoding)));
        }
    }

    async fn run(self) {
        loop {
            let notified = self.notify.notified();
            let step = {
                let mut inner = self.inner.lock();
                if inner.engine.has_work() {
                    Some(inner.engine.step(self.now()))
                } else {
                    None
                }
            };
            let Some(out) = step else {
                notified.await;
                continue;
            };
            let step_start = Instant::now();
            self.publish(&out.events);
            if out.duration_s > 0.0 {
                let end = step_start + std::time::Duration::from_secs_f64(out.duration_s);
                tokio::time::sleep_until(end.into()).await;
            } else {
                // Nothing schedulable this step (should not persist); do not spin.
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            self.deliver(out.tokens);
        }
    }

    fn deliver(&self, tokens: Vec<TokenOut>) {
        let mut inner = self.inner.lock();
        for t in tokens {
            let id = t.request;
            let done = t.finished.is_some();
            let gone = match inner.senders.get(&id) {
                Some(tx) => tx.send(t).is_err(),
                None => true,
            };
            if done || gone {
                inner.senders.remove(&id);
            }
            if gone && !done {
                inner.engine.abort(id);
            }
        }
    }
}
