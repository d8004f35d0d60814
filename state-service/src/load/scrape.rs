//! The scrape loop: one task per worker. A worker with a metrics URL is scraped every
//! interval (load and health); one without is probed at `GET /health` of its endpoint, and
//! only while the proxy has marked it suspect (nothing else would ever bring it back).

use super::parse::{parse_vllm, VllmLoad};
use super::HealthChange;
use super::LoadState;
use kvroute_kv::types::WorkerId;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::AbortHandle;
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

/// What a worker's loop fetches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// vLLM's `/metrics`: load and health.
    Metrics,
    /// `/health`, only to lift a suspicion.
    Health,
}

/// One worker's URL and the load cell its checks write.
#[derive(Clone, Debug)]
pub struct ScrapeTarget {
    pub worker: WorkerId,
    pub url: String,
    pub check: Check,
    pub load: Arc<Mutex<LoadState>>,
    /// Told the blocks (GPU + CPU) the worker reports, after each scrape that reports them.
    pub on_capacity: Option<CapacityHook>,
}

/// What a worker's reported block capacity bounds (its engines' indexes).
#[derive(Clone)]
pub struct CapacityHook(pub Arc<dyn Fn(u64) + Send + Sync>);

impl std::fmt::Debug for CapacityHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapacityHook")
    }
}

/// `GET url` answers 2xx within `timeout`.
async fn probe_once(client: &reqwest::Client, url: &str, timeout: Duration) -> bool {
    client.get(url).timeout(timeout).send().await.is_ok_and(|r| r.status().is_success())
}

impl Scraper {
    /// Scrapes `target` once and records the outcome in its load state.
    pub async fn scrape(&self, target: &ScrapeTarget) -> HealthChange {
        let started = Instant::now();
        if target.check == Check::Health {
            if target.load.lock().suspect.is_some() && probe_once(&self.client, &target.url, self.timeout).await {
                lifted(target, target.load.lock().clear_suspect(started));
            }
            return HealthChange::None;
        }
        let result = scrape_once(&self.client, &target.url, self.timeout).await;
        if let (Ok(load), Some(hook)) = (&result, &target.on_capacity) {
            if let Some(blocks) = load.num_gpu_blocks.map(|g| g.saturating_add(load.num_cpu_blocks.unwrap_or(0))) {
                (hook.0)(blocks);
            }
        }
        let mut state = target.load.lock();
        let (change, cleared) = match result {
            Ok(load) => (state.record_ok(load, Instant::now()), state.clear_suspect(started)),
            Err(e) => (state.record_failure(e.to_string(), self.unhealthy_after), None),
        };
        drop(state);
        lifted(target, cleared);
        match change {
            HealthChange::BecameUnhealthy => tracing::warn!(worker = %target.worker, "worker unhealthy: metrics scrapes failing"),
            HealthChange::Recovered => tracing::info!(worker = %target.worker, "worker healthy again"),
            HealthChange::None => {}
        }
        change
    }
}

fn lifted(target: &ScrapeTarget, cleared: Option<super::Suspect>) {
    if let Some(s) = cleared {
        tracing::info!(worker = %target.worker, reason = s.reason.label(), "worker answers again: no longer suspect");
    }
}

/// Starts scraping `target` every `scraper.interval`; abort the handle to stop.
pub fn spawn_scraper(scraper: Scraper, target: ScrapeTarget) -> AbortHandle {
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(scraper.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            scraper.scrape(&target).await;
        }
    });
    task.abort_handle()
}
