//! Fetching missed batches from vLLM's replay socket (a ZMQ ROUTER).
//!
//! A DEALER (not REQ: REQ would take only the first of many replies) sends
//! `[b"", start_seq as 8 bytes BE]`; vLLM answers every buffered batch with seq >= start as
//! `[b"", topic, seq8, payload]` (older versions: `[b"", seq8, payload]`), then an end marker
//! with seq = u64::MAX. A fresh socket per replay, so a late answer to an abandoned request can
//! never be mistaken for the next one. Every wait is bounded: a dead replay endpoint costs at
//! most `idle_timeout`, and a stop request is noticed within one poll interval.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;

const END_SEQ: u64 = u64::MAX;
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Error)]
pub(crate) enum ReplayError {
    #[error("replay socket: {0}")]
    Socket(#[from] zmq::Error),
    #[error("no reply from the replay endpoint within {0:?}")]
    Timeout(Duration),
    #[error("stopped")]
    Stopped,
}

/// What a replay brought back.
pub(crate) struct Replayed {
    /// Batches handed to the callback.
    pub(crate) batches: u64,
    /// Every seq in `[from, until)` was received, in order.
    pub(crate) complete: bool,
}

/// The request for one replay.
pub(crate) struct ReplayRequest<'a> {
    pub(crate) endpoint: &'a str,
    pub(crate) from: u64,
    /// Exclusive: batches from here on arrive (or arrived) live.
    pub(crate) until: u64,
    pub(crate) idle_timeout: Duration,
    pub(crate) stop: &'a AtomicBool,
}

/// Replays `[from, until)`, calling `on_batch(seq, payload)` for each batch in that range.
pub(crate) fn replay(
    ctx: &zmq::Context,
    req: ReplayRequest<'_>,
    mut on_batch: impl FnMut(u64, &[u8]),
) -> Result<Replayed, ReplayError> {
    let sock = ctx.socket(zmq::DEALER)?;
    sock.set_linger(0)?;
    sock.set_sndtimeo(req.idle_timeout.as_millis().min(i32::MAX as u128) as i32)?;
    sock.set_rcvtimeo(POLL.as_millis() as i32)?;
    sock.connect(req.endpoint)?;
    sock.send_multipart([&b""[..], &req.from.to_be_bytes()[..]], 0)?;
    let mut next = req.from;
    let mut out = Replayed { batches: 0, complete: true };
    let mut deadline = Instant::now() + req.idle_timeout;
    loop {
        if req.stop.load(Ordering::Relaxed) {
            return Err(ReplayError::Stopped);
        }
        let frames = match sock.recv_multipart(0) {
            Ok(f) => f,
            Err(zmq::Error::EAGAIN) if Instant::now() < deadline => continue,
            Err(zmq::Error::EAGAIN) => return Err(ReplayError::Timeout(req.idle_timeout)),
            Err(e) => return Err(e.into()),
        };
        deadline = Instant::now() + req.idle_timeout;
        let Some((seq, payload)) = parse_reply(&frames) else { continue };
        if seq == END_SEQ {
            out.complete &= next >= req.until;
            return Ok(out);
        }
        if seq < req.from || seq >= req.until {
            continue;
        }
        out.complete &= seq == next;
        next = seq + 1;
        out.batches += 1;
        on_batch(seq, payload);
    }
}

/// `[b"", topic, seq8, payload]` or `[b"", seq8, payload]` -> (seq, payload).
fn parse_reply(frames: &[Vec<u8>]) -> Option<(u64, &[u8])> {
    let (seq, payload) = match frames {
        [empty, _topic, seq, payload] if empty.is_empty() => (seq, payload),
        [empty, seq, payload] if empty.is_empty() => (seq, payload),
        _ => return None,
    };
    let seq: [u8; 8] = seq.as_slice().try_into().ok()?;
    Some((u64::from_be_bytes(seq), payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_reply_layouts_and_rejects_others() {
        let s = 7u64.to_be_bytes().to_vec();
        assert_eq!(parse_reply(&[vec![], b"t".to_vec(), s.clone(), vec![1]]), Some((7, &[1u8][..])));
        assert_eq!(parse_reply(&[vec![], s.clone(), vec![2]]), Some((7, &[2u8][..])));
        assert_eq!(parse_reply(&[vec![0], s.clone(), vec![2]]), None);
        assert_eq!(parse_reply(&[vec![], vec![1, 2], vec![2]]), None);
        assert_eq!(parse_reply(&[s]), None);
    }

    #[test]
    fn a_dead_endpoint_times_out() {
        let ctx = zmq::Context::new();
        let stop = AtomicBool::new(false);
        // Nothing listens here (port 9 is discard; connection refused, retried by ZMQ).
        let req = ReplayRequest {
            endpoint: "tcp://127.0.0.1:9",
            from: 1,
            until: 3,
            idle_timeout: Duration::from_millis(200),
            stop: &stop,
        };
        assert!(matches!(replay(&ctx, req, |_, _| {}), Err(ReplayError::Timeout(_))));
    }
}
