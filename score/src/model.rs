//! The TTFT model.
//!
//! vLLM runs in steps: each step takes up to `max_num_batched_tokens` tokens (one per running
//! sequence's decode, the rest prefill, first come first served) and costs a fixed overhead,
//! a cost per prefill token and a cost per sequence in the batch. A new request's first token
//! comes at the end of the step that finishes its prefill, so it waits for the prefill work
//! queued ahead of it and its own, in as many steps as that work needs:
//!
//! ```text
//! work  = tokens_ahead + uncached
//! steps = ceil(work / (budget - running)) + 1/2 if the worker is busy (the step in flight:
//!         its overhead and decodes; its prefill tokens are already in tokens_ahead)
//! ttft  = overhead * steps + per_token * work + decode * running * steps
//! ```
//!
//! Charging the overhead per step, not per request, matters under load: many short prefills
//! share one step. (An earlier model charged it per queued request; fitted online, it
//! predicted cache hits 2.3x too fast in the shared-prefix benchmark: bench/README.md.)
//!
//! `tokens_ahead` counts our own assignments without a first token by their uncached tokens
//! (fresher than the metrics) and the scraped waiting requests beyond those by a default
//! size (the metrics also see traffic we did not route). The model is linear in
//! (overhead, per_token), which is what calibration fits.

/// A worker's cost parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    pub per_token_ms: f64,
    /// Fixed cost of one scheduler step.
    pub overhead_ms: f64,
    /// Cost of one running sequence in a step.
    pub decode_ms_per_running: f64,
    /// Prompt size assumed for a waiting request we did not route.
    pub default_request_tokens: u32,
    /// vLLM's `max_num_batched_tokens`: tokens one step takes.
    pub step_tokens: u32,
    /// Loading one token's KV from the offloading tier (CPU) into the GPU: KV bytes per token
    /// over the host-to-device bandwidth. Not calibrated (part of `fixed_ms`).
    pub reload_ms_per_token: f64,
}

impl Cost {
    /// One step with a full prefill budget: its overhead and `step_tokens` prefill tokens.
    pub fn step_ms(&self) -> f64 {
        self.overhead_ms + f64::from(self.step_tokens) * self.per_token_ms
    }
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
    /// Scheduler steps until our first token (each pays the step overhead).
    pub steps: f64,
    /// Prompt tokens prefilled before our first token.
    pub tokens: f64,
    /// The part of the prediction calibration does not fit (decode interference).
    pub fixed_ms: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    pub uncached_tokens: u32,
    pub ttft_ms: f64,
    pub features: Features,
}

/// How much of a prompt a worker holds: `tokens` leading tokens cached in any tier, of which
/// the last `reloaded` are off the GPU (vLLM's offloading connector loads them before the
/// request is scheduled, at `reload_ms_per_token`, instead of recomputing them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cached {
    pub tokens: u32,
    pub reloaded: u32,
}

impl Cached {
    /// All on the GPU.
    pub fn gpu(tokens: u32) -> Cached {
        Cached { tokens, reloaded: 0 }
    }
}

/// Predicted TTFT of a `prompt_tokens` request of which `cached` is held.
pub fn predict(prompt_tokens: u32, cached: Cached, load: &LoadView, cost: &Cost) -> Prediction {
    let uncached = prompt_tokens.saturating_sub(cached.tokens);
    let reloaded = cached.reloaded.min(cached.tokens.min(prompt_tokens));
    let others = load.waiting.saturating_sub(load.own_waiting);
    let tokens_ahead = load.own_waiting_tokens as f64 + f64::from(others) * f64::from(cost.default_request_tokens);
    let work = tokens_ahead + f64::from(uncached);
    // Decodes take their token of every step's budget first; a quarter stays for prefill
    // however many run (vLLM caps running sequences well below the budget in practice).
    let budget = f64::from(cost.step_tokens.max(1));
    let per_step = (budget - f64::from(load.running)).max(budget / 4.0);
    let busy = load.running > 0 || load.waiting > 0 || load.own_waiting > 0;
    let steps = (work / per_step).ceil().max(1.0) + if busy { 0.5 } else { 0.0 };
    let fixed_ms = steps * f64::from(load.running) * cost.decode_ms_per_running + cost.reload_ms_per_token * f64::from(reloaded);
    let ttft_ms = cost.overhead_ms * steps + cost.per_token_ms * work + fixed_ms;
    Prediction { uncached_tokens: uncached, ttft_ms, features: Features { steps, tokens: work, fixed_ms } }
}

/// What the kvroute policy minimises: the request's own predicted TTFT plus the delay its
/// prefill adds for the requests that will queue behind it (`weight` x `per_token_ms` (the
/// worker's) x the tokens it computes beyond `least_uncached`, what the warmest placement
/// computes, x `followers`).
///
/// Greedy TTFT is right at light load and wrong under load: a follow-up sent to a cold worker
/// with a shorter queue saves itself a few seconds of waiting but recomputes its whole history,
/// and every request that queues behind that prefill pays for it. In a FIFO queue the requests
/// that arrive while a job waits are about as many as were waiting when it arrived (Little's
/// law; the M/M/1 marginal cost of work x is x times the mean number in the queue). A router
/// that balances spreads those arrivals over the fleet, so `followers` is the queue a typical
/// worker the request could move to has ([`followers`]), the same for every candidate. While
/// those workers idle kvroute routes on TTFT alone; on a backlogged fleet the placement that
/// computes least wins unless its own queue costs more than the prefill it saves everyone.
/// `weight` 0 is the plain TTFT minimum.
///
/// Only the excess over the warmest placement is charged: the prefill every placement computes
/// is no choice's cost. Charged whole, it was the same large constant on every candidate where
/// none holds the prompt, which widened the tie window (relative to the cost) until the
/// request-count tie-break decided, and multiplied each worker's calibration noise by the
/// queue: on independent prompts (the control) p90 / p99 3.61 / 5.38 s against 2.94 / 3.76 s
/// with TTFT alone (bench/README.md "Placement cost").
pub fn placement_cost(prediction: &Prediction, per_token_ms: f64, least_uncached: u32, followers: f64, weight: f64) -> f64 {
    let excess = prediction.uncached_tokens.saturating_sub(least_uncached);
    prediction.ttft_ms + weight * per_token_ms * f64::from(excess) * followers
}

/// The requests that will queue behind a prefill: the mean queue (requests waiting for their
/// first token; per worker the larger of the scraped waiting count and our own assignments
/// without a first-token report) over the workers that hold less of this prompt than the
/// warmest one (`matched`, in keys, one per entry of `loads`) — the workers it would move to.
/// Where all hold the same, over all of them.
///
/// Not over the whole fleet: the queue a burst on one new prefix builds on the worker that
/// took its first request is that worker's alone, and counting it would pile the burst onto
/// it while the rest idle (the whole fleet's mean did: 9 of 9 on one worker). Not the median:
/// on four workers it is the second-shortest queue and undercharges a backlogged fleet
/// (bench/README.md "Placement cost").
pub fn followers(loads: &[LoadView], matched: &[u32]) -> f64 {
    let best = matched.iter().copied().max().unwrap_or(0);
    let all = matched.iter().all(|&m| m == best);
    let (sum, n) = loads
        .iter()
        .zip(matched)
        .filter(|&(_, &m)| all || m < best)
        .fold((0u64, 0u32), |(sum, n), (l, _)| (sum + u64::from(l.waiting.max(l.own_waiting)), n + 1));
    if n == 0 {
        0.0
    } else {
        sum as f64 / f64::from(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const COST: Cost = Cost { per_token_ms: 0.1, overhead_ms: 10.0, decode_ms_per_running: 0.5, default_request_tokens: 512, step_tokens: 2048, reload_ms_per_token: 0.01 };

    #[test]
    fn cached_prefix_wins_when_queues_are_equal() {
        let load = LoadView { running: 2, waiting: 1, own_waiting: 1, own_waiting_tokens: 300, own_in_flight: 3 };
        let warm = predict(4000, Cached::gpu(3200), &load, &COST);
        let cold = predict(4000, Cached::gpu(0), &load, &COST);
        assert_eq!(warm.uncached_tokens, 800);
        // 3200 tokens less prefill (320 ms) and two steps less (1100 vs 4300 tokens of work at
        // 2046 per step; each step 10 ms + 2 running * 0.5 ms).
        assert!((cold.ttft_ms - warm.ttft_ms - 342.0).abs() < 1e-9, "{cold:?} {warm:?}");
    }

    #[test]
    fn idle_worker_wins_when_the_queue_costs_more_than_the_prefill_saved() {
        let busy = LoadView { running: 8, waiting: 6, own_waiting: 6, own_waiting_tokens: 6 * 2000, own_in_flight: 14 };
        let warm_busy = predict(4000, Cached::gpu(3200), &busy, &COST);
        let cold_idle = predict(4000, Cached::gpu(0), &LoadView::default(), &COST);
        // Saved prefill: 320 ms; queue: 12000 tokens * 0.1 + their 6 steps * (10 + 8 * 0.5) ms.
        assert!(cold_idle.ttft_ms < warm_busy.ttft_ms);
    }

    #[test]
    fn an_offloaded_prefix_costs_its_reload_not_its_prefill() {
        let load = LoadView::default();
        let gpu = predict(4000, Cached::gpu(3200), &load, &COST);
        let cpu = predict(4000, Cached { tokens: 3200, reloaded: 3200 }, &load, &COST);
        let none = predict(4000, Cached::gpu(0), &load, &COST);
        // Same prefill (800 tokens) and steps; the CPU hit adds 3200 * 0.01 ms of loading.
        assert_eq!((gpu.uncached_tokens, cpu.uncached_tokens), (800, 800));
        assert!((cpu.ttft_ms - gpu.ttft_ms - 32.0).abs() < 1e-9, "{gpu:?} {cpu:?}");
        assert!(gpu.ttft_ms < cpu.ttft_ms && cpu.ttft_ms < none.ttft_ms);
        // Reloading is not fitted: it sits in the fixed part.
        assert!((cpu.features.fixed_ms - gpu.features.fixed_ms - 32.0).abs() < 1e-9);
    }

    #[test]
    fn on_a_backlogged_fleet_the_placement_that_computes_least_wins() {
        // A follow-up: 4500 tokens, 4000 of them cached on worker A, which has 10 waiting;
        // worker B has 5 waiting and holds nothing. B answers this request sooner...
        let a = LoadView { running: 8, waiting: 10, own_waiting: 10, own_waiting_tokens: 10 * 1500, own_in_flight: 18 };
        let b = LoadView { running: 8, waiting: 5, own_waiting: 5, own_waiting_tokens: 5 * 1500, own_in_flight: 13 };
        let warm = predict(4500, Cached::gpu(4000), &a, &COST);
        let cold = predict(4500, Cached::gpu(0), &b, &COST);
        assert!(cold.ttft_ms < warm.ttft_ms, "{cold:?} {warm:?}");
        // ...but the workers it would move to (B and a third) have 5 waiting each: B's
        // 4500-token prefill delays the next five requests by 450 ms each, A's 500 by 50 ms.
        let followers = followers(&[a, b, b], &[8, 0, 0]);
        assert_eq!(followers, 5.0);
        // Only what B computes beyond A's 500 tokens is charged: 4000 tokens x 5 x 0.1 ms.
        let least = warm.uncached_tokens;
        let (warm_cost, cold_cost) = (placement_cost(&warm, COST.per_token_ms, least, followers, 1.0), placement_cost(&cold, COST.per_token_ms, least, followers, 1.0));
        assert!((warm_cost - warm.ttft_ms).abs() < 1e-9 && (cold_cost - cold.ttft_ms - 2000.0).abs() < 1e-9);
        assert!(warm_cost < cold_cost, "{warm_cost} {cold_cost}");
        // Weight 0 is the plain TTFT; the queue of the worker holding the prefix is not the
        // movers' (a burst on its prefix): they idle, no followers, the burst spreads, whatever
        // the weight.
        assert_eq!(placement_cost(&cold, COST.per_token_ms, least, followers, 0.0), cold.ttft_ms);
        let idle = LoadView::default();
        let burst = super::followers(&[a, idle, idle, idle], &[8, 0, 0, 0]);
        assert_eq!(placement_cost(&cold, COST.per_token_ms, least, burst, 4.0), cold.ttft_ms);
        // Where no placement computes less, nothing is charged, however long the queues: the
        // choice is the TTFT's.
        assert_eq!(placement_cost(&cold, COST.per_token_ms, cold.uncached_tokens, followers, 2.0), cold.ttft_ms);
        // Where all hold the same, the whole fleet's mean; our own assignments count until the
        // metrics catch up.
        assert_eq!(super::followers(&[LoadView { own_waiting: 7, waiting: 6, ..b }, a], &[1, 1]), 8.5);
        assert_eq!(super::followers(&[], &[]), 0.0);
    }

    #[test]
    fn features_reproduce_the_prediction() {
        let load = LoadView { running: 3, waiting: 5, own_waiting: 2, own_waiting_tokens: 700, own_in_flight: 4 };
        let p = predict(1000, Cached::gpu(160), &load, &COST);
        let f = p.features;
        let again = COST.overhead_ms * f.steps + COST.per_token_ms * f.tokens + f.fixed_ms;
        assert!((again - p.ttft_ms).abs() < 1e-9);
    }

    #[test]
    fn short_prefills_share_a_step() {
        // Ten queued 100-token prefills ahead fit in one 2048-token step with ours: one step's
        // overhead (plus half the step in flight), not eleven.
        let load = LoadView { running: 4, waiting: 10, own_waiting: 10, own_waiting_tokens: 1000, own_in_flight: 14 };
        let p = predict(300, Cached::gpu(200), &load, &COST);
        assert_eq!(p.features.steps, 1.5);
        assert!((p.ttft_ms - (1.5 * 10.0 + 0.1 * 1100.0 + 1.5 * 4.0 * 0.5)).abs() < 1e-9);
        // A long cold prompt on an idle worker takes ceil(8000 / 2048) = 4 steps.
        assert_eq!(predict(8000, Cached::gpu(0), &LoadView::default(), &COST).features.steps, 4.0);
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
            let base = predict(prompt, Cached::gpu(matched), &load, &COST).ttft_ms;
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
                prop_assert!(predict(prompt, Cached::gpu(matched), &heavier, &COST).ttft_ms >= base);
            }
        }

        /// A longer cached prefix never makes a worker look slower.
        #[test]
        fn predicted_ttft_is_antitonic_in_matched_tokens(load in load_strategy(), prompt in 0u32..20_000, a in 0u32..20_000, b in 0u32..20_000) {
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(predict(prompt, Cached::gpu(hi), &load, &COST).ttft_ms <= predict(prompt, Cached::gpu(lo), &load, &COST).ttft_ms);
        }
    }
}
