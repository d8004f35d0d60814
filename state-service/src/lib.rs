//! kvroute-state: the state service. Knows what every vLLM engine holds in its KV cache (from
//! vLLM's KV-cache events) and how busy it is (from its metrics and our own assignments), and
//! answers "where should this request go?" with a predicted time to first token.

pub mod api;
pub mod app;
pub mod assign;
pub mod config;
pub mod discovery;
pub mod feeds;
pub mod fleet;
pub mod ingest;
pub mod load;
pub mod membership;
pub mod metrics;
pub mod pick;
pub mod pools;
pub mod reporter;
pub mod sched;
pub mod store;
pub mod stored;
pub mod tenancy;
pub mod tokenization;
