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

/// A histogram's cumulative bucket counts (upper bound, count), ascending, `+Inf` last: the
/// state service's pick answer times, as a delta over one pass. JSON has no infinity, so the
/// last bound is written `null` and read back as `+Inf`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Buckets(pub Vec<(f64, f64)>);

impl<'de> Deserialize<'de> for Buckets {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Buckets, D::Error> {
        let raw: Vec<(Option<f64>, f64)> = Deserialize::deserialize(d)?;
        Ok(Buckets(raw.into_iter().map(|(le, n)| (le.unwrap_or(f64::INFINITY), n)).collect()))
    }
}

impl Buckets {
    /// `self - before`, bucket by bucket (the same bounds).
    pub fn since(&self, before: &Buckets) -> Buckets {
        Buckets(self.0.iter().zip(&before.0).map(|((le, a), (_, b))| (*le, a - b)).collect())
    }

    /// The upper bound of the first bucket that holds every observation: what none exceeded
    /// (`inf` when some fell in the open last bucket); `None` when empty.
    pub fn bound(&self) -> Option<f64> {
        let total = self.0.last()?.1;
        (total > 0.0).then(|| self.0.iter().find(|(_, count)| *count >= total).map_or(f64::INFINITY, |(le, _)| *le))
    }

    /// The `q` quantile (0..=1), interpolated linearly inside its bucket; `None` when empty
    /// or when it falls in the open last bucket.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.0.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for &(le, count) in &self.0 {
            if count >= rank {
                if !le.is_finite() {
                    return None;
                }
                let width = count - lower.1;
                let into = if width > 0.0 { (rank - lower.1) / width } else { 1.0 };
                return Some(lower.0 + (le - lower.0) * into);
            }
            lower = (le, count);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_read_back_their_infinite_bound() {
        let b = Buckets(vec![(0.5, 2.0), (f64::INFINITY, 3.0)]);
        let json = serde_json::to_string(&b).unwrap();
        assert_eq!(json, "[[0.5,2.0],[null,3.0]]");
        assert_eq!(serde_json::from_str::<Buckets>(&json).unwrap(), b);
    }

    #[test]
    fn quantiles_interpolate_inside_buckets() {
        let b = Buckets(vec![(0.001, 0.0), (0.002, 50.0), (0.004, 99.0), (f64::INFINITY, 100.0)]);
        assert_eq!(b.quantile(0.5), Some(0.002));
        assert!((b.quantile(0.25).unwrap() - 0.0015).abs() < 1e-12);
        assert_eq!(b.quantile(1.0), None, "in the open bucket");
        let before = Buckets(vec![(0.001, 0.0), (0.002, 50.0), (0.004, 50.0), (f64::INFINITY, 50.0)]);
        assert_eq!(b.since(&before).quantile(0.5).map(|v| (v * 1e6).round()), Some(3020.0));
        assert_eq!(Buckets::default().quantile(0.5), None);
        assert_eq!(b.bound(), Some(f64::INFINITY));
        assert_eq!(Buckets(vec![(0.001, 1.0), (0.002, 3.0), (f64::INFINITY, 3.0)]).bound(), Some(0.002));
        assert_eq!(Buckets::default().bound(), None);
    }
}
