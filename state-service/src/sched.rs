//! Scheduling: picks wait in the state service, not in a worker's queue, while the worker that
//! would serve them best is saturated, and are bound to a worker only when one has room.
//!
//! The rule (all stated in [`SchedulingConfig`]): a worker is *saturated* when `max_unstarted`
//! of our picks there still lack a first token (from the proxy's reports; one fewer counts
//! once all of them are past their predicted first token, since a proxy sends reports on its
//! tick: else the engine would idle until the report came; a first-token report makes the
//! picks behind it due within their own prefill, since their predictions counted its prefill
//! as their queue; for a pick that no worker holds any of, one fewer counts one engine step
//! sooner, so that vLLM fills the step that ends the last prefill from its waiting queue:
//! binding such a pick late gains nothing, its candidates differ only in when they free), or
//! its KV cache is at least `max_kv_usage` full, or (each off at 0, the default) its engine
//! already queues `max_engine_waiting` requests (scraped `num_requests_waiting`: up to a scrape
//! interval stale, for workers that also serve traffic this router does not place), or our
//! unstarted picks there hold `max_unstarted_tokens` prompt tokens, or the prefill waiting
//! there would delay a new request `saturation_wait_ms` at its calibrated per-token cost. A pick waits when the worker the policy picks for it (over all its
//! candidates, saturated or not) is saturated, or when picks of its model already wait (then
//! it takes its turn in the queue's order); a pick whose best worker has room never waits.
//! Waiting in the router takes the place of waiting in that engine's queue: the engine still
//! holds up to `max_unstarted` of our requests to start, and the pick is bound only when a
//! worker has room, to the worker that is best then.
//!
//! The order ([`queue::Queue`]): service classes strictly by their order; within a class,
//! tenants by deficit round robin over the prefill tokens their requests are predicted to
//! cost (weights from `[scheduling.tenants]`); within a tenant, shortest predicted prefill
//! first, aged so that a request is overtaken by newer, shorter ones for at most
//! `aging_slowdown` times its own predicted prefill time (its tokens at the model's median
//! calibrated cost per token: the bound is in the engines' time, whatever their speed). Every
//! queued request leaves by its class's `queue_deadline_ms`: dispatched, or shed with a 503
//! and `Retry-After`; under overload that outlasts a class's deadline, the longest prompts,
//! the most overtaken, are the first shed.
//!
//! Headroom (`headroom_workers`, off by default): a flow (a class and tenant) that has more
//! picks queued behind the one being dispatched is over its share; while another flow of the
//! model placed a pick in the last [`FLOW_MEMORY`], such a pick may not take the
//! `headroom_workers` workers of its pool with the fewest of our picks waiting to start. Kept
//! from the backlog, they drain, and a request of a flow under its share finds one not busy
//! with a prefill: its TTFT is its own prefill, not the rest of another's (a step cannot be
//! interrupted). Until such a pick's predicted first token its worker is the first of those
//! kept, so that no backlogged prefill joins the step that prefills it. Not work-conserving: a backlogged flow leaves `headroom_workers` workers'
//! prefill capacity to the others while they are active (all of its pool when the pool has no
//! more workers than that), and takes all of it once they have been quiet.
//!
//! The proxy waits in steps of `wait_ms` (see `PickResponse.queued`), so a replica that dies
//! or freezes while holding queued picks costs each a fallback after at most one step plus the
//! filter's margin, and a step that lands on another replica queues the pick there with the
//! seniority it had (`PickRequest.queued_ms`). A call that comes for a ticket while a
//! dispatcher pass has it out of the queue waits for that pass's decision; it is never queued
//! anew, which would dispatch it twice.

pub mod queue;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a flow that placed a pick counts as active, for `headroom_workers`.
pub const FLOW_MEMORY: Duration = Duration::from_secs(10);

/// `[scheduling]`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulingConfig {
    /// Queue picks while every worker is saturated (off: every pick is placed at once, as
    /// before scheduling existed).
    pub enabled: bool,
    /// A worker is saturated when its engine queues this many requests (0, the default: off).
    /// Read from scrapes, so up to a scrape interval stale: a worker whose queued request
    /// started stays "saturated" until the next scrape. For workers that also serve traffic
    /// this router does not place; its own picks are counted at once by `max_unstarted`.
    pub max_engine_waiting: u32,
    /// ... or this many of our picks there lack a first token (0: off); once every one of
    /// them is past its predicted first token, one fewer counts (the report is on its way),
    /// one engine step sooner for a pick that no worker holds any of.
    pub max_unstarted: u32,
    /// ... or the prefill waiting there would delay a new request this long (ms; 0: off).
    pub saturation_wait_ms: f64,
    /// ... or when its KV cache is at least this full (0..1, scraped `kv_cache_usage_perc`).
    pub max_kv_usage: f64,
    /// ... or our picks there that lack a first token hold this many uncached prompt tokens
    /// (0: off; Dynamo's router queue: its threshold fraction x `max_num_batched_tokens`).
    pub max_unstarted_tokens: u64,
    /// When a pick waits: `best_saturated` (the worker the policy picks for it, over all its
    /// candidates, is saturated) or `all_saturated` (every candidate is; the rule of llm-d's
    /// flow control and of Dynamo's router queue, kept to compare with them).
    pub wait_when: WaitWhen,
    /// The order within a tenant: `shortest_first` (predicted prefill, aged by
    /// `aging_slowdown`) or `fifo` (arrival; llm-d's and Dynamo's order).
    pub order: Order,
    /// How long one call of the proxy is held waiting for a decision (ms): also the most a
    /// replica that dies holding a queued pick can cost it before the proxy falls back.
    pub wait_ms: u32,
    /// A decision made while its proxy was between two calls is kept this long for the next
    /// call (ms); then its assignment is cancelled (the proxy went elsewhere).
    pub unclaimed_ms: u64,
    /// Workers kept free of new prefills for flows under their share while a backlogged flow
    /// waits (0: off; the rule is in [`crate::sched`]).
    pub headroom_workers: u32,
    /// Within a tenant, shortest first: a queued request is overtaken by newer, shorter ones
    /// for at most this many times its own predicted prefill time (ms waited earn priority
    /// worth `1 / aging_slowdown` ms of prefill).
    pub aging_slowdown: f64,
    /// Deficit round robin quantum: prefill tokens a tenant of weight 1 may dispatch per round.
    pub quantum_tokens: u64,
    /// Most picks queued per model; more are shed at once.
    pub max_queued: usize,
    /// The class of a request whose proxy and tenant name none.
    pub default_class: String,
    /// Service classes by name.
    pub classes: BTreeMap<String, ClassConfig>,
    /// Tenant -> its class and fair-share weight.
    pub tenants: BTreeMap<String, TenantSchedule>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WaitWhen {
    #[default]
    BestSaturated,
    AllSaturated,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    #[default]
    ShortestFirst,
    Fifo,
}

/// One service class.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClassConfig {
    /// Lower goes first; classes with the same order are served as one, by their names.
    pub order: u32,
    /// Longest wait in the queue (ms); 0: never waits (shed at once when saturated).
    pub queue_deadline_ms: u64,
}

impl Default for ClassConfig {
    fn default() -> Self {
        ClassConfig { order: 1, queue_deadline_ms: 10_000 }
    }
}

/// A tenant's place in the schedule.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TenantSchedule {
    /// The tenant's class when the proxy names none (empty: `default_class`).
    pub class: String,
    /// Its share of a class's capacity against other tenants (1 = equal).
    pub weight: u32,
}

impl Default for TenantSchedule {
    fn default() -> Self {
        TenantSchedule { class: String::new(), weight: 1 }
    }
}

impl Default for SchedulingConfig {
    fn default() -> Self {
        let class = |order, queue_deadline_ms| ClassConfig { order, queue_deadline_ms };
        SchedulingConfig {
            enabled: false,
            max_engine_waiting: 0,
            max_unstarted: 1,
            saturation_wait_ms: 0.0,
            max_kv_usage: 0.97,
            max_unstarted_tokens: 0,
            wait_when: WaitWhen::BestSaturated,
            order: Order::ShortestFirst,
            wait_ms: 500,
            unclaimed_ms: 2_000,
            headroom_workers: 0,
            aging_slowdown: 10.0,
            quantum_tokens: 8_192,
            max_queued: 10_000,
            default_class: "standard".into(),
            classes: BTreeMap::from([
                ("interactive".into(), class(0, 5_000)),
                ("standard".into(), class(1, 20_000)),
                ("batch".into(), class(2, 120_000)),
                ("sheddable".into(), class(3, 0)),
            ]),
            tenants: BTreeMap::new(),
        }
    }
}

impl SchedulingConfig {
    /// Problems with the configuration, for the validator.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.classes.contains_key(&self.default_class) {
            out.push(format!("scheduling.default_class {:?} is not in scheduling.classes", self.default_class));
        }
        for (tenant, t) in &self.tenants {
            if !t.class.is_empty() && !self.classes.contains_key(&t.class) {
                out.push(format!("scheduling.tenants.{tenant}.class {:?} is not in scheduling.classes", t.class));
            }
            if t.weight == 0 {
                out.push(format!("scheduling.tenants.{tenant}.weight must be at least 1"));
            }
        }
        if self.wait_ms == 0 || self.quantum_tokens == 0 || self.max_queued == 0 {
            out.push("scheduling.wait_ms, quantum_tokens and max_queued must be positive".into());
        }
        if self.max_engine_waiting == 0 && self.max_unstarted == 0 && self.max_unstarted_tokens == 0 && self.saturation_wait_ms == 0.0 && self.max_kv_usage >= 1.0 {
            out.push("scheduling: every saturation bound is off, so nothing would ever wait".into());
        }
        if !(self.saturation_wait_ms >= 0.0 && self.aging_slowdown > 0.0 && self.max_kv_usage > 0.0) {
            out.push("scheduling.saturation_wait_ms must be >= 0, aging_slowdown and max_kv_usage > 0".into());
        }
        out
    }

    /// The class a request is scheduled in: the proxy's (when it names a configured class),
    /// else its tenant's, else the default.
    pub fn class_of<'a>(&'a self, named: &'a str, tenant: &str) -> &'a str {
        if self.classes.contains_key(named) {
            return named;
        }
        match self.tenants.get(tenant) {
            Some(t) if !t.class.is_empty() => &t.class,
            _ => &self.default_class,
        }
    }

    /// The aging rate the queue orders a tenant's picks by, in prefill tokens of priority per
    /// second waited, for workers that prefill a token in `per_token_ms`: a request of `c`
    /// tokens is overtaken for at most `c / rate` s = `aging_slowdown` x its prefill time.
    /// FIFO is infinite aging (the oldest first, whatever its cost).
    pub fn aging_per_s(&self, per_token_ms: f64) -> f64 {
        match self.order {
            Order::ShortestFirst => 1_000.0 / (per_token_ms.max(1e-6) * self.aging_slowdown),
            Order::Fifo => f64::INFINITY,
        }
    }

    pub fn weight_of(&self, tenant: &str) -> u32 {
        self.tenants.get(tenant).map_or(1, |t| t.weight.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aging_bounds_how_long_a_request_is_overtaken_in_the_engines_time() {
        let c = SchedulingConfig { aging_slowdown: 10.0, ..SchedulingConfig::default() };
        // 0.3 ms a token: a 10,000-token prompt prefills in 3 s and is overtaken for 30 s.
        let rate = c.aging_per_s(0.3);
        assert!((10_000.0 / rate - 30.0).abs() < 1e-9, "{rate}");
        // Engines four times as fast: the same prompt is overtaken a quarter as long.
        assert!((10_000.0 / c.aging_per_s(0.075) - 7.5).abs() < 1e-9);
        let fifo = SchedulingConfig { order: Order::Fifo, ..c };
        assert!(fifo.aging_per_s(0.3).is_infinite());
    }
}
