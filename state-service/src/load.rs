//! Worker load from vLLM's `/metrics`, scraped a few times a second, and worker health.
//!
//! Metrics lag (a scrape interval plus vLLM's own update period), so scoring combines them
//! with our own in-flight assignments (see `assign`). A worker whose scrapes fail
//! `unhealthy_after` times in a row leaves the pool of picks; the first good scrape puts it
//! back. A worker without a metrics URL is always healthy and loaded by assignments only.

pub mod parse;
pub mod scrape;

pub use parse::{parse_vllm, VllmLoad};
pub use scrape::{scrape_once, spawn_scraper, ScrapeError, ScrapeTarget, Scraper};

use tokio::time::Instant;

/// The last scraped load of a worker and the health derived from scraping it.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadState {
    pub load: VllmLoad,
    pub healthy: bool,
    pub consecutive_failures: u32,
    pub scrapes_ok: u64,
    pub scrapes_failed: u64,
    pub last_ok: Option<Instant>,
    pub last_error: Option<String>,
}

impl Default for LoadState {
    /// Healthy until proven otherwise: a fresh worker takes traffic at once.
    fn default() -> Self {
        LoadState {
            load: VllmLoad::default(),
            healthy: true,
            consecutive_failures: 0,
            scrapes_ok: 0,
            scrapes_failed: 0,
            last_ok: None,
            last_error: None,
        }
    }
}

/// A health change caused by one scrape, for logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthChange {
    None,
    BecameUnhealthy,
    Recovered,
}

impl LoadState {
    pub fn record_ok(&mut self, load: VllmLoad, now: Instant) -> HealthChange {
        let change = if self.healthy { HealthChange::None } else { HealthChange::Recovered };
        self.load = load;
        self.healthy = true;
        self.consecutive_failures = 0;
        self.scrapes_ok += 1;
        self.last_ok = Some(now);
        self.last_error = None;
        change
    }

    pub fn record_failure(&mut self, error: String, unhealthy_after: u32) -> HealthChange {
        self.consecutive_failures += 1;
        self.scrapes_failed += 1;
        self.last_error = Some(error);
        if self.healthy && self.consecutive_failures >= unhealthy_after {
            self.healthy = false;
            return HealthChange::BecameUnhealthy;
        }
        HealthChange::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_after_n_failures_back_after_one_success() {
        let mut s = LoadState::default();
        let now = Instant::now();
        assert_eq!(s.record_failure("x".into(), 3), HealthChange::None);
        assert_eq!(s.record_failure("x".into(), 3), HealthChange::None);
        assert!(s.healthy);
        assert_eq!(s.record_failure("x".into(), 3), HealthChange::BecameUnhealthy);
        assert_eq!(s.record_failure("x".into(), 3), HealthChange::None);
        assert!(!s.healthy);
        assert_eq!(s.record_ok(VllmLoad::default(), now), HealthChange::Recovered);
        assert!(s.healthy && s.consecutive_failures == 0 && s.last_error.is_none());
    }
}
