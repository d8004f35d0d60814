//! kvroute-sim: simulated vLLM workers, faithful enough to judge routing without GPUs.
//!
//! Each worker is a pure [`engine::Engine`] (paged KV cache, prefix caching, continuous
//! batching, step-time model) stepped by one tokio task, fronted by an OpenAI-compatible
//! axum server, publishing vLLM-identical KV events over ZMQ and vLLM-named Prometheus
//! metrics. A worker may run several data-parallel ranks ([`dp::DpWorker`]), each its own
//! engine and publisher. See sim/README.md for the CLI, port layout and the default GPU profile.
//!
//! Module layers, each using only those above it in this list: `ids`; `engine`; `events`,
//! `metrics`; `worker`; `dp`; `chat` (request -> prompt ids, ids -> text); `answer` (made-up
//! outputs, built on `chat`); `http` (the API, over all of the above); `cluster` (wires
//! workers, publishers and servers).

pub mod engine;
pub mod ids;
pub mod events;
pub mod metrics;
pub mod worker;
pub mod dp;
pub mod chat;
pub mod answer;
pub mod http;
pub mod cluster;
