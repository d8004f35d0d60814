//! The in-memory ledger: one sliding log per scope (see [`super::ledger`] for the contract).

use super::ledger::{Ledger, LedgerFuture, Limit, Limits, Outcome, Reserve, Scope, Settle, Usage};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use tokio::time::Instant;

/// Concurrency rejections say "retry in a second": nothing predicts when a slot frees.
pub const CONCURRENCY_RETRY_MS: u64 = 1000;

/// One scope's admitted requests over the window.
#[derive(Debug, Default)]
pub struct Window {
    /// (admitted at, id), oldest first.
    log: VecDeque<(u64, u64)>,
    /// id -> tokens charged, for every id in `log`.
    charged: HashMap<u64, u64>,
    /// Sum of `charged`.
    tokens: u64,
    /// id -> lease expiry of the requests still running.
    leases: HashMap<u64, u64>,
    /// Charges settled after their reservation left the window: (settled at, tokens beyond
    /// the reservation), oldest first. Tokens, not requests.
    late: VecDeque<(u64, u64)>,
}

impl Window {
    fn expire(&mut self, now: u64, window_ms: u64) {
        while let Some(&(at, id)) = self.log.front() {
            if at + window_ms > now {
                break;
            }
            self.log.pop_front();
            self.tokens -= self.charged.remove(&id).unwrap_or(0);
        }
        while let Some(&(at, tokens)) = self.late.front() {
            if at + window_ms > now {
                break;
            }
            self.late.pop_front();
            self.tokens -= tokens;
        }
        self.leases.retain(|_, until| *until > now);
    }

    fn usage(&self) -> Usage {
        Usage { tokens: self.tokens, requests: self.log.len() as u64, concurrent: self.leases.len() as u64 }
    }

    fn is_empty(&self) -> bool {
        self.log.is_empty() && self.leases.is_empty() && self.late.is_empty()
    }

    /// Admits or rejects `r` at `now` (ms on the ledger's clock).
    pub fn reserve(&mut self, r: &Reserve, now: u64) -> Outcome {
        self.expire(now, r.window_ms);
        let usage = self.usage();
        if self.charged.contains_key(&r.id) || self.leases.contains_key(&r.id) {
            // The same id reserved twice (a replayed pick): admitted once, charged once, even
            // when the scope is full now (its own entry fills it).
            return Outcome::Admitted(usage);
        }
        let Limits { tokens_per_minute, requests_per_minute, concurrent_requests } = r.limits;
        let aged_out = |at: u64| (at + r.window_ms).saturating_sub(now).max(1);
        if requests_per_minute.is_some_and(|max| usage.requests + 1 > max) {
            // The oldest admitted request leaves the window first.
            let retry_after_ms = self.log.front().map_or(r.window_ms, |&(at, _)| aged_out(at));
            return Outcome::Rejected { limit: Limit::Requests, retry_after_ms, usage };
        }
        if let Some(max) = tokens_per_minute {
            if usage.tokens + r.tokens > max {
                let retry_after_ms = if r.tokens > max { r.window_ms } else { self.fits_after(max - r.tokens).map_or(r.window_ms, aged_out) };
                return Outcome::Rejected { limit: Limit::Tokens, retry_after_ms, usage };
            }
        }
        if concurrent_requests.is_some_and(|max| usage.concurrent + 1 > max) {
            return Outcome::Rejected { limit: Limit::Concurrency, retry_after_ms: CONCURRENCY_RETRY_MS, usage };
        }
        self.log.push_back((now, r.id));
        self.charged.insert(r.id, r.tokens);
        self.tokens += r.tokens;
        self.leases.insert(r.id, now + r.lease_ms);
        Outcome::Admitted(self.usage())
    }

    /// When (admission time of the entry whose expiry frees enough) the window's tokens drop
    /// to `room` or below.
    fn fits_after(&self, room: u64) -> Option<u64> {
        let mut left = self.tokens;
        for &(at, id) in &self.log {
            left -= self.charged.get(&id).copied().unwrap_or(0);
            if left <= room {
                return Some(at);
            }
        }
        None
    }

    pub fn settle(&mut self, s: &Settle, now: u64) {
        self.expire(now, s.window_ms);
        if let Some(charged) = self.charged.get_mut(&s.id) {
            self.tokens = self.tokens - *charged + s.tokens;
            *charged = s.tokens;
        } else if s.tokens > s.reserved {
            self.late.push_back((now, s.tokens - s.reserved));
            self.tokens += s.tokens - s.reserved;
        }
        self.leases.remove(&s.id);
    }
}

/// Every scope's window, on this replica.
pub struct MemoryLedger {
    windows: Mutex<HashMap<Scope, Window>>,
    overrides: Mutex<HashMap<Scope, Limits>>,
    epoch: Instant,
}

impl Default for MemoryLedger {
    fn default() -> Self {
        MemoryLedger { windows: Mutex::new(HashMap::new()), overrides: Mutex::new(HashMap::new()), epoch: Instant::now() }
    }
}

impl MemoryLedger {
    pub fn new() -> Arc<MemoryLedger> {
        Arc::new(MemoryLedger::default())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn reserve_now(&self, r: &Reserve) -> Outcome {
        let now = self.now_ms();
        let limits = self.overrides.lock().get(&r.scope).copied();
        let r = match limits {
            Some(limits) => &Reserve { limits, ..r.clone() },
            None => r,
        };
        self.windows.lock().entry(r.scope.clone()).or_default().reserve(r, now)
    }

    pub fn settle_now(&self, s: &Settle) {
        let now = self.now_ms();
        let mut windows = self.windows.lock();
        if let Some(w) = windows.get_mut(&s.scope) {
            w.settle(s, now);
            if w.is_empty() {
                windows.remove(&s.scope);
            }
        }
    }

    pub fn usage_now(&self, scope: &Scope, window_ms: u64) -> Usage {
        let now = self.now_ms();
        let mut windows = self.windows.lock();
        windows.get_mut(scope).map_or_else(Usage::default, |w| {
            w.expire(now, window_ms);
            w.usage()
        })
    }
}

impl Ledger for MemoryLedger {
    fn reserve(&self, r: Reserve) -> LedgerFuture<Outcome> {
        let outcome = self.reserve_now(&r);
        Box::pin(async move { Ok(outcome) })
    }

    fn settle(&self, s: Settle) -> LedgerFuture<()> {
        self.settle_now(&s);
        Box::pin(async { Ok(()) })
    }

    fn usage(&self, scope: Scope, window_ms: u64) -> LedgerFuture<Usage> {
        let usage = self.usage_now(&scope, window_ms);
        Box::pin(async move { Ok(usage) })
    }

    fn set_limits(&self, scope: Scope, limits: Option<Limits>) -> LedgerFuture<()> {
        let mut overrides = self.overrides.lock();
        match limits {
            Some(l) => overrides.insert(scope, l),
            None => overrides.remove(&scope),
        };
        Box::pin(async { Ok(()) })
    }

    fn limits_override(&self, scope: Scope) -> LedgerFuture<Option<Limits>> {
        let l = self.overrides.lock().get(&scope).copied();
        Box::pin(async move { Ok(l) })
    }

    fn overrides(&self) -> LedgerFuture<Vec<(Scope, Limits)>> {
        let mut all: Vec<(Scope, Limits)> = self.overrides.lock().iter().map(|(s, l)| (s.clone(), *l)).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        Box::pin(async move { Ok(all) })
    }
}

/// The contract every ledger must meet, run against the memory ledger here and against
/// real Redis by the Redis store's tests. `advance(ms)` moves the ledger's clock.
#[doc(hidden)]
pub mod contract {
    use super::*;

    pub fn scope(tenant: &str) -> Scope {
        Scope { tenant: tenant.into(), model: None }
    }

    pub fn reserve(scope: &Scope, id: u64, tokens: u64, limits: Limits) -> Reserve {
        Reserve { scope: scope.clone(), id, tokens, limits, window_ms: 60_000, lease_ms: 600_000 }
    }

    /// A settle of a reservation of `tokens` at `tokens`: no overage.
    pub fn settle(scope: &Scope, id: u64, tokens: u64) -> Settle {
        Settle { scope: scope.clone(), id, tokens, reserved: tokens, window_ms: 60_000 }
    }

    /// A request settles after its reservation left the window: what it cost beyond the
    /// reservation is charged when it settles, in that window; less is nothing to give back.
    pub async fn late_settles_are_charged_when_they_happen<F, Fut>(ledger: &dyn Ledger, tenant: &str, advance: F)
    where
        F: Fn(u64) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let s = scope(tenant);
        let limits = Limits { tokens_per_minute: Some(1000), requests_per_minute: Some(10), ..Limits::default() };
        assert!(admitted(ledger.reserve(reserve(&s, 1, 300, limits)).await.unwrap()));
        assert!(admitted(ledger.reserve(reserve(&s, 2, 300, limits)).await.unwrap()));
        advance(61_000).await;
        assert_eq!(ledger.usage(s.clone(), 60_000).await.unwrap().tokens, 0, "both reservations aged out");
        // A long stream reserved 300 and cost 900: 600 happened after its window.
        ledger.settle(Settle { reserved: 300, ..settle(&s, 1, 900) }).await.unwrap();
        // One that cost less than it reserved has nothing left to give back.
        ledger.settle(Settle { reserved: 300, ..settle(&s, 2, 100) }).await.unwrap();
        let used = ledger.usage(s.clone(), 60_000).await.unwrap();
        assert_eq!((used.tokens, used.requests), (600, 0), "tokens, not a request");
        assert!(!admitted(ledger.reserve(reserve(&s, 3, 500, limits)).await.unwrap()), "the late tokens count against the budget");
        advance(61_000).await;
        assert_eq!(ledger.usage(s.clone(), 60_000).await.unwrap().tokens, 0, "and age out with their window");
    }

    fn admitted(o: Outcome) -> bool {
        matches!(o, Outcome::Admitted(_))
    }

    /// Tokens: admitted up to the limit, the next rejected with the time until the oldest
    /// reservation that frees enough ages out; a settle replaces the charge.
    pub async fn tokens_window<F, Fut>(ledger: &dyn Ledger, tenant: &str, advance: F)
    where
        F: Fn(u64) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let s = scope(tenant);
        let limits = Limits { tokens_per_minute: Some(1000), ..Limits::default() };
        assert!(admitted(ledger.reserve(reserve(&s, 1, 600, limits)).await.unwrap()));
        advance(10_000).await;
        assert!(admitted(ledger.reserve(reserve(&s, 2, 400, limits)).await.unwrap()));
        match ledger.reserve(reserve(&s, 3, 1, limits)).await.unwrap() {
            Outcome::Rejected { limit: Limit::Tokens, retry_after_ms, usage } => {
                assert!((49_000..=50_000).contains(&retry_after_ms), "id 1 ages out in 50 s, got {retry_after_ms}");
                assert_eq!(usage, Usage { tokens: 1000, requests: 2, concurrent: 2 });
            }
            other => panic!("expected a token rejection, got {other:?}"),
        }
        // Request 1 really cost 100 tokens: 500 are free again.
        ledger.settle(settle(&s, 1, 100)).await.unwrap();
        assert_eq!(ledger.usage(s.clone(), 60_000).await.unwrap(), Usage { tokens: 500, requests: 2, concurrent: 1 });
        assert!(admitted(ledger.reserve(reserve(&s, 3, 500, limits)).await.unwrap()));
        // Larger than the whole limit: told to wait a window.
        match ledger.reserve(reserve(&s, 4, 5000, limits)).await.unwrap() {
            Outcome::Rejected { limit: Limit::Tokens, retry_after_ms: 60_000, .. } => {}
            other => panic!("expected a token rejection of a window, got {other:?}"),
        }
        // Past the window everything aged out.
        advance(61_000).await;
        assert_eq!(ledger.usage(s.clone(), 60_000).await.unwrap().tokens, 0);
        assert!(admitted(ledger.reserve(reserve(&s, 5, 1000, limits)).await.unwrap()));
    }

    /// Requests per window and concurrent requests; a replayed id is charged once.
    pub async fn requests_and_concurrency(ledger: &dyn Ledger, tenant: &str) {
        let s = scope(tenant);
        let rpm = Limits { requests_per_minute: Some(2), ..Limits::default() };
        assert!(admitted(ledger.reserve(reserve(&s, 1, 10, rpm)).await.unwrap()));
        assert!(admitted(ledger.reserve(reserve(&s, 1, 10, rpm)).await.unwrap()), "a replay is admitted");
        assert_eq!(ledger.usage(s.clone(), 60_000).await.unwrap(), Usage { tokens: 10, requests: 1, concurrent: 1 });
        assert!(admitted(ledger.reserve(reserve(&s, 2, 10, rpm)).await.unwrap()));
        assert!(matches!(ledger.reserve(reserve(&s, 3, 10, rpm)).await.unwrap(), Outcome::Rejected { limit: Limit::Requests, .. }));

        let c = scope(&format!("{tenant}-c"));
        let conc = Limits { concurrent_requests: Some(1), ..Limits::default() };
        assert!(admitted(ledger.reserve(reserve(&c, 1, 10, conc)).await.unwrap()));
        assert!(admitted(ledger.reserve(reserve(&c, 1, 10, conc)).await.unwrap()), "a replay at the limit is still admitted");
        match ledger.reserve(reserve(&c, 2, 10, conc)).await.unwrap() {
            Outcome::Rejected { limit: Limit::Concurrency, retry_after_ms, .. } => assert_eq!(retry_after_ms, CONCURRENCY_RETRY_MS),
            other => panic!("expected a concurrency rejection, got {other:?}"),
        }
        ledger.settle(settle(&c, 1, 10)).await.unwrap();
        assert!(admitted(ledger.reserve(reserve(&c, 2, 10, conc)).await.unwrap()), "the settle freed the slot");
        // Unknown ids settle to nothing.
        ledger.settle(settle(&c, 99, 1_000_000)).await.unwrap();
        assert_eq!(ledger.usage(c.clone(), 60_000).await.unwrap().tokens, 20);
    }

    /// A runtime override replaces the limits a reservation carries, until it is removed.
    pub async fn overrides(ledger: &dyn Ledger, tenant: &str) {
        let s = scope(tenant);
        let model = Scope { tenant: tenant.into(), model: Some("m/x".into()) };
        let generous = Limits { requests_per_minute: Some(100), ..Limits::default() };
        let one = Limits { requests_per_minute: Some(1), ..Limits::default() };
        ledger.set_limits(s.clone(), Some(one)).await.unwrap();
        ledger.set_limits(model.clone(), Some(generous)).await.unwrap();
        assert_eq!(ledger.limits_override(s.clone()).await.unwrap(), Some(one));
        let listed = ledger.overrides().await.unwrap();
        assert!(listed.contains(&(s.clone(), one)) && listed.contains(&(model.clone(), generous)), "{listed:?}");
        assert!(admitted(ledger.reserve(reserve(&s, 1, 1, generous)).await.unwrap()));
        assert!(!admitted(ledger.reserve(reserve(&s, 2, 1, generous)).await.unwrap()), "the override's 1 rpm holds");
        ledger.set_limits(s.clone(), None).await.unwrap();
        assert_eq!(ledger.limits_override(s.clone()).await.unwrap(), None);
        assert!(admitted(ledger.reserve(reserve(&s, 2, 1, generous)).await.unwrap()), "back to the configured limits");
        ledger.set_limits(model, None).await.unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::contract::*;
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn memory_ledger_meets_the_contract() {
        let ledger = MemoryLedger::new();
        tokens_window(ledger.as_ref(), "a", |ms| tokio::time::advance(std::time::Duration::from_millis(ms))).await;
        requests_and_concurrency(ledger.as_ref(), "b").await;
        overrides(ledger.as_ref(), "c").await;
        late_settles_are_charged_when_they_happen(ledger.as_ref(), "d", |ms| tokio::time::advance(std::time::Duration::from_millis(ms))).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_settle_frees_its_slot_when_the_lease_ends() {
        let ledger = MemoryLedger::new();
        let s = scope("t");
        let limits = Limits { concurrent_requests: Some(1), ..Limits::default() };
        let r = Reserve { lease_ms: 5_000, ..reserve(&s, 1, 1, limits) };
        assert!(matches!(ledger.reserve_now(&r), Outcome::Admitted(_)));
        assert!(matches!(ledger.reserve_now(&Reserve { id: 2, ..r.clone() }), Outcome::Rejected { .. }));
        tokio::time::advance(std::time::Duration::from_millis(5_001)).await;
        assert!(matches!(ledger.reserve_now(&Reserve { id: 2, ..r }), Outcome::Admitted(_)));
    }

    #[test]
    fn shares_divide_every_limit() {
        let l = Limits { tokens_per_minute: Some(1000), requests_per_minute: Some(3), concurrent_requests: None };
        assert_eq!(l.share(2), Limits { tokens_per_minute: Some(500), requests_per_minute: Some(1), concurrent_requests: None });
        assert_eq!(l.share(0), l);
    }
}
