//! Stage 5: the record and the answer. The decision becomes an assignment (shared with the
//! other replicas by the fleet); kvroute credits the worker with exact keys until its events
//! arrive, and the approximate policies remember the text chunks they routed. A request the
//! default route takes is recorded too when a budget admitted it, without a worker (it loads
//! none), so its outcome settles what it was charged.

use super::admit::Reservation;
use super::plan::{peer_keys, Candidate, Chosen, Plan};
use super::{Picker, PromptView};
use crate::assign::{Assignment, AssignmentId};
use crate::fleet::Assigned;
use crate::tenancy::Scope;
use kvroute_core::wire::{DegradedReason, PickRequest, PickResponse, TokenizationPath};
use kvroute_kv::types::{BlockKey, WorkerId};
use kvroute_score::Policy;
use rand::RngCore;
use std::sync::Arc;

impl Picker {
    /// Records `plan` under the reservation's assignment id and answers it; `budget`: the
    /// scope admission reserved it under.
    pub(super) fn commit(&self, req: &PickRequest, plan: Plan, reservation: Reservation, budget: Option<Scope>) -> PickResponse {
        match plan {
            Plan::Chosen(chosen) => self.commit_chosen(req, chosen, reservation, budget),
            Plan::Fallback(mut response) => {
                if let Some(scope) = budget {
                    response.assignment_id = self.record_unrouted(req, reservation, scope).0;
                }
                response
            }
        }
    }

    /// Records a request the default route takes, for its settlement only.
    fn record_unrouted(&self, req: &PickRequest, reservation: Reservation, scope: Scope) -> AssignmentId {
        let now = tokio::time::Instant::now();
        let prompt_tokens = u32::try_from(reservation.tokens).unwrap_or(u32::MAX).min(req.prompt_tokens.max(req.prompt_bytes));
        let assignment = Assignment {
            id: AssignmentId(reservation.id),
            worker: WorkerId::new(""),
            policy: self.policy(),
            prompt_tokens,
            uncached_tokens: prompt_tokens,
            predicted_ttft_ms: 0.0,
            features: Default::default(),
            created_at: now,
            first_token_at: None,
            predicted_cached_tokens: None,
            budget: Some(scope.clone()),
            reserved: reservation.tokens,
            background: req.background,
        };
        match self.fleet.assign(&assignment, &Arc::from([]), now) {
            Assigned::Recorded => {}
            // Cancelled already, or the id taken (a replayed pick): nothing is owed.
            Assigned::Abandoned | Assigned::Taken => self.tenants.settle(scope, reservation.id, 0, reservation.tokens),
        }
        assignment.id
    }

    fn commit_chosen(&self, req: &PickRequest, chosen: Chosen, reservation: Reservation, budget: Option<Scope>) -> PickResponse {
        let id = self.record(req, &chosen, reservation, budget);
        let Chosen { policy, prompt, candidates, at, continued, .. } = chosen;
        // A continued conversation's blocks are held by its worker, ahead of the prompt's own.
        let continued_blocks = continued / prompt.tokens_per_key.max(1);
        let chosen = &candidates[at];
        let degraded = degraded_reason(policy, prompt.limitation)
            .or_else(|| self.fleet.replication().degraded().then_some(DegradedReason::DegradedStateUnavailable));
        if let Some(reason) = degraded {
            self.metrics.count_degraded(reason);
        }
        if !prompt.keys.is_empty() {
            self.metrics.matched_prefix_ratio.observe(f64::from(chosen.matched) / prompt.keys.len() as f64);
        }
        let entry = &chosen.worker;
        tracing::debug!(request_id = %req.request_id, worker = %entry.id, %policy, matched = chosen.matched,
            predicted_ms = chosen.prediction.ttft_ms, "pick");
        let mut response = PickResponse {
            assignment_id: id.0,
            worker_id: entry.id.to_string(),
            endpoint: entry.config.endpoint.clone(),
            cluster: entry.config.cluster.clone(),
            matched_blocks: chosen.matched + continued_blocks,
            total_blocks: prompt.keys.len() as u32 + continued_blocks,
            predicted_ttft_ms: chosen.prediction.ttft_ms,
            policy: policy.to_string(),
            ..Default::default()
        };
        response.fallback_endpoints = runners_up(&candidates, at, self.config.fallback_workers);
        response.set_tokenization(tokenization(policy, &prompt));
        response.set_degraded_reason(degraded.unwrap_or(DegradedReason::DegradedNone));
        response
    }

    /// Records the decision; returns its id (the proxy's own, unless taken).
    fn record(&self, req: &PickRequest, chosen: &Chosen, reservation: Reservation, budget: Option<Scope>) -> AssignmentId {
        let Chosen { policy, prompt, now, .. } = chosen;
        let (policy, now) = (*policy, *now);
        let candidate = chosen.candidate();
        let mut rng = self.selector.rng();
        let worker = &candidate.worker.id;
        let credit: Arc<[BlockKey]> = if policy == Policy::Kvroute && prompt.exact { prompt.keys.clone() } else { Arc::from([]) };
        let predicted_cached_tokens = prompt.exact.then(|| {
            // vLLM recomputes a fully cached prompt's last token: hits stop at the full blocks
            // before it.
            let block = prompt.tokens_per_key.max(1);
            let cacheable = prompt.prompt_tokens.saturating_sub(1) / block * block;
            candidate.matched.saturating_mul(block).min(cacheable)
        });
        // The proxy's own id first (it cancels by it); a random one when it named none or the
        // id is taken.
        let mut next = (reservation.id != 0).then_some(reservation.id);
        loop {
            let id = AssignmentId(next.take().unwrap_or_else(|| rng.next_u64() ^ self.fleet.replication().id_salt()));
            if id.0 == 0 {
                continue;
            }
            let assignment = Assignment {
                id,
                worker: worker.clone(),
                policy,
                prompt_tokens: prompt.prompt_tokens,
                uncached_tokens: candidate.prediction.uncached_tokens,
                predicted_ttft_ms: candidate.prediction.ttft_ms,
                features: candidate.prediction.features,
                created_at: now,
                first_token_at: None,
                predicted_cached_tokens,
                budget: budget.clone(),
                reserved: if budget.is_some() { reservation.tokens } else { 0 },
                background: req.background,
            };
            match self.fleet.assign(&assignment, &credit, now) {
                // Taken (2^-64 odds, or a replica sharing seed and salt): drawn again rather than
                // shadowing a live assignment.
                Assigned::Taken => continue,
                // The proxy cancelled it already: nothing is recorded or learned.
                Assigned::Abandoned => {
                    self.metrics.picks_abandoned.inc();
                    if let Some(scope) = budget {
                        self.tenants.settle(scope, id.0, 0, reservation.tokens);
                    }
                    return id;
                }
                Assigned::Recorded => {}
            }
            match policy {
                Policy::Kvroute if prompt.exact => {}
                Policy::Kvroute => self.fleet.learn(&prompt.keys, worker),
                Policy::SglangCacheAware | Policy::LlmdDefault => self.fleet.peer_learn(policy, peer_keys(policy, prompt), worker),
                _ => {}
            }
            return id;
        }
    }
}

/// Where the proxy fails over when the chosen worker cannot be reached: the other candidates'
/// endpoints, fastest predicted first (whatever the policy: availability, not placement), `n`
/// at most.
fn runners_up(candidates: &[Candidate], chosen: usize, n: usize) -> Vec<String> {
    let mut others: Vec<&Candidate> =
        candidates.iter().enumerate().filter(|(i, c)| *i != chosen && !c.worker.config.endpoint.is_empty()).map(|(_, c)| c).collect();
    others.sort_by(|a, b| a.prediction.ttft_ms.total_cmp(&b.prediction.ttft_ms));
    others.iter().take(n).map(|c| c.worker.config.endpoint.clone()).collect()
}

/// Which prompt limitations degrade which policy: kvroute and Dynamo want exact keys; the
/// approximate routers live on text chunks anyway but lose token keys cut with the wrong
/// block size.
fn degraded_reason(policy: Policy, limitation: Option<DegradedReason>) -> Option<DegradedReason> {
    match (policy, limitation) {
        (Policy::Kvroute | Policy::DynamoKv, reason) => reason,
        (Policy::SglangCacheAware | Policy::LlmdDefault, Some(DegradedReason::DegradedBlockSizeMismatch)) => {
            Some(DegradedReason::DegradedBlockSizeMismatch)
        }
        _ => None,
    }
}

fn tokenization(policy: Policy, prompt: &PromptView) -> TokenizationPath {
    match policy {
        Policy::Random | Policy::RoundRobin | Policy::LeastLoaded => TokenizationPath::TokenizationNone,
        _ if prompt.keys.is_empty() => TokenizationPath::TokenizationNone,
        _ => prompt.tokenization,
    }
}
