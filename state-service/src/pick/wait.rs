//! Stage 3b: waiting ([`crate::sched`]). A pick is planned over all its candidates; when the
//! worker it is best on is saturated, it is queued with its keys, and the dispatcher
//! ([`Picker::dispatch_forever`]) plans it again, in the queue's order, against the workers
//! and the index as they are then, until the worker it is best on has room (late binding: the
//! best worker may change while it waits). The proxy's call is held up to `wait_ms`; a
//! decision made while the proxy was between calls waits `unclaimed_ms` for the next call,
//! then its assignment is cancelled.

mod headroom;
mod saturation;

use saturation::{binds_for_nothing, signature};

use super::plan::Plan;
use super::prompt::Keyed;
use super::{rejected, Picker};
use crate::assign::AssignmentId;
use crate::fleet::{ModelView, WorkerView};
use crate::sched::queue::{Entry, Queue};
use crate::sched::{SchedulingConfig, WaitWhen};
use headroom::Headroom;
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
/// The most queued picks one pass plans (those held for a saturated worker count).
const MAX_SCAN: usize = 128;
/// A pass that dispatched nothing is repeated on an unchanged fleet only after this long.
const RESCAN: Duration = Duration::from_millis(100);
/// The longest a worker is shielded for one pick (a prediction is not trusted further).
const MAX_SHIELD: Duration = Duration::from_secs(5);
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
    /// Per model, the signature of the fleet at the last pass that dispatched nothing.
    idle_pass: HashMap<String, (u64, Instant)>,
    /// Flows and shielded workers, for `headroom_workers` only.
    headroom: Headroom,
    /// Tickets a dispatcher pass took out of the queue and has not put back or decided yet,
    /// with the waiter of a call that came for one meanwhile: such a call waits for that
    /// decision instead of queueing the pick anew (which would dispatch it twice).
    out: HashMap<u64, Option<oneshot::Sender<PickResponse>>>,
}

impl Inner {
    /// The rule of `headroom_workers` ([`crate::sched`]): a pick of a flow with more picks
    /// queued, while another flow of the model is active, leaves headroom free.
    /// `held`: the pass holds others of its flow, out of the queue until it ends.
    fn keeps_headroom(&self, model: &str, class: &str, tenant: &str, held: bool, now: Instant) -> bool {
        let backlogged = held || self.queues.get(model).is_some_and(|q| q.flow_len(class, tenant) > 0);
        self.headroom.keeps(model, class, tenant, backlogged, now)
    }
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
struct QueueLabels {
    class: String,
    /// Allowlisted (`tenancy.metrics_tenants`), else `other` / `none`.
    tenant: String,
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
    depth: Family<QueueLabels, Gauge>,
    wait: Family<QueueLabels, Histogram>,
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
        registry.register("queue_depth", "Picks waiting in the state service's queue, by service class and tenant (allowlisted)", metrics.depth.clone());
        registry.register("queue_wait_seconds", "How long dispatched picks waited in the queue, by service class and tenant (allowlisted)", metrics.wait.clone());
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

    /// A pick of `class` placed without waiting: its flow is active (for headroom).
    fn placed_now(&self, req: &PickRequest, class: &str) {
        if self.config.headroom_workers > 0 {
            self.inner.lock().headroom.placed(&req.model, class, &req.tenant, Instant::now());
        }
    }

    /// Makes the worker a queued pick of a flow under its share goes to one of those kept
    /// from a backlogged flow until its predicted first token: else the backlog could join
    /// the step that prefills it, once another worker has drained to fewer unstarted picks.
    /// (A pick placed without waiting needs none: nothing of its model is backlogged.)
    fn shield(&self, plan: &Plan) {
        if let Plan::Chosen(chosen) = plan {
            let c = chosen.candidate();
            let until = Instant::now() + Duration::from_secs_f64((c.prediction.ttft_ms / 1000.0).clamp(0.0, MAX_SHIELD.as_secs_f64()));
            self.inner.lock().headroom.shield(&c.worker.id, until);
        }
    }

    fn depth_changed(&self, class: &str, tenant_label: &str, by: i64) {
        self.metrics.depth.get_or_create(&QueueLabels { class: class.into(), tenant: tenant_label.into() }).inc_by(by);
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
        if let Some(slot) = inner.out.get_mut(&ticket) {
            let (tx, rx) = oneshot::channel();
            *slot = Some(tx);
            return Some(Picked::Queued(Waiting { ticket, ahead: 0, rx, wait }));
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

    /// Plans the pick over every candidate, then queues it when the worker it would go to is
    /// saturated, or when picks of its model already wait (the dispatcher's next pass, woken
    /// at once, places it in its turn); else gives the plan back to be committed now.
    pub(super) fn maybe_queue(&self, policy: Policy, req: &PickRequest, view: &ModelView, keyed: Keyed) -> Result<Picked, Box<Plan>> {
        let s = &self.sched;
        let plan = self.plan(policy, req, view.clone(), keyed.clone(), 0);
        let Plan::Chosen(chosen) = &plan else { return Err(Box::new(plan)) };
        let priors = &self.config.priors;
        let id = &chosen.candidate().worker.id;
        let busy = match s.config.wait_when {
            WaitWhen::BestSaturated => view.workers.iter().any(|w| w.entry.id == *id && s.saturated(w, priors, binds_for_nothing(chosen))),
            WaitWhen::AllSaturated => view.workers.iter().all(|w| s.saturated(w, priors, false)),
        };
        let class = s.config.class_of(&req.service_class, &req.tenant).to_string();
        let waiting = s.inner.lock().queues.get(&req.model).is_some_and(|q| !q.is_empty());
        if !(busy || waiting) {
            s.placed_now(req, &class);
            return Err(Box::new(plan));
        }
        // What it costs its tenant's share: its prefill on the best worker now.
        let cost = u64::from(chosen.uncached_tokens());
        let class_config = s.config.classes.get(&class).cloned().unwrap_or_default();
        let tenant_label = self.tenants.label(&req.tenant);
        let shed = |outcome: &'static str, why: String| {
            s.metrics.outcomes.get_or_create(&OutcomeLabels { class: class.clone(), tenant: tenant_label.clone(), outcome }).inc();
            tracing::info!(request_id = %req.request_id, model = %req.model, class = %class, outcome, "pick shed: {why}");
            Picked::Decided(rejected(policy, queue_rejection(why)))
        };
        if class_config.queue_deadline_ms == 0 {
            if !busy {
                // It never waits, and its worker has room.
                s.placed_now(req, &class);
                return Err(Box::new(plan));
            }
            return Ok(shed("shed_at_once", format!("the workers of {} that could serve it are saturated and class {class} does not wait", req.model)));
        }
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
        s.depth_changed(&class, &tenant_label, 1);
        s.wake.notify_one();
        tracing::debug!(request_id = %req.request_id, model = %req.model, class = %class, ticket, ahead, busy, "pick queued");
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
                // A new pick is placed at once; freed capacity is looked for every tick.
                tokio::select! {
                    _ = self.sched.wake.notified() => {}
                    _ = tokio::time::sleep(TICK) => {}
                }
            }
            self.dispatch_once().await;
        }
    }

    /// One pass: sheds, drops and cancels what is due, then plans every model's queue.
    pub async fn dispatch_once(&self) {
        let now = Instant::now();
        self.shed_expired(now);
        self.drop_forsaken(now);
        self.cancel_unclaimed(now);
        let models: Vec<String> = self.sched.inner.lock().queues.iter().filter(|(_, q)| !q.is_empty()).map(|(m, _)| m.clone()).collect();
        for model in models {
            self.dispatch_model(&model).await;
        }
    }

    /// Plans `model`'s queued picks in the queue's order (classes, fair shares, shortest
    /// first), each over all of its candidates as they are now plus what this pass placed or
    /// held before it: a pick whose best worker is not saturated is dispatched there; one whose
    /// best worker is saturated stays queued, counted on that worker for the picks after it
    /// (they see its queue as it will be), and is planned again next pass, so it is bound to a
    /// worker only when one it is best on has room. The pass ends when no worker has room or
    /// after [`MAX_SCAN`] picks; one that would dispatch nothing on an unchanged fleet is skipped.
    async fn dispatch_model(&self, model: &str) {
        let s = &self.sched;
        let priors = &self.config.priors;
        let mut view = self.fleet.model_view(model);
        // Room for some pick: one that binds for nothing has it a step ahead.
        let room = |view: &ModelView| view.workers.iter().any(|w| !s.saturated(w, priors, true));
        if !room(&view) {
            return;
        }
        let signature = signature(&view, priors, s.inner.lock().queues.get(model).map_or(0, Queue::len));
        if s.inner.lock().idle_pass.get(model).is_some_and(|(sig, at)| *sig == signature && at.elapsed() < RESCAN) {
            return;
        }
        let aging = s.config.aging_per_s(median_per_token_ms(&view).unwrap_or(self.config.priors.per_token_ms));
        let (mut held, mut dispatched) = (Vec::new(), 0usize);
        while held.len() + dispatched < MAX_SCAN && room(&view) {
            let next = {
                let mut inner = s.inner.lock();
                let next = inner.queues.get_mut(model).and_then(|q| q.pop_next(std::time::Instant::now(), aging, s.config.quantum_tokens));
                if let Some(e) = &next {
                    inner.out.insert(e.ticket, None);
                }
                next
            };
            let Some(entry) = next else { break };
            let job = &entry.job;
            let mut candidates = self.in_pool(&job.req, view.clone());
            let pooled = !candidates.workers.is_empty();
            let headroom = s.config.headroom_workers;
            // Its flow's picks this pass holds still count as queued behind it.
            let held_of_flow = || held.iter().any(|e: &Entry<Job>| e.tenant == entry.tenant && e.job.class == job.class);
            let backlogged = headroom > 0 && s.inner.lock().keeps_headroom(model, &job.class, &entry.tenant, held_of_flow(), Instant::now());
            if backlogged {
                s.inner.lock().headroom.leave(&mut candidates.workers, headroom as usize, Instant::now());
            }
            let hold = match s.config.wait_when {
                WaitWhen::BestSaturated => true,
                // The peers' rule: the first in line goes to the best worker with room (one of
                // its pool's; it waits while its pool has none).
                WaitWhen::AllSaturated => {
                    candidates.workers.retain(|w| !s.saturated(w, priors, false));
                    false
                }
            };
            if pooled && candidates.workers.is_empty() {
                held.push(entry);
                continue;
            }
            let plan = self.plan(job.policy, &job.req, candidates, job.keyed.clone(), 0);
            if let Plan::Chosen(chosen) = &plan {
                let id = &chosen.candidate().worker.id;
                if let Some(w) = view.workers.iter_mut().find(|w| w.entry.id == *id) {
                    let busy = hold && s.saturated(w, priors, binds_for_nothing(chosen));
                    placed(w, chosen.uncached_tokens(), chosen.candidate().prediction.ttft_ms);
                    if busy {
                        held.push(entry);
                        continue;
                    }
                }
            }
            if headroom > 0 && !backlogged {
                s.shield(&plan);
            }
            dispatched += 1;
            self.dispatch(entry, plan).await;
        }
        let mut inner = s.inner.lock();
        if dispatched == 0 {
            inner.idle_pass.insert(model.to_string(), (signature, Instant::now()));
        } else {
            inner.idle_pass.remove(model);
        }
        let Inner { queues, out, .. } = &mut *inner;
        let q = queues.entry(model.to_string()).or_default();
        let mut stale = Vec::new();
        for mut e in held.into_iter().rev() {
            if let Some(Some(tx)) = out.remove(&e.ticket) {
                (e.job.waiter, e.job.called) = (Some(tx), Instant::now());
            }
            let order = s.config.classes.get(&e.job.class).map_or(0, |c| c.order);
            let (class, weight) = (e.job.class.clone(), s.config.weight_of(&e.tenant));
            stale.extend(q.put_back(order, &class, weight, e));
        }
        drop(inner);
        for e in stale {
            s.depth_changed(&e.job.class, &self.tenants.label(&e.tenant), -1);
        }
    }

    async fn dispatch(&self, entry: Entry<Job>, plan: Plan) {
        let s = &self.sched;
        let Entry { ticket, tenant: tenant_name, since, job, .. } = entry;
        let Job { req, policy, class, waiter, .. } = job;
        let tenant = self.tenants.label(&tenant_name);
        s.depth_changed(&class, &tenant, -1);
        if self.fleet.assignments().cancelled_early(AssignmentId(req.assignment_id)) {
            s.inner.lock().out.remove(&ticket);
            s.metrics.outcomes.get_or_create(&OutcomeLabels { class, tenant, outcome: "forsaken" }).inc();
            return;
        }
        if s.config.headroom_workers > 0 {
            s.inner.lock().headroom.placed(&req.model, &class, &tenant_name, Instant::now());
        }
        let waited = since.elapsed();
        s.metrics.wait.get_or_create(&QueueLabels { class: class.clone(), tenant: tenant.clone() }).observe(waited.as_secs_f64());
        let labels = OutcomeLabels { class, tenant, outcome: "dispatched" };
        s.metrics.outcomes.get_or_create(&labels).inc();
        let started = std::time::Instant::now();
        let response = self.admit_and_commit(policy, &req, plan, started).await;
        tracing::debug!(request_id = %req.request_id, ticket, worker = %response.worker_id, waited_ms = waited.as_millis() as u64, "queued pick dispatched");
        self.deliver(ticket, waiter, response, labels);
    }

    /// Hands `response` to the waiting call (the one that came while a pass had it out, else
    /// the one it was queued with), or keeps it for the proxy's next call.
    fn deliver(&self, ticket: u64, waiter: Option<oneshot::Sender<PickResponse>>, mut response: PickResponse, labels: OutcomeLabels) {
        let mut inner = self.sched.inner.lock();
        let late = inner.out.remove(&ticket).flatten();
        for tx in [late, waiter].into_iter().flatten() {
            match tx.send(response) {
                Ok(()) => return,
                Err(back) => response = back,
            }
        }
        inner.unclaimed.insert(ticket, Unclaimed { response, at: Instant::now(), labels });
    }

    fn shed_expired(&self, now: Instant) {
        let s = &self.sched;
        let expired: Vec<Entry<Job>> = s.inner.lock().queues.values_mut().flat_map(|q| q.expire(now.into_std())).collect();
        for e in expired {
            let (class, tenant) = (e.job.class.clone(), self.tenants.label(&e.tenant));
            s.depth_changed(&class, &tenant, -1);
            let labels = OutcomeLabels { class: class.clone(), tenant, outcome: "shed_deadline" };
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
            let tenant = self.tenants.label(&e.tenant);
            s.depth_changed(&e.job.class, &tenant, -1);
            s.metrics.outcomes.get_or_create(&OutcomeLabels { class: e.job.class.clone(), tenant, outcome: "forsaken" }).inc();
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

/// `w` as it will be once a pick of `uncached` prefill tokens is placed on it (dispatched, or
/// held for it).
fn placed(w: &mut WorkerView, uncached: u32, ttft_ms: f64) {
    let p = &mut w.pending;
    let due = Instant::now() + Duration::try_from_secs_f64(ttft_ms / 1000.0).unwrap_or_default();
    p.last_first_token_due = p.last_first_token_due.max(Some(due));
    p.in_flight += 1;
    p.waiting += 1;
    p.waiting_tokens += u64::from(uncached);
    p.in_flight_tokens += u64::from(uncached);
}

/// The model's workers' median calibrated prefill cost per token (what the queue's aging is
/// measured in), if it has workers.
fn median_per_token_ms(view: &ModelView) -> Option<f64> {
    let mut costs: Vec<f64> = view.workers.iter().map(|w| w.per_token_ms).filter(|c| c.is_finite() && *c > 0.0).collect();
    costs.sort_by(f64::total_cmp);
    costs.get(costs.len() / 2).copied()
}

/// The answer for a request the queue sheds: 503 with `Retry-After` (the proxy shapes it).
fn queue_rejection(why: String) -> Rejection {
    Rejection { limit: BudgetLimit::BudgetQueue as i32, retry_after_ms: 1_000, message: format!("the fleet is saturated: {why}") }
}
