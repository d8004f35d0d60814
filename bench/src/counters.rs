//! The workers' cache counters a pass reads (deltas over the pass): what `control` scrapes
//! and `report` renders, kept apart from both so neither depends on the other.

use serde::{Deserialize, Serialize};

/// Prefix-cache counters summed over all workers, as deltas over one pass.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CacheDelta {
    pub queries: f64,
    pub hits: f64,
}

impl CacheDelta {
    pub fn hit_ratio(&self) -> Option<f64> {
        (self.queries > 0.0).then(|| self.hits / self.queries)
    }
}

/// The sims' first-scheduling counters summed over all workers (absolute, or a delta):
/// prompt tokens of requests when first scheduled, and how many of them were served from
/// the GPU / CPU prefix cache then. `None` = some worker does not expose that series.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FirstScheduled {
    pub prompt_tokens: f64,
    pub cached_gpu: Option<f64>,
    pub cached_cpu: Option<f64>,
}

impl FirstScheduled {
    /// `self - before`, per counter.
    pub fn since(&self, before: &FirstScheduled) -> FirstScheduled {
        let d = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
        FirstScheduled {
            prompt_tokens: self.prompt_tokens - before.prompt_tokens,
            cached_gpu: d(self.cached_gpu, before.cached_gpu),
            cached_cpu: d(self.cached_cpu, before.cached_cpu),
        }
    }
}
