//! Stage 3b: waiting ([`crate::sched`]). A pick whose candidates are all saturated is not
//! planned: it is queued with its keys, and the dispatcher ([`Picker::dispatch_forever`])
//! plans it when a worker frees capacity, against the workers and the index as they are then,
//! among the unsaturated workers only. The proxy's call is held up to `wait_ms`; a decision
//! made while the proxy was between calls waits `unclaimed_ms` for the next call, then its
//! assignment is cancelled.

use super::prompt::Keyed;
use super::{rejected, Picker};
use crate::assign::AssignmentId;
use crate::fleet::{ModelView, WorkerView};
use crate::sched::queue::{Entry, Queue};
use crate::sched::SchedulingConfig;
use kvroute_core::wire::{BudgetLimit, PickRequest, PickResponse, QueuedPick, Rejection};
use kvroute_score::Policy;
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

/// How often the dispatcher looks for freed capacity while picks wait.
const TICK: Duration = Duration::from_millis(10);
/// A queued pick whose proxy has not called for it this long past its last call's hold has
/// gone elsewhere (its call timed out, its client left): it is dropped, never dispatched.
const CALL_GRACE: Duration = Duration::from_secs(1);

/// A queued pick: what planning it later needs, and the proxy call waiting for it.
pub(super) struct Job {
    req: PickRequest,
    policy: Policy,
    keyed: Keyed,
    class: String,
    waiter: Option<oneshot::Sender<PickResponse>>,
    /// When the proxy last called for it.
    called: Instant,
}

impl Job {
    /// Its proxy's last call began more than `hold` + [`CALL_GRACE`] ago: that call has ended
    /// (no call is held longer than `hold`), and no other came. Judged by time alone, so a
    /// replica that was frozen drops on waking what its proxies gave up on meanwhile, even
    /// before their calls' own timers have run.
    fn forsaken(&self, now: Instant, hold: Duration) -> bool {
        now.duration_since(self.called) > hold + CALL_GRACE
    }
}

#[derive(Default)]
struct Inner {
    queues: HashMap<String, Queue<Job>>,
    /// Decisions (or sheddings) whose proxy was between calls: by ticket, with when made and
    /// the class and tenant label they count under.
    unclaimed: HashMap<u64, Unclaimed>,
}

struct Unclaimed {
    response: PickResponse,
    at: Instant,
    labels: OutcomeLabels,
}

/// What a pick became.
pub enum Picked {
    Decided(PickResponse),
    /// Waiting in the queue: hold the proxy's call on this for up to `wait`.
    Queued(Waiting),
}

pub struct Waiting {
    ticket: u64,
    ahead: u32,
    rx: oneshot::Receiver<PickResponse>,
    wait: Duration,
}

impl Waiting {
    /// The decision, if made within the call's hold (`wait_ms`, and never past `respond_by`,
    /// so the proxy's first call, made with its short pick timeout, is answered in time);
    /// else the answer that says "still queued".
    pub async fn answer(self, respond_by: Option<std::time::Instant>) -> PickResponse {
        let still = self.still_queued();
        let hold = respond_by.map_or(self.wait, |by| by.saturating_duration_since(std::time::Instant::now()).min(self.wait));
        match tokio::time::timeout(hold, self.rx).await {
            Ok(Ok(response)) => response,
            // Timed out, or the entry went away without a word (the service is stopping).
            _ => still,
        }
    }

    /// The decision, however long it takes.
    pub async fn decision(self) -> PickResponse {
        let still = self.still_queued();
        self.rx.await.unwrap_or(still)
    }

    fn still_queued(&self) -> PickResponse {
        PickResponse {
            queued: Some(QueuedPick { ticket: self.ticket, wait_ms: self.wait.as_millis() as u32, ahead: self.ahead }),
            ..PickResponse::default()
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClassLabels {
    class: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    class: String,
    tenant: String,
    /// `dispatched`, `shed_deadline`, `shed_at_once` (a class that never waits), `shed_full`,
    /// `forsaken` (its proxy stopped asking before it was decided), `unclaimed` (decided, then
    /// cancelled: its proxy never came back).
    outcome: &'static str,
}

struct SchedMetrics {
    depth: Family<ClassLabels, Gauge>,
    wait: Family<ClassLabels, Histogram>,
    outcomes: Family<OutcomeLabels, Counter>,
}

pub struct Scheduler {
    config: SchedulingConfig,
    inner: Mutex<Inner>,
    wake: Notify,
    metrics: SchedMetrics,
}

impl Scheduler {
    pub fn new(config: SchedulingConfig, registry: &mut crate::metrics::Registry) -> Scheduler {
        let metrics = SchedMetrics {
            depth: Family::default(),
            wait: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.005, 2.0, 16))),
            outcomes: Family::default(),
        };
        registry.register("queue_depth", "Picks waiting in the state service's queue, by service class", metrics.depth.clone());
        registry.register("queue_wait_seconds", "How long dispatched picks waited in the queue, by service class", metrics.wait.clone());
        registry.register(
            "queue_outcomes",
            "Queued picks by class, tenant (allowlisted) and outcome (dispatched, shed_deadline, shed_at_once, shed_full, forsaken, unclaimed)",
            metrics.outcomes.clone(),
        );
        Scheduler { config, inner: Mutex::new(Inner::default()), wake: Notify::new(), metrics }
    }

    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// Whether `w` is saturated (the rule in [`crate::sched`]).
    fn saturated(&self, w: &WorkerView, default_request_tokens: u32) -> bool {
        let c = &self.config;
        let at = |bound: u32, n: u32| bound > 0 && n >= bound;
        let predicted_wait = || {
            let queued_tokens = w.pending.waiting_tokens.max(u64::from(w.load.waiting) * u64::from(default_request_tokens));
            queued_tokens as f64 * w.per_token_ms
        };
        at(c.max_engine_waiting, w.load.waiting)
            || at(c.max_unstarted, w.pending.waiting)
            || w.load.kv_usage >= c.max_kv_usage
            || (c.saturation_wait_ms > 0.0 && predicted_wait() >= c.saturation_wait_ms)
    }

    fn depth_changed(&self, class: &str, by: i64) {
        self.metrics.depth.get_or_create(&ClassLabels { class: class.into() }).inc_by(by);
    }
}

impl Picker {
    /// The call of a proxy coming back for its ticket: its decision if made meanwhile, or a
    /// wait on its queue entry; `None` when this replica does not hold it (queue it anew).
    /// `timeout`: the proxy's timeout for this call. A call read later than that after the
    /// proxy sent it (it waited in a socket while this replica was frozen) is stale: its proxy
    /// has gone elsewhere, so it neither takes the decision nor keeps the entry alive.
    pub(super) fn resume_ticket(&self, req: &PickRequest, timeout: Option<Duration>) -> Option<Picked> {
        let (s, ticket) = (&self.sched, req.ticket);
        let wait = Duration::from_millis(u64::from(s.config.wait_ms));
        let mut inner = s.inner.lock();
        if let Some(u) = inner.unclaimed.remove(&ticket) {
            return Some(Picked::Decided(u.response));
        }
        let (ahead, entry) = inner.queues.values_mut().find_map(|q| {
            let ahead = q.len().saturating_sub(1) as u32;
            q.get_mut(ticket).map(|e| (ahead, e))
        })?;
        let lag = entry.since.elapsed().saturating_sub(Duration::from_millis(u64::from(req.queued_ms)));
        if timeout.is_some_and(|t| lag > t) {
            tracing::debug!(ticket, lag_ms = lag.as_millis() as u64, "stale call for a queued pick ignored");
            let (_, rx) = oneshot::channel();
            return Some(Picked::Queued(Waiting { ticket, ahead, rx, wait: Duration::ZERO }));
        }
        let (tx, rx) = oneshot::channel();
        entry.job.waiter = Some(tx);
        entry.job.called = Instant::now();
        Some(Picked::Queued(Waiting { ticket, ahead, rx, wait }))
    }

    /// Queues the pick when every candidate is saturated or picks of its model already wait;
    /// gives `keyed` back when it may be planned now.
    pub(super) fn maybe_queue(&self, policy: Policy, req: &PickRequest, view: &ModelView, keyed: Keyed) -> Result<Picked, Keyed> {
        let s = &self.sched;
        let tokens = self.config.priors.default_request_tokens;
        let busy = view.workers.iter().all(|w| s.saturated(w, tokens));
        let waiting = s.inner.lock().queues.get(&req.model).is_some_and(|q| !q.is_empty());
        if view.workers.is_empty() || !(busy || waiting) {
            return Err(keyed);
        }
        let class = s.config.class_of(&req.service_class, &req.tenant).to_string();
        let class_config = s.config.classes.get(&class).cloned().unwrap_or_default();
        let tenant_label = self.tenants.label(&req.tenant);
        let shed = |outcome: &'static str, why: String| {
            s.metrics.outcomes.get_or_create(&OutcomeLabels { class: class.clone(), tenant: tenant_label.clone(), outcome }).inc();
            tracing::info!(request_id = %req.request_id, model = %req.model, class = %class, outcome, "pick shed: {why}");
            Picked::Decided(rejected(policy, queue_rejection(why)))
        };
        if class_config.queue_deadline_ms == 0 {
            return Ok(shed("shed_at_once", format!("every worker of {} is saturated and class {class} does not wait", req.model)));
        }
        // What it costs its tenant's share: its prefill on the best worker now.
        let cost = match self.plan(policy, req, view.clone(), keyed.clone(), 0) {
            super::plan::Plan::Chosen(c) => u64::from(c.uncached_tokens()),
            super::plan::Plan::Fallback(_) => u64::from(req.prompt_tokens),
        };
        let now = Instant::now();
        let since = now.checked_sub(Duration::from_millis(u64::from(req.queued_ms))).unwrap_or(now);
        let deadline = since + Duration::from_millis(class_config.queue_deadline_ms);
        if deadline <= now {
            return Ok(shed("shed_deadline", format!("waited its class {class} deadline ({} ms)", class_config.queue_deadline_ms)));
        }
        let ticket = match req.ticket {
            0 => req.assignment_id.max(1),
            t => t,
        };
        let (tx, rx) = oneshot::channel();
        let ahead = {
            let mut inner = s.inner.lock();
            let q = inner.queues.entry(req.model.clone()).or_default();
            if q.len() >= s.config.max_queued {
                drop(inner);
                return Ok(shed("shed_full", format!("{} picks of {} already queued", s.config.max_queued, req.model)));
            }
            let ahead = q.len() as u32;
            let job = Job { req: req.clone(), policy, keyed, class: class.clone(), waiter: Some(tx), called: now };
            let entry = Entry { ticket, tenant: req.tenant.clone(), cost, since: since.into_std(), deadline: deadline.into_std(), job };
            q.push(class_config.order, &class, s.config.weight_of(&req.tenant), entry);
            ahead
        };
        s.depth_changed(&class, 1);
        s.wake.notify_one();
        tracing::debug!(request_id = %req.request_id, model = %req.model, class = %class, ticket, ahead, "pick queued: every worker saturated");
        Ok(Picked::Queued(Waiting { ticket, ahead, rx, wait: Duration::from_millis(u64::from(s.config.wait_ms)) }))
    }

    /// Dispatches queued picks as workers free capacity, sheds those past their deadline and
    /// cancels decisions nobody came back for. Runs until the service stops.
    pub async fn dispatch_forever(self: Arc<Self>) {
        if !self.sched.enabled() {
            return;
        }
        loop {
            let idle = {
                let inner = self.sched.inner.lock();
                inner.queues.values().all(Queue::is_empty) && inner.unclaimed.is_empty()
            };
            if idle {
                self.sched.wake.notified().await;
            } else {
                tokio::time::sleep(TICK).await;
            }
            self.dispatch_once().await;
        }
    }

    /// One pass: every model's queue, until its head finds no unsaturated worker.
    pub async fn dispatch_once(&self) {
        let now = Instant::now();
        self.shed_expired(now);
        self.drop_forsaken(now);
        self.cancel_unclaimed(now);
        let models: Vec<String> = self.sched.inner.lock().queues.iter().filter(|(_, q)| !q.is_empty()).map(|(m, _)| m.clone()).collect();
        for model in models {
            loop {
                let view = self.free_view(&model);
                if view.workers.is_empty() {
                    break;
                }
                let s = &self.sched;
                let next = s.inner.lock().queues.get_mut(&model).and_then(|q| q.pop_next(std::time::Instant::now(), s.config.aging_tokens_per_s, s.config.quantum_tokens));
                let Some(entry) = next else { break };
                self.dispatch(entry, view).await;
            }
        }
    }

    /// `model`'s workers that are not saturated.
    fn free_view(&self, model: &str) -> ModelView {
        let mut view = self.fleet.model_view(model);
        let tokens = self.config.priors.default_request_tokens;
        view.workers.retain(|w| !self.sched.saturated(w, tokens));
        view
    }

    async fn dispatch(&self, entry: Entry<Job>, view: ModelView) {
        let s = &self.sched;
        let Entry { ticket, tenant, since, job, .. } = entry;
        let Job { req, policy, keyed, class, waiter, .. } = job;
        s.depth_changed(&class, -1);
        if self.fleet.assignments().cancelled_early(AssignmentId(req.assignment_id)) {
            s.metrics.outcomes.get_or_create(&OutcomeLabels { class, tenant: self.tenants.label(&tenant), outcome: "forsaken" }).inc();
            return;
        }
        let waited = since.elapsed();
        s.metrics.wait.get_or_create(&ClassLabels { class: class.clone() }).observe(waited.as_secs_f64());
        let labels = OutcomeLabels { class, tenant: self.tenants.label(&tenant), outcome: "dispatched" };
        s.metrics.outcomes.get_or_create(&labels).inc();
        let started = std::time::Instant::now();
        let view = self.in_pool(&req, view);
        let plan = self.plan(policy, &req, view, keyed, 0);
        let response = self.admit_and_commit(policy, &req, plan, started).await;
        tracing::debug!(request_id = %req.request_id, ticket, worker = %response.worker_id, waited_ms = waited.as_millis() as u64, "queued pick dispatched");
        self.deliver(ticket, waiter, response, labels);
    }

    /// Hands `response` to the waiting call, or keeps it for the proxy's next call.
    fn deliver(&self, ticket: u64, waiter: Option<oneshot::Sender<PickResponse>>, response: PickResponse, labels: OutcomeLabels) {
        let response = match waiter {
            Some(tx) => match tx.send(response) {
                Ok(()) => return,
                Err(response) => response,
            },
            None => response,
        };
        self.sched.inner.lock().unclaimed.insert(ticket, Unclaimed { response, at: Instant::now(), labels });
    }

    fn shed_expired(&self, now: Instant) {
        let s = &self.sched;
        let expired: Vec<Entry<Job>> = s.inner.lock().queues.values_mut().flat_map(|q| q.expire(now.into_std())).collect();
        for e in expired {
            let class = e.job.class.clone();
            s.depth_changed(&class, -1);
            let labels = OutcomeLabels { class: class.clone(), tenant: self.tenants.label(&e.tenant), outcome: "shed_deadline" };
            s.metrics.outcomes.get_or_create(&labels).inc();
            tracing::info!(request_id = %e.job.req.request_id, class = %class, "queued pick shed at its deadline");
            let response = rejected(e.job.policy, queue_rejection(format!("every worker stayed saturated for class {class}'s queue deadline")));
            self.deliver(e.ticket, e.job.waiter, response, labels);
        }
    }

    /// Drops the queued picks whose proxy has gone: it stopped calling, or cancelled the
    /// assignment it named (its call timed out).
    fn drop_forsaken(&self, now: Instant) {
        let s = &self.sched;
        let hold = Duration::from_millis(u64::from(s.config.wait_ms));
        let assignments = self.fleet.assignments();
        let gone: Vec<Entry<Job>> = s
            .inner
            .lock()
            .queues
            .values_mut()
            .flat_map(|q| q.remove_where(|e| e.job.forsaken(now, hold) || assignments.cancelled_early(AssignmentId(e.job.req.assignment_id))))
            .collect();
        drop(assignments);
        for e in gone {
            s.depth_changed(&e.job.class, -1);
            s.metrics.outcomes.get_or_create(&OutcomeLabels { class: e.job.class.clone(), tenant: self.tenants.label(&e.tenant), outcome: "forsaken" }).inc();
            tracing::info!(request_id = %e.job.req.request_id, ticket = e.ticket, "queued pick dropped: its proxy stopped asking for it");
        }
    }

    fn cancel_unclaimed(&self, now: Instant) {
        let s = &self.sched;
        let keep = Duration::from_millis(s.config.unclaimed_ms);
        let gone: Vec<(u64, Unclaimed)> = {
            let mut inner = s.inner.lock();
            let old: Vec<u64> = inner.unclaimed.iter().filter(|(_, u)| now.duration_since(u.at) >= keep).map(|(t, _)| *t).collect();
            old.into_iter().filter_map(|t| inner.unclaimed.remove(&t).map(|u| (t, u))).collect()
        };
        for (ticket, u) in gone {
            if u.response.assignment_id != 0 {
                tracing::info!(ticket, worker = %u.response.worker_id, "queued pick decided but never claimed: cancelled");
                self.abandon(AssignmentId(u.response.assignment_id));
                s.metrics.outcomes.get_or_create(&OutcomeLabels { outcome: "unclaimed", ..u.labels }).inc();
            }
        }
    }
}

/// The answer for a request the queue sheds: 503 with `Retry-After` (the proxy shapes it).
fn queue_rejection(why: String) -> Rejection {
    Rejection { limit: BudgetLimit::BudgetQueue as i32, retry_after_ms: 1_000, message: format!("the fleet is saturated: {why}") }
}
