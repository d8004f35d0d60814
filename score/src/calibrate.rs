//! Online calibration of a worker's costs from first-token reports.
//!
//! The model ([`super::model`]) is linear in (overhead_ms, per_token_ms):
//! `actual - fixed_ms ≈ overhead * steps + per_token * tokens`. We fit it by exponentially
//! weighted least squares (old samples decay, so a worker that slows down is followed), with a
//! ridge pull toward the configured priors: before any report, and whenever the samples cannot
//! tell the two costs apart (all requests the same size), the priors answer. Costs never go
//! negative, and stay within [`PRIOR_FACTOR`] of the priors: TTFTs of an overload episode
//! carry queueing the model cannot see, and must not teach the router that prefill is free or
//! that a request costs seconds (a fit like that turns kvroute into "least queued" and it
//! stops keeping prefixes together).

use super::model::Features;

/// Weight of an old sample after each new one: about the last 50 reports dominate.
const DECAY: f64 = 0.98;
/// How many reports the priors are worth.
const PRIOR_WEIGHT: f64 = 1.0;
/// How far the fit may move from the priors, either way.
pub const PRIOR_FACTOR: f64 = 10.0;

/// Serializable so the Redis store can keep the latest fit for warm starts.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    prior_overhead: f64,
    prior_per_token: f64,
    ridge_overhead: f64,
    ridge_per_token: f64,
    // Weighted sums of n², n·x, x², n·y, x·y (n = steps, x = tokens, y = actual - fixed).
    snn: f64,
    snx: f64,
    sxx: f64,
    sny: f64,
    sxy: f64,
    samples: u64,
    overhead_ms: f64,
    per_token_ms: f64,
}

impl Calibration {
    /// `typical_tokens` scales the prior's pull on per_token_ms like one typical request.
    pub fn new(overhead_ms: f64, per_token_ms: f64, typical_tokens: u32) -> Self {
        let typical = f64::from(typical_tokens.max(1));
        Calibration {
            prior_overhead: overhead_ms,
            prior_per_token: per_token_ms,
            ridge_overhead: PRIOR_WEIGHT,
            ridge_per_token: PRIOR_WEIGHT * typical * typical,
            snn: 0.0,
            snx: 0.0,
            sxx: 0.0,
            sny: 0.0,
            sxy: 0.0,
            samples: 0,
            overhead_ms,
            per_token_ms,
        }
    }

    pub fn overhead_ms(&self) -> f64 {
        self.overhead_ms
    }

    pub fn per_token_ms(&self) -> f64 {
        self.per_token_ms
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Forgets every report: back to the priors.
    pub fn reset(&mut self) {
        for s in [&mut self.snn, &mut self.snx, &mut self.sxx, &mut self.sny, &mut self.sxy] {
            *s = 0.0;
        }
        self.samples = 0;
        self.overhead_ms = self.prior_overhead;
        self.per_token_ms = self.prior_per_token;
    }

    /// Adds one report: the features recorded at pick time and the TTFT that followed.
    /// Nonsense (non-finite, non-positive TTFT or features) is ignored.
    pub fn observe(&mut self, f: &Features, actual_ms: f64) -> bool {
        let valid = [actual_ms, f.steps, f.tokens, f.fixed_ms].iter().all(|v| v.is_finite() && *v >= 0.0);
        if !valid || actual_ms <= 0.0 || f.steps <= 0.0 {
            return false;
        }
        let (n, x, y) = (f.steps, f.tokens, (actual_ms - f.fixed_ms).max(0.0));
        for s in [&mut self.snn, &mut self.snx, &mut self.sxx, &mut self.sny, &mut self.sxy] {
            *s *= DECAY;
        }
        self.snn += n * n;
        self.snx += n * x;
        self.sxx += x * x;
        self.sny += n * y;
        self.sxy += x * y;
        self.samples += 1;
        self.solve();
        true
    }

    /// Ridge-regularised normal equations, 2x2; the ridge keeps the determinant positive.
    fn solve(&mut self) {
        let m00 = self.snn + self.ridge_overhead;
        let m11 = self.sxx + self.ridge_per_token;
        let m01 = self.snx;
        let v0 = self.sny + self.ridge_overhead * self.prior_overhead;
        let v1 = self.sxy + self.ridge_per_token * self.prior_per_token;
        let det = m00 * m11 - m01 * m01;
        if !(det.is_finite() && det > 0.0) {
            return;
        }
        let mut a = (v0 * m11 - m01 * v1) / det;
        let mut b = (m00 * v1 - m01 * v0) / det;
        // Constrained to a >= 0, b >= 0: refit the other coefficient alone.
        if a < 0.0 {
            a = 0.0;
            b = (v1 / m11).max(0.0);
        } else if b < 0.0 {
            b = 0.0;
            a = (v0 / m00).max(0.0);
        }
        self.overhead_ms = a.min(self.prior_overhead * PRIOR_FACTOR);
        self.per_token_ms = b.clamp(self.prior_per_token / PRIOR_FACTOR, self.prior_per_token * PRIOR_FACTOR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn close(actual: f64, want: f64, rel: f64) -> bool {
        (actual - want).abs() <= rel * want.abs()
    }

    #[test]
    fn starts_at_the_priors() {
        let c = Calibration::new(15.0, 0.1, 512);
        assert_eq!((c.overhead_ms(), c.per_token_ms(), c.samples()), (15.0, 0.1, 0));
    }

    #[test]
    fn converges_on_synthetic_reports() {
        let (true_overhead, true_per_token) = (40.0, 0.25);
        let mut c = Calibration::new(10.0, 0.05, 512);
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..400 {
            let f = Features {
                steps: f64::from(rng.gen_range(1..5u32)),
                tokens: f64::from(rng.gen_range(16..8000u32)),
                fixed_ms: f64::from(rng.gen_range(0..20u32)),
            };
            let noise = rng.gen_range(0.95..1.05);
            let actual = (true_overhead * f.steps + true_per_token * f.tokens) * noise + f.fixed_ms;
            assert!(c.observe(&f, actual));
        }
        assert!(close(c.overhead_ms(), true_overhead, 0.15), "overhead {}", c.overhead_ms());
        assert!(close(c.per_token_ms(), true_per_token, 0.05), "per_token {}", c.per_token_ms());
        assert_eq!(c.samples(), 400);
    }

    #[test]
    fn follows_a_worker_that_slows_down() {
        let mut c = Calibration::new(20.0, 0.1, 512);
        let mut rng = StdRng::seed_from_u64(3);
        for per_token in [0.1, 0.3] {
            for _ in 0..300 {
                let f = Features { steps: 1.0, tokens: f64::from(rng.gen_range(100..4000u32)), fixed_ms: 0.0 };
                c.observe(&f, 20.0 + per_token * f.tokens);
            }
        }
        assert!(close(c.per_token_ms(), 0.3, 0.05), "per_token {}", c.per_token_ms());
    }

    #[test]
    fn stays_within_a_factor_of_the_priors_and_resets_to_them() {
        let mut c = Calibration::new(15.0, 0.1, 512);
        for _ in 0..200 {
            // An overload episode: minutes of queueing the features do not show.
            c.observe(&Features { steps: 1.0, tokens: 200.0, fixed_ms: 0.0 }, 90_000.0);
        }
        assert!(c.overhead_ms() <= 150.0 + 1e-9 && c.per_token_ms() <= 1.0 + 1e-9, "{c:?}");
        for _ in 0..200 {
            c.observe(&Features { steps: 1.0, tokens: 6000.0, fixed_ms: 0.0 }, 1.0);
        }
        assert!(c.per_token_ms() >= 0.01 - 1e-12, "{c:?}");
        c.reset();
        assert_eq!((c.overhead_ms(), c.per_token_ms(), c.samples()), (15.0, 0.1, 0));
    }

    #[test]
    fn ignores_nonsense_and_never_goes_negative() {
        let mut c = Calibration::new(15.0, 0.1, 512);
        let f = Features { steps: 1.0, tokens: 1000.0, fixed_ms: 0.0 };
        assert!(!c.observe(&f, f64::NAN));
        assert!(!c.observe(&f, -3.0));
        assert!(!c.observe(&Features { steps: 0.0, ..f }, 10.0));
        for _ in 0..100 {
            c.observe(&Features { steps: 1.0, tokens: 5000.0, fixed_ms: 0.0 }, 1.0);
        }
        assert!(c.overhead_ms() >= 0.0 && c.per_token_ms() >= 0.0);
    }
}
