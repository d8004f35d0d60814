//! Wiring: turns a validated config and an index into the running service: state, every
//! worker's feeds (metrics scraper, KV-event ingestion per engine), and the periodic sweep of
//! expired assignments. `main` calls [`start`] and serves [`crate::api::app`]; tests build
//! [`AppState`] directly and drive it without background tasks.

use crate::config::Config;
use crate::fleet::AddWorkerError;
use crate::index::KvIndex;
use crate::state::AppState;
use crate::store::{memory::MemoryStore, SharedStore};
use std::sync::Arc;
use std::time::Duration;

/// How often expired assignments and speculative credit are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Builds the state, starts every worker's feeds and the sweeper. Needs a tokio runtime.
pub fn start(config: Config, index: Arc<dyn KvIndex>) -> Result<AppState, AddWorkerError> {
    start_with_store(config, index, Arc::new(MemoryStore))
}

/// [`start`] with a shared store (the Redis store passes its mirrored index as `index`).
pub fn start_with_store(config: Config, index: Arc<dyn KvIndex>, store: Arc<dyn SharedStore>) -> Result<AppState, AddWorkerError> {
    let state = AppState::with_store(config, index, store)?;
    state.tokenization.preload(state.fleet.workers().iter().map(|w| w.config.model.clone()).collect());
    state.start_feeds();
    let sweeper = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        loop {
            tick.tick().await;
            sweeper.sweep();
        }
    });
    Ok(state)
}
