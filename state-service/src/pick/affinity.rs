//! Stage 2: which workers may take the request. A request continuing a stored Responses API
//! conversation (`previous_response_id`) goes to the worker that stored it, which alone holds
//! that conversation, and only when it is its tenant's (another tenant's is not found); a body
//! the proxy could not read goes to the default route; every other request may go to any
//! healthy worker of its model in its pool ([`crate::pools`]).
//! ([`crate::stored`] keeps the owner map; this waits for an owner and asks the store.)

use super::Picker;
use crate::fleet::ModelView;
use crate::stored::Owner;
use kvroute_core::wire::{PickRequest, UnreadBody};
use std::time::Duration;
use tokio::time::Instant;

/// How often a pick waiting for an unknown id asks the store again (another replica may
/// have got the report).
const STORE_POLL: Duration = Duration::from_millis(20);

/// Where a request may go.
pub(super) enum Target {
    /// These workers; `continued`: tokens of the stored conversation the prompt continues,
    /// held by the one worker of `view`.
    Workers { view: ModelView, continued: u32 },
    /// The stored conversation it continues lives on a worker that is gone.
    Gone,
    /// The stored conversation it continues is another tenant's: as if it did not exist.
    NotFound,
    /// The proxy could not read the body: the default route takes it.
    Unread,
}

impl Picker {
    pub(super) async fn target(&self, req: &PickRequest) -> Target {
        match self.unpooled_target(req).await {
            Target::Workers { view, continued } => {
                let view = self.in_pool(req, view);
                if !req.pool.is_empty() {
                    self.metrics.count_pool(crate::pools::label(&self.config.pools, &req.pool), !view.workers.is_empty());
                }
                Target::Workers { view, continued }
            }
            other => other,
        }
    }

    /// `view` less the workers `req`'s pool does not admit (a request of a pool with no healthy
    /// worker gets no worker: never one of another pool).
    pub(super) fn in_pool(&self, req: &PickRequest, mut view: ModelView) -> ModelView {
        let pools = &self.config.pools;
        let before = view.workers.len();
        view.workers.retain(|w| crate::pools::admits(pools, &req.pool, &w.entry.config.labels));
        if before > 0 && view.workers.is_empty() && !req.pool.is_empty() {
            tracing::info!(request_id = %req.request_id, pool = %req.pool, "no healthy worker in the request's pool");
        }
        view
    }

    async fn unpooled_target(&self, req: &PickRequest) -> Target {
        if req.unread() != UnreadBody::UnreadNone {
            return Target::Unread;
        }
        if req.previous_response_id.is_empty() {
            return Target::Workers { view: self.fleet.model_view(&req.model), continued: 0 };
        }
        match self.owner(&req.previous_response_id, "pick").await {
            // Nobody stored it (or it expired): any worker answers vLLM's own 404. Not for a
            // tenant's request: a response stored a moment ago may not be known yet, and the
            // default route could reach its worker, so it is not found.
            None if !req.tenant.is_empty() => Target::NotFound,
            None => Target::Workers { view: self.fleet.model_view(&req.model), continued: 0 },
            Some(owner) if !owner.visible_to(&req.tenant) => {
                self.metrics.count_affinity("pick", "other_tenant");
                Target::NotFound
            }
            Some(owner) => {
                let view = self.fleet.pinned_view(&req.model, &owner.worker);
                if view.workers.is_empty() {
                    self.metrics.count_affinity("pick", "gone");
                    return Target::Gone;
                }
                self.metrics.count_affinity("pick", "routed");
                Target::Workers { view, continued: owner.tokens }
            }
        }
    }

    /// The owner of `id`: this replica's map, else the store (each read bounded by
    /// `store_timeout_ms`), remembered here once found; an id nobody knows yet is waited for up
    /// to `unknown_wait_ms` (its report may be on its way). Counts an unknown id under `path`.
    pub(super) async fn owner(&self, id: &str, path: &'static str) -> Option<Owner> {
        let owners = &self.owners;
        let deadline = Instant::now() + Duration::from_millis(owners.config().unknown_wait_ms);
        let read = Duration::from_millis(owners.config().store_timeout_ms);
        loop {
            // Registered before the check, so a learn in between still wakes this wait.
            let learned = owners.learned();
            let now = Instant::now();
            if let Some(o) = owners.get(id, now) {
                return Some(o);
            }
            if let Some(o) = tokio::time::timeout(read, self.responses.find_response(id)).await.ok().flatten() {
                owners.learn(id, o.clone(), now);
                return Some(o);
            }
            if Instant::now() >= deadline {
                self.metrics.count_affinity(path, "unknown");
                return None;
            }
            let _ = tokio::time::timeout_at(deadline.min(Instant::now() + STORE_POLL), learned).await;
        }
    }
}
