//! A request naming a stored Responses API response: where that response lives
//! ([`crate::responses`] keeps the map; this waits for it and asks the store).

use crate::responses::Owner;
use crate::state::AppState;
use std::time::Duration;
use tokio::time::Instant;

/// How often a pick waiting for an unknown id asks the store again (another replica may
/// have got the report).
const STORE_POLL: Duration = Duration::from_millis(20);

/// The owner of `id`: this replica's map, else the store (each read bounded by
/// `store_timeout_ms`), remembered here once found; an id nobody knows yet is waited for up to
/// `unknown_wait_ms` (its report may be on its way). Counts an unknown id under `path`.
pub async fn owner(state: &AppState, id: &str, path: &'static str) -> Option<Owner> {
    let owners = &state.owners;
    let deadline = Instant::now() + Duration::from_millis(owners.config().unknown_wait_ms);
    let read = Duration::from_millis(owners.config().store_timeout_ms);
    loop {
        // Registered before the check, so a learn in between still wakes this wait.
        let learned = owners.learned();
        let now = Instant::now();
        if let Some(o) = owners.get(id, now) {
            return Some(o);
        }
        if let Some(o) = tokio::time::timeout(read, state.store.find_response(id)).await.ok().flatten() {
            owners.learn(id, o.clone(), now);
            return Some(o);
        }
        if Instant::now() >= deadline {
            state.metrics.count_affinity(path, "unknown");
            return None;
        }
        let _ = tokio::time::timeout_at(deadline.min(Instant::now() + STORE_POLL), learned).await;
    }
}

