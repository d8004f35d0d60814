//! kvroute-filter: the proxy-wasm module that routes each LLM request to the vLLM worker the
//! kvroute state service predicts will return its first token soonest.
//!
//! Module map:
//! - [`config`]: the plugin configuration (JSON), parsed and validated once.
//! - [`decision`]: pure request-path logic: header stripping, pick request building, pick
//!   response -> route or fallback reason.
//! - [`identity`]: the request's tenant, from the proxy's verified facts only.
//! - [`admission`]: what a request kvroute cannot read, or cannot get an answer for, is
//!   admitted as: routing fails open, admission never does.
//! - [`reply`]: the filter's own answers (401 without identity, 429 over budget, 503 when a
//!   budgeted request cannot be admitted, 404 for another tenant's stored response), shaped
//!   like the API the client called so its SDK raises its usual error.
//! - [`usage`], [`report`]: response tail, `usage` parsing, first-token / complete / cancel
//!   tracking, and the bounded report batch queue.
//! - [`upstream`]: which upstream answered and how it failed, parsed before it is believed.
//! - `host`, `metrics`, `shared`, `root`, `http`: the thin proxy-wasm glue (host calls that
//!   never panic, metric handles, the state a VM's contexts share, the root context, the
//!   per-request HTTP context). `root` creates `http` contexts, so `http` must not name `root`.
//!
//! Routing fails open: whatever goes wrong, the request continues to the route's default
//! upstream with a counted, labelled reason. Admission never does: a request on a budgeted
//! route is admitted and charged whether or not it could be routed ([`admission`]). The filter
//! never panics in a callback.

// A panic traps the Wasm VM inside Envoy: outside tests every Result and Option is handled,
// and slices are read with `get` / iterators, never `[i]` (an out-of-range index panics too).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing))]

pub mod admission;
pub mod cidr;
pub mod config;
pub mod decision;
pub mod identity;
pub mod pool;
pub mod reply;
pub mod report;
pub mod upstream;
pub mod usage;

mod host;
mod http;
mod metrics;
mod root;
mod shared;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> { Box::new(root::Root::default()) });
}}
