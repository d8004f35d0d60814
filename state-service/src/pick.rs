//! The pick: from a [`PickRequest`] to a worker, an assignment and a [`PickResponse`].
//!
//! [`Picker::pick`] runs five stages, each a submodule, in this order:
//! 1. [`prompt`]: the prompt as keys: exact block keys (token ids from the filter, or text and
//!    chat prompts tokenized here within the pick's deadline), else the filter's text chunks;
//! 2. [`affinity`]: a Responses API continuation is pinned to the worker that stored it (and
//!    only its tenant reaches it);
//! 3. [`plan`]: one snapshot of the model's healthy workers, every candidate's match,
//!    prediction and cost, and the policy's pure choice ([`kvroute_score::choose`]) with this
//!    pick's own rng; or the proxy's default route. With `[scheduling]` on, a pick whose
//!    chosen worker is saturated is queued instead ([`wait`]) and planned again, over all its
//!    candidates, until the worker it is best on has room;
//! 4. [`admit`]: the tenant's budget reserves what the request will cost, routed or not;
//! 5. [`commit`]: the assignment is recorded (and shared), the answer built.
//!
//! Routing fails open, admission never does. Unknown models, fleets without a healthy worker
//! and bodies the proxy could not read answer 200 with an empty worker and a degraded reason:
//! the proxy then uses its default route. But such a request reaches a worker all the same,
//! so it is admitted and charged like any other (an unread body its stated worst case) and,
//! when a budget applies, recorded without a worker so its outcome settles the charge.
//!
//! The prediction is computed for every policy, so the predicted-vs-actual metric and
//! calibration work whichever policy a benchmark pass runs.

pub mod admit;
pub mod affinity;
pub mod commit;
pub mod metrics;
pub mod plan;
pub mod prompt;
pub mod wait;

pub use metrics::PickMetrics;
pub use wait::{Picked, Scheduler};
pub use prompt::{PromptView, MAX_PICK_KEYS};

use crate::assign::AssignmentId;
use crate::config::{Config, Priors};
use crate::fleet::{End, Fleet};
use crate::stored::Owners;
use crate::store::ResponseDirectory;
use crate::tenancy::{Admission, Tenants};
use crate::tokenization::Tokenization;
use affinity::Target;
use plan::Plan;
use kvroute_core::wire::{DegradedReason, LocateRequest, PickRequest, PickResponse, Rejection, TokenizationPath};
use kvroute_score::{Policy, Selector};
use parking_lot::RwLock;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The slice of the configuration the pick reads.
#[derive(Clone, Debug)]
pub struct PickConfig {
    pub text_chunk_bytes: u32,
    pub affinity_tolerance: f64,
    pub queue_externality: f64,
    pub priors: Priors,
    /// Next-best workers named for the proxy's failover.
    pub fallback_workers: usize,
    /// The model of a request that names none (else the fleet's only model).
    pub default_model: Option<String>,
    /// Admission: each model's context length, the default for the others, and what a
    /// request without an output limit reserves (`None`: up to the context).
    pub max_model_len: std::collections::BTreeMap<String, u32>,
    pub default_max_model_len: u32,
    pub default_output_tokens: Option<u32>,
    /// Pools of workers by label (`pools.rs`).
    pub pools: std::collections::BTreeMap<String, crate::pools::PoolConfig>,
}

impl PickConfig {
    /// `model`'s context length (prompt plus output of one sequence).
    pub fn max_model_len(&self, model: &str) -> u32 {
        self.max_model_len.get(model).copied().unwrap_or(self.default_max_model_len)
    }

    /// The largest context of any model: the worst case of a request whose model is unknown.
    pub fn largest_max_model_len(&self) -> u32 {
        self.max_model_len.values().copied().chain([self.default_max_model_len]).max().unwrap_or(self.default_max_model_len)
    }
}

impl From<&Config> for PickConfig {
    fn from(c: &Config) -> PickConfig {
        PickConfig {
            text_chunk_bytes: c.text_chunk_bytes,
            affinity_tolerance: c.affinity_tolerance,
            queue_externality: c.queue_externality,
            priors: c.priors.clone(),
            fallback_workers: c.resilience.fallback_workers,
            default_model: c.default_model.clone(),
            max_model_len: c.models.iter().filter_map(|(m, mc)| mc.max_model_len.map(|l| (m.clone(), l))).collect(),
            default_max_model_len: c.tenancy.max_model_len,
            default_output_tokens: c.tenancy.default_output_tokens,
            pools: c.pools.clone(),
        }
    }
}

/// When the proxy stops waiting for a pick.
#[derive(Clone, Copy, Debug, Default)]
pub struct Deadline {
    /// Tokenizing gives up at this instant (the pick then uses text-chunk keys), whatever
    /// `tokenization.deadline_ms` allows: the decision and the answer's trip back need the rest.
    pub tokenize_until: Option<Instant>,
    /// The proxy has routed the request elsewhere by then: a pick decided later is cancelled
    /// at once, so it leaves no load behind.
    pub answer_by: Option<Instant>,
    /// The proxy's timeout for this call.
    pub timeout: Option<Duration>,
}

impl Deadline {
    /// The proxy's timeout `timeout`, counted from `arrived`.
    pub fn after(arrived: Instant, timeout: Duration) -> Deadline {
        Deadline { tokenize_until: Some(arrived + timeout.mul_f64(0.7)), answer_by: Some(arrived + timeout), timeout: Some(timeout) }
    }
}

/// Decides picks. Owns what it decides with: the fleet, tokenization, the tenants' budgets,
/// the stored responses' owners, its selector, the policy in force, its configuration and
/// its metrics.
pub struct Picker {
    fleet: Arc<Fleet>,
    tokenization: Arc<Tokenization>,
    tenants: Arc<Tenants>,
    owners: Arc<Owners>,
    responses: Arc<dyn ResponseDirectory>,
    selector: Selector,
    policy: RwLock<Policy>,
    config: PickConfig,
    metrics: PickMetrics,
    sched: Scheduler,
}

/// What a [`Picker`] is built from.
pub struct PickerParts {
    pub fleet: Arc<Fleet>,
    pub tokenization: Arc<Tokenization>,
    pub tenants: Arc<Tenants>,
    pub owners: Arc<Owners>,
    pub responses: Arc<dyn ResponseDirectory>,
}

impl Picker {
    pub fn new(parts: PickerParts, config: &Config, registry: &mut crate::metrics::Registry) -> Picker {
        let PickerParts { fleet, tokenization, tenants, owners, responses } = parts;
        Picker {
            fleet,
            tokenization,
            tenants,
            owners,
            responses,
            selector: Selector::new(config.seed),
            policy: RwLock::new(config.policy),
            config: PickConfig::from(config),
            metrics: PickMetrics::register(registry),
            sched: Scheduler::new(config.scheduling.clone(), registry),
        }
    }

    /// Decides where `req` goes, waiting in the queue as long as it takes (in-process callers;
    /// the API holds a proxy's call only `scheduling.wait_ms`, see [`Picker::pick_or_queue`]).
    pub async fn pick(&self, req: &PickRequest, deadline: Deadline) -> PickResponse {
        match self.pick_or_queue(req, deadline).await {
            Picked::Decided(response) => response,
            Picked::Queued(waiting) => waiting.decision().await,
        }
    }

    /// Decides where `req` goes (see the module docs for the stages), or queues it.
    pub async fn pick_or_queue(&self, req: &PickRequest, deadline: Deadline) -> Picked {
        let arrived = Instant::now();
        let req = &self.with_model(req);
        if req.ticket != 0 && self.sched.enabled() {
            if let Some(picked) = self.resume_ticket(req, deadline.timeout) {
                return picked;
            }
        }
        let policy = self.policy();
        let prompt = self.prompt(policy, req, deadline.tokenize_until).await;
        // `pick_latency_seconds` is the decision; tokenizing has its own `tokenize_seconds`.
        let started = Instant::now();
        let plan = match self.target(req).await {
            Target::Unread => Plan::Fallback(self.fallback(policy, req, DegradedReason::DegradedUnreadBody)),
            Target::Gone => Plan::Fallback(self.fallback(policy, req, DegradedReason::DegradedResponseOwnerGone)),
            Target::NotFound => Plan::Fallback(self.fallback(policy, req, DegradedReason::DegradedResponseNotFound)),
            // A continued conversation goes to its one worker whatever its load.
            Target::Workers { view, continued: 0 } if self.sched.enabled() => match self.maybe_queue(policy, req, &view, prompt) {
                Ok(picked) => return picked,
                Err(plan) => *plan,
            },
            Target::Workers { view, continued } => self.plan(policy, req, view, prompt, continued),
        };
        let response = self.admit_and_commit(policy, req, plan, started).await;
        self.metrics.answer.observe(arrived.elapsed().as_secs_f64());
        if deadline.answer_by.is_some_and(|by| Instant::now() > by) && response.assignment_id != 0 {
            self.abandon(AssignmentId(response.assignment_id));
        }
        Picked::Decided(response)
    }

    /// Stages 4 and 5: the budget, then the record and the answer; counted.
    async fn admit_and_commit(&self, policy: Policy, req: &PickRequest, plan: Plan, started: Instant) -> PickResponse {
        let response = match self.admit(req, &plan).await {
            (_, Admission::Rejected(rejection)) => rejected(policy, rejection),
            (reservation, admission) => self.commit(req, plan, reservation, admission.scope().cloned()),
        };
        self.finish(policy, started, response)
    }

    /// Where a stored Responses API response lives (the proxy's `GET` / `DELETE` / cancel on
    /// `/v1/responses/{id}`): a `PickResponse` naming its worker, no assignment recorded.
    /// For a request with a tenant, another tenant's response, or one not known here, is not
    /// found (the proxy answers vLLM's 404).
    pub async fn locate(&self, req: &LocateRequest) -> PickResponse {
        let mut response = PickResponse { policy: "affinity".into(), ..PickResponse::default() };
        let owner = self.owner(&req.response_id, "locate").await;
        if owner.as_ref().is_none_or(|o| !o.visible_to(&req.tenant)) && !req.tenant.is_empty() {
            // Another tenant's, or one not known yet that the default route might reach.
            self.metrics.count_affinity("locate", "not_found");
            response.set_degraded_reason(DegradedReason::DegradedResponseNotFound);
            return response;
        }
        if let Some(owner) = owner.filter(|o| o.visible_to(&req.tenant)) {
            match self.fleet.worker(owner.worker.as_str()) {
                Some(w) => {
                    self.metrics.count_affinity("locate", "routed");
                    response.worker_id = w.id.to_string();
                    response.endpoint = w.config.endpoint.clone();
                    response.cluster = w.config.cluster.clone();
                }
                None => {
                    self.metrics.count_affinity("locate", "gone");
                    response.set_degraded_reason(DegradedReason::DegradedResponseOwnerGone);
                }
            }
        }
        tracing::debug!(request_id = %req.request_id, response = %req.response_id, worker = %response.worker_id, "locate");
        response
    }

    /// `req` with its model resolved: a request without one is served by the default model
    /// (`default_model`, else the fleet's only model), as vLLM serves its first model.
    fn with_model<'a>(&self, req: &'a PickRequest) -> std::borrow::Cow<'a, PickRequest> {
        if !req.model.is_empty() {
            return std::borrow::Cow::Borrowed(req);
        }
        let model = self.config.default_model.clone().or_else(|| self.fleet.only_model());
        match model {
            Some(model) => std::borrow::Cow::Owned(PickRequest { model, ..req.clone() }),
            None => std::borrow::Cow::Borrowed(req),
        }
    }

    pub fn policy(&self) -> Policy {
        *self.policy.read()
    }

    /// Switches the policy; returns the previous one.
    pub fn set_policy(&self, policy: Policy) -> Policy {
        std::mem::replace(&mut *self.policy.write(), policy)
    }

    /// Forgets what was learned from traffic (see [`Fleet::reset`]) and restarts round robin.
    pub fn reset(&self) {
        self.fleet.reset();
        self.selector.reset();
    }

    /// The proxy gave up on this pick before its answer: nothing of it may stay (its
    /// reservation is given back).
    fn abandon(&self, id: AssignmentId) {
        if let Some(a) = self.fleet.finish(id, End::Cancelled, crate::tenancy::Ending::default(), tokio::time::Instant::now()) {
            // Never served: its reservation, if it made one, is given back.
            if let Some(scope) = a.budget {
                self.tenants.settle(scope, id.0, 0, a.reserved);
            }
        }
        self.metrics.picks_abandoned.inc();
    }

    /// Counts a decided pick.
    fn finish(&self, policy: Policy, started: Instant, response: PickResponse) -> PickResponse {
        self.metrics.count_pick(policy, &response, started.elapsed());
        response
    }

    /// The proxy's default route, counted and logged with `reason`.
    fn fallback(&self, policy: Policy, req: &PickRequest, reason: DegradedReason) -> PickResponse {
        self.metrics.count_degraded(reason);
        tracing::info!(request_id = %req.request_id, model = %req.model, reason = reason.label(), "pick fell back to the default route");
        let mut response = PickResponse { policy: policy.to_string(), ..Default::default() };
        response.set_tokenization(TokenizationPath::TokenizationNone);
        response.set_degraded_reason(reason);
        response
    }
}

/// The answer to a pick its tenant's budget did not admit: no worker, nothing recorded.
fn rejected(policy: Policy, rejection: Rejection) -> PickResponse {
    let mut response = PickResponse { policy: policy.to_string(), rejection: Some(rejection), ..Default::default() };
    response.set_tokenization(TokenizationPath::TokenizationNone);
    response
}
