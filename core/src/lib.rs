//! kvroute-core: everything both halves of kvroute must compute identically.
//!
//! The proxy-wasm filter (wasm32-wasip1) and the state service (native) both link this crate,
//! so block keys, request parsing and the wire messages have exactly one implementation.
//! Nothing here does I/O or reads clocks; every function is deterministic.
//!
//! - [`keys`]: kvroute's own chained block keys over token ids, and text-chunk keys.
//! - [`request`]: OpenAI / Anthropic request bodies -> a [`request::PromptRequest`].
//! - [`wire`]: the pick / report protobuf messages (`proto/kvroute.proto`).

pub mod keys;
pub mod request;

/// Generated from `proto/kvroute.proto`: the filter <-> state service contract.
pub mod wire {
    include!(concat!(env!("OUT_DIR"), "/kvroute.v1.rs"));
}

pub use keys::{BlockKey, KeyRoot};
