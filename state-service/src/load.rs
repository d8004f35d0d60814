//! Worker load from vLLM's `/metrics`, scraped a few times a second, and worker health.
//!
//! Metrics lag (a scrape interval plus vLLM's own update period), so scoring combines them
//! with our own in-flight assignments (see `assign`). A worker whose scrapes fail
//! `unhealthy_after` times in a row leaves the pool of picks; the first good scrape puts it
//! back. A worker without a metrics URL is always healthy and loaded by assignments only.
//!
//! Two more reasons keep a worker out of picks: the proxy saw it fail (passive detection:
//! [`LoadState::suspect`], cleared by the first scrape or `/health` probe that started after
//! the failure succeeds), and an operator is draining it ([`LoadState::draining`]).

pub mod parse;
pub mod scrape;

pub use parse::{parse_vllm, VllmLoad};
pub use scrape::{scrape_once, spawn_scraper, CapacityHook, Check, ScrapeError, ScrapeTarget, Scraper};

use kvroute_core::wire::UpstreamFailure;
use tokio::time::Instant;

/// A failure the proxy saw on a worker: what, and when it was marked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Suspect {
    pub reason: UpstreamFailure,
    pub since: Instant,
}

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
    /// The proxy saw the worker fail (see the module doc).
    pub suspect: Option<Suspect>,
    /// New picks stopped; the worker leaves when its in-flight requests are done.
    pub draining: bool,
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
            suspect: None,
            draining: false,
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
    /// Whether picks may choose the worker.
    pub fn takes_picks(&self) -> bool {
        self.healthy && self.suspect.is_none() && !self.draining
    }

    /// Marks the worker suspect; false when it already was (the first reason stays).
    pub fn suspect(&mut self, reason: UpstreamFailure, now: Instant) -> bool {
        if self.suspect.is_some() {
            return false;
        }
        self.suspect = Some(Suspect { reason, since: now });
        true
    }

    /// A scrape or probe that started at `started` succeeded: a suspicion older than it is
    /// lifted. Returns the lifted suspicion.
    pub fn clear_suspect(&mut self, started: Instant) -> Option<Suspect> {
        match self.suspect {
            Some(s) if s.since <= started => self.suspect.take(),
            _ => None,
        }
    }

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

    #[test]
    fn a_suspect_is_cleared_only_by_a_check_that_started_after_it() {
        let mut s = LoadState::default();
        let before = Instant::now();
        let marked = before + std::time::Duration::from_millis(5);
        assert!(s.suspect(UpstreamFailure::UpstreamConnectFailure, marked));
        assert!(!s.suspect(UpstreamFailure::UpstreamReset, marked), "the first reason stays");
        assert!(!s.takes_picks());
        assert_eq!(s.clear_suspect(before), None, "a scrape in flight when it failed proves nothing");
        assert!(!s.takes_picks());
        let lifted = s.clear_suspect(marked).map(|x| x.reason);
        assert_eq!(lifted, Some(UpstreamFailure::UpstreamConnectFailure));
        assert!(s.takes_picks());
        s.draining = true;
        assert!(!s.takes_picks());
    }
}
