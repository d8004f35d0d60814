//! Scoring: which worker will return the first token soonest.
//!
//! Everything here is pure (no clocks, no I/O, randomness only through a caller's rng), so
//! the policies can be unit- and property-tested and compared side by side in one benchmark:
//!
//! - [`model`]: predicted TTFT = queue wait + prefill of the uncached tokens.
//! - [`calibrate`]: per-worker online fit of the model's costs from first-token reports.
//! - [`select`]: each policy's choice among candidates ([`select::choose`]), minimum with
//!   tie-breaks (load, then random).
//! - [`selector`]: each pick's own rng and round-robin ticket, without a lock.
//! - [`peers`], [`prefix_sets`]: SGLang's, llm-d's and Dynamo's published routing rules with
//!   their defaults, and the per-worker prefix memory the approximate ones keep.
//! - [`approx`]: the text-chunk key -> worker map that routers without KV events rely on.

pub mod approx;
pub mod clock;
pub mod calibrate;
pub mod model;
pub mod peers;
pub mod prefix_sets;
pub mod select;
pub mod selector;

pub use approx::ApproxMap;
pub use calibrate::Calibration;
pub use model::{followers, placement_cost, predict, Cached, Cost, Features, LoadView, Prediction};
pub use select::{choose, pick_cheapest, pick_min, Choice, Context, Scored};
pub use selector::{PickRng, Selector};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A routing policy. `Kvroute` is the product; the others are the baselines it is measured
/// against (see the workspace README's routing-quality table and bench/README.md).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// KV-event index + predicted TTFT.
    #[default]
    Kvroute,
    Random,
    RoundRobin,
    /// Fewest queued + running requests.
    LeastLoaded,
    /// SGLang's cache-aware router ([`peers::sglang`]).
    SglangCacheAware,
    /// llm-d's default scheduling profile, approximate prefix mode ([`peers::llmd`]).
    LlmdDefault,
    /// Dynamo's KV router on the same KV index ([`peers::dynamo`]).
    DynamoKv,
}

impl Policy {
    pub const ALL: [Policy; 7] = [
        Policy::Kvroute,
        Policy::Random,
        Policy::RoundRobin,
        Policy::LeastLoaded,
        Policy::SglangCacheAware,
        Policy::LlmdDefault,
        Policy::DynamoKv,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Kvroute => "kvroute",
            Policy::Random => "random",
            Policy::RoundRobin => "round_robin",
            Policy::LeastLoaded => "least_loaded",
            Policy::SglangCacheAware => "sglang_cache_aware",
            Policy::LlmdDefault => "llmd_default",
            Policy::DynamoKv => "dynamo_kv",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `approx_prefix` (learned routes, no load: it herded a hot prefix onto one worker, which no
/// deployed router does) was retired for the peers; its name is refused like any other.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown policy {name:?} (expected one of {known})", name = .0, known = Policy::ALL.map(Policy::as_str).join(", "))]
pub struct UnknownPolicy(pub String);

impl FromStr for Policy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL.into_iter().find(|p| p.as_str() == s).ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.as_str().parse::<Policy>(), Ok(p));
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{p}\""));
        }
        assert!("fastest".parse::<Policy>().is_err());
        let retired = "approx_prefix".parse::<Policy>().unwrap_err().to_string();
        assert!(retired.contains("sglang_cache_aware, llmd_default, dynamo_kv"), "{retired}");
    }
}
