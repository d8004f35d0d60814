//! One simulated worker at runtime: the engine behind a mutex, one tokio task that steps
//! it in (scaled) real time, and the event publisher it feeds.
//!
//! The task sleeps until the end of each step before delivering that step's tokens, so a
//! client sees exactly the engine's timing. Between requests it parks on a `Notify`, so an
//! idle worker costs nothing.
//!
//! The frontend half of vLLM (`AsyncLLM` and its output processor) lives here too. The
//! engine requests answering one HTTP request (its `n` choices, each prompt of a batch) share
//! one [`TokenRx`]. Dropping it, or an [`AbortOnDrop`] taken from it, aborts every one of them
//! at once: that is what happens when axum drops a handler future or a response body because
//! the client disconnected, or when a background task is cancelled, as vLLM's
//! `with_cancellation` / `AsyncLLM.abort` do. The engine drops an aborted request after the
//! step in flight (its blocks freed, never scheduled again) and the outputs of that step are
//! discarded uncounted, as vLLM's output processor ignores outputs of aborted requests.
//! Output statistics (`vllm:prompt_tokens`, `vllm:generation_tokens`, latencies, successes)
//! are counted as tokens are delivered to a listening request, where vLLM counts them.

use crate::engine::{Engine, EngineConfig, EngineError, KvEvent, Medium, NewRequest, TokenOut};
use crate::events::{encode_batch, EventEncoding, PubCommand, PublisherHandle};
use crate::ids::{EngineHash, RequestId, WorkerId};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, Notify};

/// One token of one engine request in a group, tagged with the request's index in the group
/// (the response's choice index).
#[derive(Debug)]
pub struct Token {
    pub index: usize,
    pub out: TokenOut,
}

/// Where a group's engine requests deliver: tokens in engine order, each request ending with
/// a `finished` token. A rank restart takes its requests without a `finished` token; the
/// channel closes once no request is left. Dropping this aborts every request of the group
/// that has not finished.
pub struct TokenRx {
    // Declared before `rx`, so it drops first: the requests are unregistered (under the
    // worker's lock) before the channel closes, and a delivery never meets a closed channel.
    abort: AbortOnDrop,
    rx: mpsc::UnboundedReceiver<Token>,
}

impl TokenRx {
    pub async fn recv(&mut self) -> Option<Token> {
        self.rx.recv().await
    }

    /// Another guard on the same requests, for whatever else stands for the client (a response
    /// body): whichever is dropped first aborts them.
    pub fn abort_guard(&self) -> AbortOnDrop {
        AbortOnDrop(self.abort.0.clone())
    }
}

/// Aborts its engine requests when dropped; a request that already finished is left alone.
pub struct AbortOnDrop(Arc<Mutex<Vec<(Worker, RequestId)>>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for (worker, id) in self.0.lock().iter() {
            worker.abort_by_frontend(*id);
        }
    }
}

/// Builds a group: each [`Group::submit`] queues one engine request on a rank, delivering to
/// the group's channel. Dropped before [`Group::listen`] (a later request was refused), it
/// aborts the ones already queued.
pub struct Group {
    tx: mpsc::UnboundedSender<Token>,
    rx: TokenRx,
}

impl Default for Group {
    fn default() -> Self {
        Group::new()
    }
}

impl Group {
    pub fn new() -> Group {
        let (tx, rx) = mpsc::unbounded_channel();
        Group { tx, rx: TokenRx { abort: AbortOnDrop(Arc::default()), rx } }
    }

    /// Queues `req` on `rank` as the group's request `index`; validation errors come back
    /// synchronously.
    pub fn submit(&mut self, rank: &Worker, index: usize, req: NewRequest) -> Result<RequestId, EngineError> {
        let id = rank.submit(req, index, self.tx.clone())?;
        self.rx.abort.0.lock().push((rank.clone(), id));
        Ok(id)
    }

    /// The group's tokens; the channel closes once every request finished or vanished.
    pub fn listen(self) -> TokenRx {
        self.rx
    }
}

pub struct WorkerInner {
    pub engine: Engine,
    /// The requests the frontend listens for: their group's channel and index in it.
    senders: HashMap<RequestId, (usize, mpsc::UnboundedSender<Token>)>,
    pub restarts: u64,
}

impl WorkerInner {
    fn new(engine: Engine) -> WorkerInner {
        WorkerInner { engine, senders: HashMap::new(), restarts: 0 }
    }

    /// vLLM's `AsyncLLM.abort`: the frontend forgets the request at once (outputs still in
    /// flight are ignored) and the engine drops it. A no-op for a request whose last token was
    /// delivered, or that a restart took.
    fn abort_by_frontend(&mut self, id: RequestId) {
        if self.senders.remove(&id).is_some() {
            self.engine.abort_by_frontend(id);
        }
    }

    /// A step's tokens reach the frontend: each is counted and delivered if its request is
    /// still listened for, and ignored otherwise (aborted while the step ran).
    fn deliver(&mut self, tokens: Vec<TokenOut>) {
        for t in tokens {
            let id = t.request;
            let Some((index, tx)) = self.senders.get(&id) else { continue };
            if tx.is_closed() {
                // Not reached while `TokenRx` unregisters first; kept so a leak cannot happen.
                self.abort_by_frontend(id);
                continue;
            }
            let (index, done) = (*index, t.finished.is_some());
            self.engine.record_output(&t);
            let _ = tx.send(Token { index, out: t });
            if done {
                self.senders.remove(&id);
            }
        }
    }
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
            inner: Arc::new(Mutex::new(WorkerInner::new(Engine::new(spec.engine)))),
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

    /// Queues a request delivering to `tx` as `index` (see [`Group`]); validation errors come
    /// back synchronously.
    fn submit(&self, mut req: NewRequest, index: usize, tx: mpsc::UnboundedSender<Token>) -> Result<RequestId, EngineError> {
        req.id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let id = req.id;
        {
            let mut inner = self.inner.lock();
            let now = self.now();
            inner.engine.add_request(req, now)?;
            inner.senders.insert(id, (index, tx));
        }
        self.notify.notify_one();
        Ok(id)
    }

    /// The frontend gave up on request `id` (client gone, cancel); see
    /// [`WorkerInner::abort_by_frontend`].
    pub fn abort_by_frontend(&self, id: RequestId) {
        self.inner.lock().abort_by_frontend(id);
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

    /// A misbehaving engine: its event stream announces `blocks` distinct one-block prefixes
    /// it never holds, far past the capacity its `/metrics` reports, in batches of 1,000
    /// paced so the publisher keeps up. The engine itself is untouched. `seed` tells one
    /// flood's blocks from another's.
    pub async fn flood(&self, blocks: u64, seed: u64) {
        let Some(p) = self.publisher.clone() else { return };
        let block_size = self.inner.lock().engine.config().block_size as u32;
        let mix = |mut z: u64| {
            // splitmix64: distinct blocks get distinct hashes and token contents.
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let mut sent = 0;
        while sent < blocks {
            let n = (blocks - sent).min(1000);
            let events: Vec<KvEvent> = (sent..sent + n)
                .map(|b| {
                    let h = mix(seed ^ mix(b));
                    KvEvent::BlockStored {
                        block_hashes: vec![EngineHash(h)],
                        parent_block_hash: None,
                        token_ids: (0..u64::from(block_size)).map(|t| 1 + (mix(h ^ t) % 150_000) as u32).collect(),
                        block_size,
                        extra_keys: Some(vec![None]),
                        medium: Medium::Gpu,
                        kv_cache_spec_kind: None,
                    }
                })
                .collect();
            let ts = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
            p.send(PubCommand::Batch(encode_batch(ts, &events, self.dp_rank, self.encoding)));
            sent += n;
            if sent % 20_000 == 0 {
                p.flush().await;
            }
        }
        p.flush().await;
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
        self.inner.lock().deliver(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: u64, prompt_len: u32, max_tokens: usize) -> NewRequest {
        NewRequest { id: RequestId(id), prompt: (0..prompt_len).collect(), max_tokens, ignore_eos: true, cache_salt: None, output: Vec::new() }
    }

    /// A worker's engine and frontend with request 1 queued and listened for.
    fn listening(cfg: EngineConfig, prompt_len: u32, max_tokens: usize) -> (WorkerInner, mpsc::UnboundedReceiver<Token>) {
        let mut w = WorkerInner::new(Engine::new(cfg));
        let (tx, rx) = mpsc::unbounded_channel();
        w.engine.add_request(request(1, prompt_len, max_tokens), 0.0).unwrap();
        w.senders.insert(RequestId(1), (0, tx));
        (w, rx)
    }

    #[test]
    fn an_abort_drops_the_step_in_flight_uncounted_and_frees_the_blocks() {
        let cfg = EngineConfig::default();
        let all_free = cfg.num_gpu_blocks - 1;
        let (mut w, mut rx) = listening(cfg, 100, 10);
        let out = w.engine.step(0.0);
        w.deliver(out.tokens);
        let st = w.engine.stats();
        assert_eq!((st.prompt_tokens, st.generation_tokens), (100, 1), "the first token counts the prompt");
        assert!(rx.try_recv().is_ok());
        // The next step is computed (in flight) when the client goes away.
        let out = w.engine.step(1.0);
        assert_eq!(out.tokens.len(), 1);
        w.abort_by_frontend(RequestId(1));
        assert_eq!((w.engine.num_running(), w.engine.num_free_blocks()), (0, all_free), "dropped, blocks freed");
        w.deliver(out.tokens);
        let st = w.engine.stats();
        assert_eq!((st.generation_tokens, st.requests_finished, st.requests_aborted), (1, 0, 1), "its output is ignored");
        assert!(rx.try_recv().is_err());
        assert!(!w.engine.has_work(), "never scheduled again");
        w.abort_by_frontend(RequestId(1));
        assert_eq!(w.engine.stats().requests_aborted, 1, "a second guard finds nothing to abort");
    }

    #[test]
    fn a_request_aborted_before_its_first_token_counts_no_prompt_tokens() {
        // Chunked prefill: the first step computes 64 of 200 prompt tokens, no output yet.
        let cfg = EngineConfig { max_num_batched_tokens: 64, ..EngineConfig::default() };
        let (mut w, _rx) = listening(cfg, 200, 10);
        let out = w.engine.step(0.0);
        assert!(out.tokens.is_empty() && out.prefill_tokens == 64);
        w.abort_by_frontend(RequestId(1));
        let st = w.engine.stats();
        assert_eq!((st.prompt_tokens, st.generation_tokens, st.requests_aborted), (0, 0, 1), "vLLM counts the prompt at the first output");
        assert!(st.prefix_cache_queries > 0, "the scheduler's counters did count the admission");
    }

    #[test]
    fn a_finished_request_is_not_aborted() {
        let (mut w, mut rx) = listening(EngineConfig::default(), 20, 1);
        let out = w.engine.step(0.0);
        w.deliver(out.tokens);
        assert!(rx.try_recv().is_ok_and(|t| t.out.finished.is_some()));
        w.abort_by_frontend(RequestId(1));
        let st = w.engine.stats();
        assert_eq!((st.requests_finished, st.requests_aborted, st.generation_tokens), (1, 0, 1));
    }

    fn spawn(cfg: EngineConfig) -> Worker {
        Worker::spawn(WorkerSpec { id: WorkerId(0), model: "m".into(), dp_rank: 0, engine: cfg, publisher: None, encoding: EventEncoding::Map })
    }

    #[tokio::test]
    async fn dropping_the_receiver_aborts_every_request_of_the_group_at_once() {
        let w = spawn(EngineConfig::default());
        let mut group = Group::new();
        for index in 0..3 {
            group.submit(&w, index, request(0, 300, 1000)).unwrap();
        }
        let rx = group.listen();
        let body = rx.abort_guard();
        drop(rx);
        let inner = w.inner.lock();
        assert_eq!((inner.engine.num_running() + inner.engine.num_waiting(), inner.engine.stats().requests_aborted), (0, 3));
        assert_eq!(inner.engine.num_free_blocks(), EngineConfig::default().num_gpu_blocks - 1);
        drop(inner);
        drop(body);
        assert_eq!(w.inner.lock().engine.stats().requests_aborted, 3, "the second guard is a no-op");
    }

    #[tokio::test]
    async fn a_group_refused_halfway_aborts_what_it_queued() {
        let w = spawn(EngineConfig::default());
        let mut group = Group::new();
        group.submit(&w, 0, request(0, 50, 10)).unwrap();
        assert_eq!(group.submit(&w, 1, request(0, 0, 10)), Err(EngineError::EmptyPrompt));
        drop(group);
        let inner = w.inner.lock();
        assert_eq!((inner.engine.num_running() + inner.engine.num_waiting(), inner.engine.stats().requests_aborted), (0, 1));
    }
}
