//! Headroom (`headroom_workers`, the rule in [`crate::sched`]): which flows are active, which
//! workers are kept from a backlogged flow, and which are shielded while they prefill a pick
//! of a flow under its share. Pure bookkeeping on the caller's clock; the dispatcher
//! ([`super`]) applies it.

use crate::fleet::WorkerView;
use crate::sched::FLOW_MEMORY;
use kvroute_kv::types::WorkerId;
use std::collections::{HashMap, HashSet};
use tokio::time::Instant;

/// A flow: a service class and a tenant.
type Flow = (String, String);

#[derive(Default)]
pub(super) struct Headroom {
    /// Per model, when each flow last placed a pick.
    flows: HashMap<String, HashMap<Flow, Instant>>,
    /// Workers a pick of a flow under its share went to, until its predicted first token.
    shielded: HashMap<WorkerId, Instant>,
}

impl Headroom {
    /// A pick of the flow (`class`, `tenant`) of `model` was placed: the flow is active.
    pub(super) fn placed(&mut self, model: &str, class: &str, tenant: &str, now: Instant) {
        let flows = self.flows.entry(model.to_string()).or_default();
        flows.retain(|_, at| now.duration_since(*at) < FLOW_MEMORY);
        flows.insert((class.to_string(), tenant.to_string()), now);
    }

    /// Whether a pick of a `backlogged` flow (more of its picks wait behind it) leaves
    /// headroom free: while another flow of the model is active.
    pub(super) fn keeps(&self, model: &str, class: &str, tenant: &str, backlogged: bool, now: Instant) -> bool {
        let other_active = |flows: &HashMap<Flow, Instant>| {
            flows.iter().any(|((c, t), at)| (c != class || t != tenant) && now.duration_since(*at) < FLOW_MEMORY)
        };
        backlogged && self.flows.get(model).is_some_and(other_active)
    }

    /// Keeps `worker` for the pick of a flow under its share it now prefills, until `until`.
    pub(super) fn shield(&mut self, worker: &WorkerId, until: Instant) {
        self.shielded.insert(worker.clone(), until);
    }

    /// Takes from `workers` the `n` kept from a backlogged flow: first those shielded, then
    /// those with the fewest of our picks waiting to start (the first listed on ties), which
    /// drain to free and stay free for others.
    pub(super) fn leave(&self, workers: &mut Vec<WorkerView>, n: usize, now: Instant) {
        let shielded = |w: &WorkerView| self.shielded.get(&w.entry.id).is_some_and(|until| *until > now);
        let mut by_unstarted: Vec<usize> = (0..workers.len()).collect();
        by_unstarted.sort_by_key(|&i| (!shielded(&workers[i]), workers[i].pending.waiting));
        let kept: HashSet<usize> = by_unstarted.into_iter().take(n).collect();
        let mut i = 0;
        workers.retain(|_| {
            i += 1;
            !kept.contains(&(i - 1))
        });
    }
}
