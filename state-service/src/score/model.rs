//! The TTFT model.
//!
//! A new request waits for the prefills queued ahead of it, slowed by the decode steps of the
//! sequences already running, and then pays its own prefill of the tokens the worker has not
//! cached:
//!
//! ```text
//! ttft = overhead * (ahead + 1) + per_token * (tokens_ahead + uncached) + decode * running
//! ```
//!
//! `ahead` is max(scraped waiting, our own not-yet-first-token assignments): our assignments
//! are fresher than the metrics, the metrics also see traffic we did not route. Our own
//! waiting requests are costed by their known uncached tokens, the others by a default size.
//! The model is linear in (overhead, per_token), which is what calibration fits.

/// A worker's cost parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    pub per_token_ms: f64,
    pub overhead_ms: f64,
    pub decode_ms_per_running: f64,
    /// Prompt size assumed for a waiting request we did not route.
    pub default_request_tokens: u32,
}

/// What we know of a worker's queue at pick time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadView {
    /// Scraped `vllm:num_requests_running` (summed over engines).
    pub running: u32,
    /// Scraped `vllm:num_requests_waiting`.
    pub waiting: u32,
    /// Our assignments to this worker without a first-token report.
    pub own_waiting: u32,
    /// Their uncached prompt tokens.
    pub own_waiting_tokens: u64,
    /// All our unfinished assignments to this worker.
    pub own_in_flight: u32,
}

impl LoadView {
    /// Requests queued or running. Our in-flight assignments are among the scraped ones once
    /// the metrics catch up, so the larger of the two counts, not their sum.
    pub fn outstanding(&self) -> u64 {
        u64::from(self.running + self.waiting).max(u64::from(self.own_in_flight))
    }
}

/// The inputs of one prediction, kept with the assignment so calibration can refit later.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Features {
    /// Requests whose overhead is paid before our first token (those ahead + this one).
    pub requests: f64,
    /// Prompt tokens prefilled before our first token.
    pub tokens: f64,
    /// The part of the prediction calibration does not fit (decode interference).
    pub fixed_ms: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    pub uncached_tokens: u32,
    pub queue_ms: f64,
    pub prefill_ms: f64,
    pub ttft_ms: f64,
    pub features: Features,
}

/// Predicted TTFT of a `prompt_tokens` request whose first `matched_tokens` are cached.
pub fn predict(prompt_tokens: u32, matched_tokens: u32, load: &LoadView, cost: &Cost) -> Prediction {
    let uncached = prompt_tokens.saturating_sub(matched_tokens);
    let others = load.waiting.saturating_sub(load.own_waiting);
    let ahead = f64::from(load.own_waiting) + f64::from(others);
    let tokens_ahead = load.own_waiting_tokens as f64 + f64::from(others) * f64::from(cost.default_request_tokens);
    let fixed_ms = f64::from(load.running) * cost.decode_ms_per_running;
    let queue_ms = cost.overhead_ms * ahead + cost.per_token_ms * tokens_ahead + fixed_ms;
    let prefill_ms = cost.overhead_ms + cost.per_token_ms * f64::from(uncached);
    Prediction {
        uncached_tokens: uncached,
        queue_ms,
        prefill_ms,
        ttft_ms: queue_ms + prefill_ms,
        features: Features { requests: ahead + 1.0, tokens: tokens_ahead + f64::from(uncached), fixed_ms },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const COST: Cost = Cost { per_token_ms: 0.1, overhead_ms: 10.0, decode_ms_per_running: 0.5, default_request_tokens: 512 };

    #[test]
    fn cached_prefix_wins_when_queues_are_equal() {
        let load = LoadView { running: 2, waiting: 1, own_waiting: 1, own_waiting_tokens: 300, own_in_flight: 3 };
        let warm = predict(4000, 3200, &load, &COST);
        let cold = predict(4000, 0, &load, &COST);
        assert!(warm.ttft_ms < cold.ttft_ms);
        assert_eq!(warm.uncached_tokens, 800);
        assert!((cold.prefill_ms - warm.prefill_ms - 320.0).abs() < 1e-9);
    }

    #[test]
    fn idle_worker_wins_when_the_queue_costs_more_than_the_prefill_saved() {
        let busy = LoadView { running: 8, waiting: 6, own_waiting: 6, own_waiting_tokens: 6 * 2000, own_in_flight: 14 };
        let warm_busy = predict(4000, 3200, &busy, &COST);
        let cold_idle = predict(4000, 0, &LoadView::default(), &COST);
        // Saved prefill: 320 ms; queue: 6 * 10 + 12000 * 0.1 + 8 * 0.5 = 1264 ms.
        assert!(cold_idle.ttft_ms < warm_busy.ttft_ms);
    }

    #[test]
    fn features_reproduce_the_prediction() {
        let load = LoadView { running: 3, waiting: 5, own_waiting: 2, own_waiting_tokens: 700, own_in_flight: 4 };
        let p = predict(1000, 160, &load, &COST);
        let f = p.features;
        let again = COST.overhead_ms * f.requests + COST.per_token_ms * f.tokens + f.fixed_ms;
        assert!((again - p.ttft_ms).abs() < 1e-9);
    }

    fn load_strategy() -> impl Strategy<Value = LoadView> {
        (0u32..64, 0u32..64, 0u32..64, 0u64..100_000).prop_map(|(running, waiting, own_waiting, tokens)| LoadView {
            running,
            waiting,
            own_waiting,
            own_waiting_tokens: tokens,
            own_in_flight: own_waiting + running / 2,
        })
    }

    proptest! {
        /// More load never makes a worker look faster: one more running sequence, one more
        /// foreign waiting request, or one more of our own queued requests (which the metrics
        /// then also count as waiting).
        #[test]
        fn predicted_ttft_is_monotonic_in_load(
            load in load_strategy(),
            prompt in 0u32..20_000,
            matched in 0u32..20_000,
            extra_tokens in 0u64..10_000,
        ) {
            let base = predict(prompt, matched, &load, &COST).ttft_ms;
            let more_running = LoadView { running: load.running + 1, ..load };
            let more_waiting = LoadView { waiting: load.waiting + 1, ..load };
            let more_own = LoadView {
                waiting: load.waiting + 1,
                own_waiting: load.own_waiting + 1,
                own_waiting_tokens: load.own_waiting_tokens + extra_tokens,
                own_in_flight: load.own_in_flight + 1,
                ..load
            };
            for heavier in [more_running, more_waiting, more_own] {
                prop_assert!(predict(prompt, matched, &heavier, &COST).ttft_ms >= base);
            }
        }

        /// A longer cached prefix never makes a worker look slower.
        #[test]
        fn predicted_ttft_is_antitonic_in_matched_tokens(load in load_strategy(), prompt in 0u32..20_000, a in 0u32..20_000, b in 0u32..20_000) {
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(predict(prompt, hi, &load, &COST).ttft_ms <= predict(prompt, lo, &load, &COST).ttft_ms);
        }
    }
}
