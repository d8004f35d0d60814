//! Decoding vLLM's KV-event payloads (msgpack, as written by msgspec) into [`KvEvent`]s.
//!
//! The wire format, as vLLM 0.33.0 writes it (read from its own source in the `vllm` wheel:
//! `vllm/distributed/kv_events.py` and `vllm/v1/core/block_pool.py`):
//! - batch: positional array `[ts, events, data_parallel_rank?, ...]` (trailing extras
//!   ignored; msgspec omits a `None` rank, so a 2-element batch is valid);
//! - event: a map tagged by `"type"` (fields by name, unknown keys ignored, omitted fields
//!   take their defaults) or the older positional array `["BlockStored", ...]`;
//! - block hash: uint64 (may exceed 2^63), a negative int (two's complement), or bin (last
//!   8 bytes big-endian, as vLLM's `maybe_convert_block_hash`).
//!
//! Robustness: a batch whose framing is broken is rejected whole; an event that is bad but
//! well-formed msgpack is skipped and reported in [`EventBatch::rejected`], and the rest of
//! the batch still applies. Nothing here panics on input.

mod event;
pub(crate) mod msgpack;
mod spare;

use crate::types::KvEvent;
use msgpack::Reader;
use thiserror::Error;

/// Why a batch or an event could not be decoded. `kind()` is the metric label.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum DecodeError {
    #[error("payload truncated at byte {offset}")]
    Truncated { offset: usize },
    #[error("invalid msgpack marker 0x{marker:02x} at byte {offset}")]
    InvalidMarker { marker: u8, offset: usize },
    #[error("expected {expected}, found marker 0x{marker:02x} at byte {offset}")]
    UnexpectedType { expected: &'static str, marker: u8, offset: usize },
    #[error("invalid UTF-8 in string at byte {offset}")]
    InvalidUtf8 { offset: usize },
    #[error("batch is not [ts, events, rank?]: {0}")]
    BadBatch(&'static str),
    #[error("unknown event type {0:?}")]
    UnknownEventType(String),
    #[error("event has no \"type\"")]
    MissingType,
    #[error("{event} is missing field {field}")]
    MissingField { event: &'static str, field: &'static str },
    #[error("block hash is a {0}-byte binary (need >= 8 bytes)")]
    ShortHash(usize),
    #[error("token id {0} is not a u32")]
    BadTokenId(i128),
    #[error("block_size {0} is not a u32")]
    BadBlockSize(i128),
    #[error("unknown medium {0:?}")]
    UnknownMedium(String),
}

impl DecodeError {
    /// A stable, low-cardinality label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::InvalidMarker { .. } => "invalid_marker",
            DecodeError::UnexpectedType { .. } => "unexpected_type",
            DecodeError::InvalidUtf8 { .. } => "invalid_utf8",
            DecodeError::BadBatch(_) => "bad_batch",
            DecodeError::UnknownEventType(_) => "unknown_event_type",
            DecodeError::MissingType => "missing_type",
            DecodeError::MissingField { .. } => "missing_field",
            DecodeError::ShortHash(_) => "bad_hash",
            DecodeError::BadTokenId(_) => "bad_token_id",
            DecodeError::BadBlockSize(_) => "bad_block_size",
            DecodeError::UnknownMedium(_) => "unknown_medium",
        }
    }
}

/// One decoded batch (one vLLM scheduler step).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventBatch {
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// The publishing engine's data-parallel rank, when the batch carries one.
    pub data_parallel_rank: Option<i64>,
    /// Events that were skipped, with the reason; the others are in `events`.
    pub rejected: Vec<DecodeError>,
    /// The previous batch's lists, reused by [`decode_batch_into`] (not part of the value).
    spare: spare::Spare,
}

/// Decodes one payload. Fails only when the batch itself is unreadable.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut batch = EventBatch::default();
    decode_batch_into(payload, &mut batch)?;
    Ok(batch)
}

/// As [`decode_batch`], reusing `out`'s buffers (cleared first): the ingest hot path.
pub fn decode_batch_into(payload: &[u8], out: &mut EventBatch) -> Result<(), DecodeError> {
    out.spare.recycle(&mut out.events);
    out.rejected.clear();
    out.data_parallel_rank = None;
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
        match event::decode_event(&mut r, &mut out.spare) {
            Ok(ev) => out.events.push(ev),
            Err(e) => {
                // Skip exactly this event; if even that fails the framing is gone.
                r.set_pos(start);
                r.skip()?;
                out.rejected.push(e);
            }
        }
    }
    if len >= 3 {
        out.data_parallel_rank = match r.nil()? {
            true => None,
            // A rank of the wrong type is informational only: ignore it rather than drop
            // the whole batch.
            false => r.int().ok().map(|i| match i {
                msgpack::Int::U(u) => i64::try_from(u).unwrap_or(i64::MAX),
                msgpack::Int::I(i) => i,
            }),
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests;
