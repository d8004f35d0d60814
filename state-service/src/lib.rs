//! kvroute-state: the state service. Knows what every vLLM engine holds in its KV cache (from
//! vLLM's KV-cache events) and how busy it is (from its metrics and our own assignments), and
//! answers "where should this request go?" with a predicted time to first token.

pub mod api;
pub mod app;
pub mod assign;
pub mod config;
pub mod events;
pub mod feeds;
pub mod fleet;
pub(crate) mod hasher;
pub mod index;
pub mod ingest;
pub mod load;
pub mod metrics;
pub mod pick;
pub mod report;
pub mod responses;
pub mod score;
pub mod state;
pub mod store;
pub mod tenancy;
pub mod tokenize;
pub mod types;
