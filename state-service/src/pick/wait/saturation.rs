//! When a worker has room for a queued pick: the saturation rule of [`crate::sched`], and
//! what a dispatcher pass's outcome depends on.

use crate::pick::plan::{cost_of, Chosen};
use super::Scheduler;
use crate::config::Priors;
use crate::fleet::{ModelView, WorkerView};
use std::time::Duration;
use tokio::time::Instant;

impl Scheduler {
    /// Whether `w` is saturated (the rule in [`crate::sched`]) for a pick. `ahead`: one
    /// engine step (`priors`) ahead, for a pick that no worker holds any of ([`binds_for_nothing`]).
    pub(super) fn saturated(&self, w: &WorkerView, priors: &Priors, ahead: bool) -> bool {
        let c = &self.config;
        let default_request_tokens = priors.default_request_tokens;
        let at = |bound: u32, n: u32| bound > 0 && n >= bound;
        let now = if ahead { Instant::now() + one_step(w, priors) } else { Instant::now() };
        let predicted_wait = || {
            let queued_tokens = w.pending.waiting_tokens.max(u64::from(w.load.waiting) * u64::from(default_request_tokens));
            queued_tokens as f64 * w.per_token_ms
        };
        at(c.max_engine_waiting, w.load.waiting)
            || at(c.max_unstarted, w.pending.unstarted_at(now))
            || (c.max_unstarted_tokens > 0 && w.pending.waiting_tokens >= c.max_unstarted_tokens)
            || w.load.kv_usage >= c.max_kv_usage
            || (c.saturation_wait_ms > 0.0 && predicted_wait() >= c.saturation_wait_ms)
    }
}

/// A pick no candidate holds any of its prompt: binding it late gains nothing (its candidates
/// differ only in when they free, which its prediction sees now), so it may go to a worker
/// one engine step before the pick there is due, and fill the step that ends that prefill
/// (vLLM fills a step's token budget from its waiting queue). A pick that some worker holds
/// part of waits for the pick there to be due: the worker best for it then may be another.
pub(super) fn binds_for_nothing(chosen: &Chosen) -> bool {
    chosen.candidates.iter().all(|c| c.matched == 0)
}

/// One engine step on `w`: a full token budget at its calibrated cost.
fn one_step(w: &WorkerView, priors: &Priors) -> Duration {
    Duration::try_from_secs_f64(cost_of(w, priors).step_ms() / 1000.0).unwrap_or_default()
}

/// What a pass's outcome depends on besides the clock: each worker's load and our picks on
/// it, and the queue's length.
pub(super) fn signature(view: &ModelView, priors: &Priors, queued: usize) -> u64 {
    use std::hash::{Hash, Hasher};
    let (mut h, now) = (std::collections::hash_map::DefaultHasher::new(), Instant::now());
    queued.hash(&mut h);
    for w in &view.workers {
        w.entry.id.hash(&mut h);
        (w.load.waiting, w.load.running, w.load.kv_usage.to_bits()).hash(&mut h);
        let ahead = w.pending.unstarted_at(now + one_step(w, priors));
        (w.pending.in_flight, w.pending.unstarted_at(now), ahead, w.pending.waiting_tokens).hash(&mut h);
    }
    h.finish()
}
