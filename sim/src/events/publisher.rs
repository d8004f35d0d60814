//! The ZMQ side of one worker: a PUB socket for live batches and a ROUTER socket for
//! replay, both owned by one dedicated std thread (libzmq sockets are blocking and not
//! thread-safe), fed by a channel from the async engine task.
//!
//! Mirrors vLLM's `ZmqEventPublisher`: frames `[topic, seq u64 BE, payload]`; sequence
//! numbers start at 0; the last `buffer_steps` batches are kept; a DEALER sending
//! `[b"", start_seq]` gets `[b"", topic, seq, payload]` per buffered batch with
//! `seq >= start_seq`, then `[b"", b"", 0xFFFF_FFFF_FFFF_FFFF, b""]`.
//! Fault knobs live here too: dropped batches still take a sequence number and stay in the
//! replay buffer (subscribers see a gap they can repair); a stopped publisher neither sends,
//! numbers nor buffers anything; a restart resets the sequence and clears the buffer.

use rand::Rng;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

const END_SEQ: [u8; 8] = [0xff; 8];

#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// e.g. `tcp://127.0.0.1:5600` (bound).
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub topic: String,
    pub buffer_steps: usize,
    pub hwm: i32,
}

#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    #[error("zmq error on {endpoint}: {source}")]
    Zmq { endpoint: String, source: zmq::Error },
    #[error("publisher thread failed to start")]
    Thread,
}

#[derive(Debug)]
pub enum PubCommand {
    /// An encoded batch payload.
    Batch(Vec<u8>),
    /// Engine restart: sequence back to 0, replay buffer cleared.
    Restart,
    SetDropFraction(f64),
    SetStopped(bool),
    /// Answered once every earlier command has been handled: lets `/sim/state` report a
    /// sequence number that matches the engine state it reports (a settle point for tests).
    Flush(tokio::sync::oneshot::Sender<()>),
    Shutdown,
}

/// Counters readable from the HTTP side.
#[derive(Debug, Default)]
pub struct PublisherStats {
    /// Next sequence number to be assigned.
    pub next_seq: AtomicU64,
    pub sent: AtomicU64,
    pub dropped: AtomicU64,
    pub suppressed: AtomicU64,
    pub replays: AtomicU64,
}

#[derive(Clone, Debug)]
pub struct PublisherHandle {
    tx: mpsc::Sender<PubCommand>,
    pub stats: Arc<PublisherStats>,
}

impl PublisherHandle {
    /// Wait until the publisher has handled everything queued before this call.
    pub async fn flush(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(PubCommand::Flush(tx));
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), rx).await;
    }

    /// Queue a command; a dead publisher thread is not the request's problem.
    pub fn send(&self, cmd: PubCommand) {
        if self.tx.send(cmd).is_err() {
            tracing::warn!("kv event publisher thread is gone");
        }
    }
}

struct State {
    cfg: PublisherConfig,
    pub_sock: zmq::Socket,
    replay: Option<zmq::Socket>,
    buffer: VecDeque<(u64, Vec<u8>)>,
    drop_fraction: f64,
    stopped: bool,
    stats: Arc<PublisherStats>,
}

fn zerr(endpoint: &str) -> impl FnOnce(zmq::Error) -> PublisherError + '_ {
    move |source| PublisherError::Zmq { endpoint: endpoint.to_string(), source }
}

/// Bind the sockets and start the publisher thread. Binding happens before returning so
/// port clashes surface as errors here. Returns the handle and the endpoints actually bound
/// (`tcp://host:*` picks a free port).
pub fn spawn_publisher(
    ctx: &zmq::Context,
    cfg: PublisherConfig,
) -> Result<(PublisherHandle, String, Option<String>), PublisherError> {
    let pub_sock = ctx.socket(zmq::PUB).map_err(zerr(&cfg.endpoint))?;
    pub_sock.set_sndhwm(cfg.hwm).map_err(zerr(&cfg.endpoint))?;
    pub_sock.set_linger(0).map_err(zerr(&cfg.endpoint))?;
    pub_sock.bind(&cfg.endpoint).map_err(zerr(&cfg.endpoint))?;
    let replay = match &cfg.replay_endpoint {
        Some(ep) => {
            let s = ctx.socket(zmq::ROUTER).map_err(zerr(ep))?;
            s.set_sndhwm(2 * (cfg.buffer_steps as i32 + 1)).map_err(zerr(ep))?;
            s.set_linger(0).map_err(zerr(ep))?;
            s.bind(ep).map_err(zerr(ep))?;
            Some(s)
        }
        None => None,
    };
    let bound = |s: &zmq::Socket, ep: &str| -> String {
        match s.get_last_endpoint() {
            Ok(Ok(e)) => e,
            _ => ep.to_string(),
        }
    };
    let pub_ep = bound(&pub_sock, &cfg.endpoint);
    let replay_ep = replay.as_ref().zip(cfg.replay_endpoint.as_deref()).map(|(s, ep)| bound(s, ep));
    let stats = Arc::new(PublisherStats::default());
    let (tx, rx) = mpsc::channel();
    let state = State {
        cfg,
        pub_sock,
        replay,
        buffer: VecDeque::new(),
        drop_fraction: 0.0,
        stopped: false,
        stats: stats.clone(),
    };
    std::thread::Builder::new()
        .name("kv-event-pub".into())
        .spawn(move || run(state, rx))
        .map_err(|_| PublisherError::Thread)?;
    Ok((PublisherHandle { tx, stats }, pub_ep, replay_ep))
}

fn run(mut st: State, rx: mpsc::Receiver<PubCommand>) {
    loop {
        st.service_replay();
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(PubCommand::Shutdown) | Err(RecvTimeoutError::Disconnected) => return,
            Ok(cmd) => st.handle(cmd),
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

impl State {
    fn handle(&mut self, cmd: PubCommand) {
        match cmd {
            PubCommand::Batch(payload) => self.publish(payload),
            PubCommand::Restart => {
                self.stats.next_seq.store(0, Ordering::SeqCst);
                self.buffer.clear();
            }
            PubCommand::SetDropFraction(f) => self.drop_fraction = f.clamp(0.0, 1.0),
            PubCommand::SetStopped(s) => self.stopped = s,
            PubCommand::Flush(done) => {
                let _ = done.send(());
            }
            PubCommand::Shutdown => {}
        }
    }

    fn publish(&mut self, payload: Vec<u8>) {
        if self.stopped {
            self.stats.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let seq = self.stats.next_seq.fetch_add(1, Ordering::SeqCst);
        let drop = self.drop_fraction > 0.0 && rand::thread_rng().gen::<f64>() < self.drop_fraction;
        if drop {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            let frames: [&[u8]; 3] = [self.cfg.topic.as_bytes(), &seq.to_be_bytes(), &payload];
            match self.pub_sock.send_multipart(frames, 0) {
                Ok(()) => {
                    self.stats.sent.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => tracing::warn!(error = %e, "kv event publish failed"),
            }
        }
        self.buffer.push_back((seq, payload));
        while self.buffer.len() > self.cfg.buffer_steps {
            self.buffer.pop_front();
        }
    }

    fn service_replay(&mut self) {
        let Some(sock) = &self.replay else { return };
        while let Ok(frames) = sock.recv_multipart(zmq::DONTWAIT) {
            if frames.len() != 3 || frames[2].len() != 8 {
                tracing::warn!(frames = frames.len(), "invalid replay request");
                continue;
            }
            self.stats.replays.fetch_add(1, Ordering::Relaxed);
            let client = &frames[0];
            let mut b = [0u8; 8];
            b.copy_from_slice(&frames[2]);
            let start = u64::from_be_bytes(b);
            let topic = self.cfg.topic.as_bytes();
            for (seq, payload) in self.buffer.iter().filter(|(s, _)| *s >= start) {
                let msg: [&[u8]; 5] = [client, b"", topic, &seq.to_be_bytes(), payload];
                if let Err(e) = sock.send_multipart(msg, 0) {
                    tracing::warn!(error = %e, "replay send failed");
                    return;
                }
            }
            let end: [&[u8]; 5] = [client, b"", b"", &END_SEQ, b""];
            let _ = sock.send_multipart(end, 0);
        }
    }
}
