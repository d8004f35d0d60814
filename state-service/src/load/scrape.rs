//! The scrape loop: one task per worker with a metrics URL.

use super::parse::{parse_vllm, VllmLoad};
use super::HealthChange;
use crate::registry::WorkerEntry;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("GET {url}: {message}")]
    Request { url: String, message: String },
    #[error("GET {url}: HTTP {status}")]
    Status { url: String, status: u16 },
}

/// How to scrape: shared by every worker's loop.
#[derive(Clone, Debug)]
pub struct Scraper {
    pub client: reqwest::Client,
    pub interval: Duration,
    pub timeout: Duration,
    pub unhealthy_after: u32,
}

/// Fetches and parses one worker's metrics.
pub async fn scrape_once(client: &reqwest::Client, url: &str, timeout: Duration) -> Result<VllmLoad, ScrapeError> {
    let request_error = |e: reqwest::Error| ScrapeError::Request { url: url.to_string(), message: e.to_string() };
    let response = client.get(url).timeout(timeout).send().await.map_err(request_error)?;
    if !response.status().is_success() {
        return Err(ScrapeError::Status { url: url.to_string(), status: response.status().as_u16() });
    }
    let text = response.text().await.map_err(request_error)?;
    Ok(parse_vllm(&text))
}

impl Scraper {
    /// Scrapes `worker` once and records the outcome in its load state.
    pub async fn scrape(&self, worker: &WorkerEntry) -> HealthChange {
        let Some(url) = worker.config.metrics_url.as_deref() else { return HealthChange::None };
        let result = scrape_once(&self.client, url, self.timeout).await;
        let mut state = worker.load.lock();
        let change = match result {
            Ok(load) => state.record_ok(load, Instant::now()),
            Err(e) => state.record_failure(e.to_string(), self.unhealthy_after),
        };
        drop(state);
        match change {
            HealthChange::BecameUnhealthy => tracing::warn!(worker = %worker.id, "worker unhealthy: metrics scrapes failing"),
            HealthChange::Recovered => tracing::info!(worker = %worker.id, "worker healthy again"),
            HealthChange::None => {}
        }
        change
    }
}

/// Starts scraping `worker` every `scraper.interval`; the task is stopped with the worker.
pub fn spawn_scraper(scraper: Scraper, worker: Arc<WorkerEntry>) {
    if worker.config.metrics_url.is_none() {
        return;
    }
    let entry = worker.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(scraper.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            scraper.scrape(&entry).await;
        }
    });
    worker.add_task(task.abort_handle());
}
