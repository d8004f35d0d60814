//! The pick: from a [`PickRequest`] to a worker, an assignment and a [`PickResponse`].
//!
//! [`Picker::pick`] runs five stages, each a submodule, in this order:
//! 1. [`prompt`]: the prompt as keys: exact block keys (token ids from the filter, or text and
//!    chat prompts tokenized here within the pick's deadline), else the filter's text chunks;
//! 2. [`affinity`]: a Responses API continuation is pinned to the worker that stored it;
//! 3. [`plan`]: one snapshot of the model's healthy workers, every candidate's match,
//!    prediction and cost, and the policy's pure choice ([`kvroute_score::choose`]) with this
//!    pick's own rng;
//! 4. [`admit`]: the tenant's budget reserves what the chosen placement will cost;
//! 5. [`commit`]: the assignment is recorded (and shared), the answer built.
//!
//! The prediction is computed for every policy, so the predicted-vs-actual metric and
//! calibration work whichever policy a benchmark pass runs. Unknown models and fleets without
//! a healthy worker answer 200 with an empty worker and a degraded reason: the proxy then uses
//! its default route, which is the filter's fail-open path anyway.

pub mod admit;
pub mod affinity;
pub mod commit;
pub mod metrics;
pub mod plan;
pub mod prompt;

pub use metrics::PickMetrics;
pub use prompt::{PromptView, MAX_PICK_KEYS};

use crate::assign::AssignmentId;
use crate::config::{Config, Priors};
use crate::fleet::{End, Fleet};
use crate::stored::Owners;
use crate::store::ResponseDirectory;
use crate::tenancy::{Admission, Tenants};
use crate::tokenization::Tokenization;
use affinity::Target;
use kvroute_core::wire::{DegradedReason, LocateRequest, PickRequest, PickResponse, Rejection, TokenizationPath};
use kvroute_score::{Policy, Selector};
use parking_lot::RwLock;
use plan::Plan;
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
}

impl From<&Config> for PickConfig {
    fn from(c: &Config) -> PickConfig {
        PickConfig {
            text_chunk_bytes: c.text_chunk_bytes,
            affinity_tolerance: c.affinity_tolerance,
            queue_externality: c.queue_externality,
            priors: c.priors.clone(),
            fallback_workers: c.resilience.fallback_workers,
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
}

impl Deadline {
    /// The proxy's timeout `timeout`, counted from `arrived`.
    pub fn after(arrived: Instant, timeout: Duration) -> Deadline {
        Deadline { tokenize_until: Some(arrived + timeout.mul_f64(0.7)), answer_by: Some(arrived + timeout) }
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
        }
    }

    /// Decides where `req` goes (see the module docs for the stages).
    pub async fn pick(&self, req: &PickRequest, deadline: Deadline) -> PickResponse {
        let policy = self.policy();
        let prompt = self.prompt(policy, req, deadline.tokenize_until).await;
        // `pick_latency_seconds` is the decision; tokenizing has its own `tokenize_seconds`.
        let started = Instant::now();
        let response = match self.target(req).await {
            Target::Gone => self.fallback(policy, req, DegradedReason::DegradedResponseOwnerGone),
            Target::Workers { view, continued } => match self.plan(policy, req, view, prompt, continued) {
                Plan::Fallback(response) => response,
                Plan::Chosen(chosen) => match self.admit(req, &chosen).await {
                    (_, Admission::Rejected(rejection)) => rejected(policy, rejection),
                    (id, admitted) => self.commit(req, chosen, id, admitted.scope().cloned()),
                },
            },
        };
        let response = self.finish(policy, started, response);
        if deadline.answer_by.is_some_and(|by| Instant::now() > by) && response.assignment_id != 0 {
            self.abandon(AssignmentId(response.assignment_id));
        }
        response
    }

    /// Where a stored Responses API response lives (the proxy's `GET` / `DELETE` / cancel on
    /// `/v1/responses/{id}`): a `PickResponse` naming its worker, no assignment recorded.
    pub async fn locate(&self, req: &LocateRequest) -> PickResponse {
        let mut response = PickResponse { policy: "affinity".into(), ..PickResponse::default() };
        if let Some(owner) = self.owner(&req.response_id, "locate").await {
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
        if let Some(a) = self.fleet.finish(id, End::Cancelled, tokio::time::Instant::now()) {
            if let Some(scope) = a.budget {
                self.tenants.settle(scope, id.0, 0);
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
