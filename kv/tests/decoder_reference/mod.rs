//! kvroute-state's KV-event decoder as of 8479738 (before the fast paths: token ids and
//! hashes one generic integer at a time, names compared as checked `&str`, fresh lists per
//! event), kept as the reference the current decoder must agree with.

mod event;
mod msgpack;

use kvroute_kv::vllm::{DecodeError, EventBatch};
use msgpack::Reader;

/// `events::decode_batch` as it was.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut out = EventBatch::default();
    let mut r = Reader::new(payload);
    let len = r.array_len()?;
    if len < 2 {
        return Err(DecodeError::BadBatch("fewer than 2 elements"));
    }
    out.ts = r.number()?;
    let n = r.array_len()?;
    out.events.reserve(n);
    for _ in 0..n {
        let start = r.pos();
        match event::decode_event(&mut r) {
            Ok(ev) => out.events.push(ev),
            Err(e) => {
                r.set_pos(start);
                r.skip()?;
                out.rejected.push(e);
            }
        }
    }
    if len >= 3 {
        out.data_parallel_rank = match r.nil()? {
            true => None,
            false => r.int().ok().map(|i| match i {
                msgpack::Int::U(u) => i64::try_from(u).unwrap_or(i64::MAX),
                msgpack::Int::I(i) => i,
            }),
        };
    }
    Ok(out)
}
