//! kvroute-bench: measures whether cache-aware routing pays off — same stack, same seeded
//! workload, only the state service's policy changes between passes (bench/README.md says
//! what each figure means and how to rerun it).
//!
//! Module map:
//! - [`workload`]: seeded workloads (shared-prefix groups, multi-turn sessions, independent
//!   prompts, Mooncake trace replay, a production-shaped trace generator) and the OpenAI
//!   request bodies they become.
//! - [`bounds`]: the workload's policy-independent reuse bounds (infinite cache, and an
//!   oracle with the fleet's KV capacity).
//! - [`stats`]: percentiles, goodput under a TTFT SLO, per-pass summaries.
//! - [`report`] / [`plot`]: terminal and markdown tables, JSON, SVG plots.
//! - [`client`]: one streaming request, timed at the first token and the last.
//! - [`runner`]: the open-loop driver (Poisson or trace arrivals), bounded in count and time.
//! - [`control`]: the stack's admin surface (policy switch, resets, metrics scrapes).
//! - [`compare`]: one pass per policy (and rate), with resets in between.
//! - [`stack`]: starts and stops the whole stack on loopback ports.
//! - [`chaos`]: failure scenarios injected into a started stack, and what each cost.
//! - [`soak`]: the production topology for an hour with a fault every few minutes: RSS and
//!   in-flight counts against the truth.
//! - [`sensitivity`]: the sensitivity classifier's precision and recall on a labelled corpus.
//!
//! Everything only ever talks to loopback addresses ([`target::ensure_loopback`]).

pub mod bounds;
pub mod chaos;
pub mod client;
pub mod compare;
pub mod control;
pub mod counters;
pub mod error;
pub mod peer_router;
pub mod plot;
pub mod report;
pub mod runner;
pub mod sensitivity;
pub mod soak;
pub mod stack;
pub mod stats;
pub mod target;
pub mod workload;

pub use error::BenchError;
