//! kvroute-kv: what every vLLM engine holds in its KV cache, as kvroute keys.
//!
//! The leaves of the state service, in their own crate so nothing here can reach upward:
//! - [`types`]: the newtypes every other crate speaks (`BlockKey`, `EngineHash`,
//!   `EngineSlot`, `WorkerId`, the decoded `KvEvent`);
//! - [`vllm`]: vLLM's KV-event payloads (msgspec msgpack) decoded into `KvEvent`s;
//! - [`index`]: the KV index behind the `KvIndex` trait (the memory index, and the
//!   clean-room reference model every implementation is checked against);
//! - [`hasher`]: the seeded hasher for keys that are already hashes.
//!
//! No I/O, no clock, no runtime: ZMQ ingestion and the Redis mirror live in the state service
//! and drive these types.

pub mod hasher;
pub mod index;
pub mod types;
pub mod vllm;
