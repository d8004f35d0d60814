//! The assignment table and its per-worker totals.

use super::{Assignment, AssignmentId, ReportOutcome};
use crate::hasher::SeededState;
use crate::types::WorkerId;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// Our unfinished work on one worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub in_flight: u32,
    /// Without a first-token report yet.
    pub waiting: u32,
    /// Uncached prompt tokens of the waiting ones.
    pub waiting_tokens: u64,
    /// Uncached prompt tokens of all of them: the blocks they added to the worker's KV.
    pub in_flight_tokens: u64,
    /// The largest cached part among them: their cached prefixes, shared, counted once (an
    /// estimate of the union: requests on one worker mostly share the prefix that made them
    /// land there).
    pub max_cached_tokens: u64,
}

/// Assignments freed by a sweep, by which TTL ran out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expired {
    pub first_token: u64,
    pub complete: u64,
}

#[derive(Debug)]
pub struct Assignments {
    ttl: Duration,
    first_token_ttl: Duration,
    by_id: HashMap<AssignmentId, Assignment, SeededState>,
    per_worker: HashMap<WorkerId, Pending, SeededState>,
    /// Per worker, the cached parts of its in-flight assignments (a multiset: tokens -> count).
    cached: HashMap<WorkerId, std::collections::BTreeMap<u32, u32>, SeededState>,
}

impl Assignments {
    pub fn new(ttl: Duration, first_token_ttl: Duration) -> Self {
        Assignments { ttl, first_token_ttl, by_id: HashMap::default(), per_worker: HashMap::default(), cached: HashMap::default() }
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn get(&self, id: AssignmentId) -> Option<&Assignment> {
        self.by_id.get(&id)
    }

    pub fn contains(&self, id: AssignmentId) -> bool {
        self.by_id.contains_key(&id)
    }

    pub fn pending(&self, worker: &WorkerId) -> Pending {
        let mut p = self.per_worker.get(worker).copied().unwrap_or_default();
        p.max_cached_tokens = self.cached.get(worker).and_then(|m| m.keys().next_back()).map_or(0, |&t| u64::from(t));
        p
    }

    pub fn iter(&self) -> impl Iterator<Item = &Assignment> {
        self.by_id.values()
    }

    /// Inserts `a` unless its id is known (a replicated pick seen twice, or an id collision:
    /// the pick draws another); returns whether it was inserted.
    pub fn insert(&mut self, a: Assignment) -> bool {
        let std::collections::hash_map::Entry::Vacant(slot) = self.by_id.entry(a.id) else { return false };
        *self.cached.entry(a.worker.clone()).or_default().entry(a.prompt_tokens.saturating_sub(a.uncached_tokens)).or_insert(0) += 1;
        let p = self.per_worker.entry(a.worker.clone()).or_default();
        p.in_flight += 1;
        p.in_flight_tokens += u64::from(a.uncached_tokens);
        if a.first_token_at.is_none() {
            p.waiting += 1;
            p.waiting_tokens += u64::from(a.uncached_tokens);
        }
        slot.insert(a);
        true
    }

    pub fn first_token(&mut self, id: AssignmentId, now: Instant) -> ReportOutcome {
        let Some(a) = self.by_id.get_mut(&id) else { return ReportOutcome::Unknown };
        if a.first_token_at.is_some() {
            return ReportOutcome::Duplicate;
        }
        a.first_token_at = Some(now);
        let a = a.clone();
        if let Some(p) = self.per_worker.get_mut(&a.worker) {
            p.waiting = p.waiting.saturating_sub(1);
            p.waiting_tokens = p.waiting_tokens.saturating_sub(u64::from(a.uncached_tokens));
        }
        ReportOutcome::FirstToken(a)
    }

    /// COMPLETE or CANCEL.
    pub fn finish(&mut self, id: AssignmentId) -> ReportOutcome {
        match self.by_id.remove(&id) {
            Some(a) => {
                self.untrack(&a);
                ReportOutcome::Freed(a)
            }
            None => ReportOutcome::Unknown,
        }
    }

    /// Frees every assignment whose TTL ran out at `now`.
    pub fn expire(&mut self, now: Instant) -> Expired {
        let mut out = Expired::default();
        let (ttl, ft_ttl) = (self.ttl, self.first_token_ttl);
        let dead: Vec<(AssignmentId, bool)> = self
            .by_id
            .values()
            .filter_map(|a| {
                let age = now.saturating_duration_since(a.created_at);
                let no_first_token = a.first_token_at.is_none() && age >= ft_ttl;
                (no_first_token || age >= ttl).then_some((a.id, no_first_token))
            })
            .collect();
        for (id, no_first_token) in dead {
            if let Some(a) = self.by_id.remove(&id) {
                self.untrack(&a);
            }
            if no_first_token {
                out.first_token += 1;
            } else {
                out.complete += 1;
            }
        }
        out
    }

    /// Drops everything (benchmark passes) and returns how many were dropped.
    pub fn clear(&mut self) -> usize {
        let n = self.by_id.len();
        self.by_id.clear();
        self.per_worker.clear();
        self.cached.clear();
        n
    }

    /// Drops the assignments of a removed worker.
    pub fn forget_worker(&mut self, worker: &WorkerId) {
        self.by_id.retain(|_, a| &a.worker != worker);
        self.per_worker.remove(worker);
        self.cached.remove(worker);
    }

    fn untrack(&mut self, a: &Assignment) {
        if let Some(m) = self.cached.get_mut(&a.worker) {
            let cached = a.prompt_tokens.saturating_sub(a.uncached_tokens);
            if let Some(n) = m.get_mut(&cached) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&cached);
                }
            }
            if m.is_empty() {
                self.cached.remove(&a.worker);
            }
        }
        let Some(p) = self.per_worker.get_mut(&a.worker) else { return };
        p.in_flight = p.in_flight.saturating_sub(1);
        p.in_flight_tokens = p.in_flight_tokens.saturating_sub(u64::from(a.uncached_tokens));
        if a.first_token_at.is_none() {
            p.waiting = p.waiting.saturating_sub(1);
            p.waiting_tokens = p.waiting_tokens.saturating_sub(u64::from(a.uncached_tokens));
        }
        if p.in_flight == 0 {
            self.per_worker.remove(&a.worker);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::{Features, Policy};

    fn assignment(id: u64, worker: &str, uncached: u32, now: Instant) -> Assignment {
        Assignment {
            id: AssignmentId(id),
            worker: WorkerId::new(worker),
            policy: Policy::Kvroute,
            prompt_tokens: uncached,
            uncached_tokens: uncached,
            predicted_ttft_ms: 10.0,
            features: Features::default(),
            created_at: now,
            first_token_at: None,
            predicted_cached_tokens: None,
        }
    }

    fn table() -> Assignments {
        Assignments::new(Duration::from_secs(600), Duration::from_secs(60))
    }

    #[tokio::test(start_paused = true)]
    async fn totals_follow_reports() {
        let mut t = table();
        let now = Instant::now();
        let w = WorkerId::new("w");
        t.insert(assignment(1, "w", 100, now));
        t.insert(assignment(2, "w", 50, now));
        assert_eq!(t.pending(&w), Pending { in_flight: 2, waiting: 2, waiting_tokens: 150, in_flight_tokens: 150, max_cached_tokens: 0 });
        assert!(matches!(t.first_token(AssignmentId(1), now), ReportOutcome::FirstToken(_)));
        assert_eq!(t.first_token(AssignmentId(1), now), ReportOutcome::Duplicate);
        assert_eq!(t.pending(&w), Pending { in_flight: 2, waiting: 1, waiting_tokens: 50, in_flight_tokens: 150, max_cached_tokens: 0 });
        assert!(matches!(t.finish(AssignmentId(1)), ReportOutcome::Freed(_)));
        assert!(matches!(t.finish(AssignmentId(2)), ReportOutcome::Freed(_)));
        assert_eq!(t.finish(AssignmentId(2)), ReportOutcome::Unknown);
        assert_eq!((t.pending(&w), t.len()), (Pending::default(), 0));
    }

    #[tokio::test(start_paused = true)]
    async fn ttls_free_what_nobody_reported() {
        let mut t = table();
        let start = Instant::now();
        t.insert(assignment(1, "w", 100, start));
        t.insert(assignment(2, "w", 100, start));
        t.first_token(AssignmentId(2), start);
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(t.expire(Instant::now()), Expired::default());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(t.expire(Instant::now()), Expired { first_token: 1, complete: 0 });
        tokio::time::advance(Duration::from_secs(540)).await;
        assert_eq!(t.expire(Instant::now()), Expired { first_token: 0, complete: 1 });
        assert!(t.is_empty());
        assert_eq!(t.pending(&WorkerId::new("w")), Pending::default());
    }
}
