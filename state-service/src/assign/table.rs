//! The assignment table and its per-worker totals.
//!
//! Bounded: at `capacity` an insert frees the oldest assignment (counted). Expiry walks two
//! age-ordered sets from their oldest end (all assignments; those without a first token), so
//! a sweep costs what it frees, never a scan of the table under the lock every pick takes.
//! Cancels of ids it does not know are remembered for the first-token TTL (bounded too): the
//! proxy cancels a pick it gave up on by the id it named, and that cancel may arrive before
//! the pick itself (a frozen or overloaded service); the pick is then discarded.

use super::{Assignment, AssignmentId, ReportOutcome};
use kvroute_kv::hasher::SeededState;
use kvroute_kv::types::WorkerId;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// Most remembered early cancels.
const MAX_TOMBSTONES: usize = 65_536;

/// What [`Assignments::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Insert {
    Inserted,
    /// The id is in the table already (a replicated pick seen twice, or a collision).
    Known,
    /// The proxy cancelled this id before the pick was recorded: discard the pick.
    Cancelled,
}

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
    /// The latest first token due among the waiting ones (none waiting: `None`): predicted,
    /// or sooner once a first token came on the worker (see `Dues`).
    pub last_first_token_due: Option<Instant>,
}

impl Pending {
    /// The waiting picks that count as not started at `now`: all of them, less one when every
    /// one is past its predicted first token. Its report is then most likely on its way (a
    /// proxy flushes reports on its tick, 100 ms by default) while the engine, done with the
    /// prefill, has nothing of ours left to start: one more may go there. At most one: a
    /// worker slower than predicted gets one pick ahead, never a pile.
    pub fn unstarted_at(&self, now: Instant) -> u32 {
        let all_due = self.last_first_token_due.is_some_and(|t| t <= now);
        self.waiting.saturating_sub(u32::from(all_due))
    }
}

/// Per worker, a multiset of keys (key -> how many), of which the largest is read.
#[derive(Debug)]
struct Largest<K>(HashMap<WorkerId, BTreeMap<K, u32>, SeededState>);

impl<K: Ord + Copy> Largest<K> {
    fn add(&mut self, worker: &WorkerId, key: K) {
        *self.0.entry(worker.clone()).or_default().entry(key).or_insert(0) += 1;
    }

    fn remove(&mut self, worker: &WorkerId, key: K) {
        let Some(m) = self.0.get_mut(worker) else { return };
        if let Some(n) = m.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&key);
            }
        }
        if m.is_empty() {
            self.0.remove(worker);
        }
    }

    fn largest(&self, worker: &WorkerId) -> Option<K> {
        self.0.get(worker).and_then(|m| m.keys().next_back().copied())
    }
}

impl<K> Default for Largest<K> {
    fn default() -> Self {
        Largest(HashMap::default())
    }
}

/// Per worker, when each of its assignments without a first token is due to have one, oldest
/// pick first. A pick is due at its predicted first token, or sooner once the engine has
/// started the picks before it: its prediction counted those picks' whole prefill as the
/// queue ahead of it, but when a first token is reported the engine has done that prefill
/// already, so each later pick is due within its own prefill of the report (in pick order,
/// the engine's FIFO). Without this, a worker whose picks came faster than predicted would
/// wait for its last pick's report before it took the next, and idle meanwhile.
#[derive(Debug, Default)]
struct Dues {
    by_worker: HashMap<WorkerId, BTreeMap<(Instant, AssignmentId), Due>, SeededState>,
    latest: Largest<Instant>,
}

#[derive(Clone, Copy, Debug)]
struct Due {
    at: Instant,
    /// The pick's own prefill, as its prediction has it.
    own: Duration,
}

impl Dues {
    fn add(&mut self, a: &Assignment) {
        let at = a.first_token_due();
        self.by_worker.entry(a.worker.clone()).or_default().insert((a.created_at, a.id), Due { at, own: a.own_prefill() });
        self.latest.add(&a.worker, at);
    }

    fn remove(&mut self, a: &Assignment) {
        let Some(picks) = self.by_worker.get_mut(&a.worker) else { return };
        if let Some(d) = picks.remove(&(a.created_at, a.id)) {
            self.latest.remove(&a.worker, d.at);
        }
        if picks.is_empty() {
            self.by_worker.remove(&a.worker);
        }
    }

    /// The engine of `worker` reported a first token at `now`: the picks still waiting there
    /// are due, one after another, within their own prefill.
    fn started(&mut self, worker: &WorkerId, now: Instant) {
        let Some(picks) = self.by_worker.get_mut(worker) else { return };
        let mut t = now;
        for d in picks.values_mut() {
            t += d.own;
            if t < d.at {
                self.latest.remove(worker, d.at);
                self.latest.add(worker, t);
                d.at = t;
            }
        }
    }

    fn latest(&self, worker: &WorkerId) -> Option<Instant> {
        self.latest.largest(worker)
    }
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
    /// Per worker, the cached parts of its in-flight assignments.
    cached: Largest<u32>,
    /// Per worker, when its assignments without a first token are due to have one.
    due: Dues,
    /// Every assignment, oldest first; and those still without a first token.
    by_age: BTreeSet<(Instant, AssignmentId)>,
    waiting_by_age: BTreeSet<(Instant, AssignmentId)>,
    capacity: usize,
    /// Assignments freed to make room (the table was full).
    evicted: u64,
    /// Early cancels: ids cancelled before their pick was recorded, and when.
    tombstones: HashMap<AssignmentId, Instant, SeededState>,
    tombstone_order: VecDeque<(Instant, AssignmentId)>,
}

impl Assignments {
    pub fn new(ttl: Duration, first_token_ttl: Duration) -> Self {
        Assignments::with_capacity(ttl, first_token_ttl, usize::MAX)
    }

    /// A table that frees its oldest assignment past `capacity` entries.
    pub fn with_capacity(ttl: Duration, first_token_ttl: Duration, capacity: usize) -> Self {
        Assignments {
            ttl,
            first_token_ttl,
            by_id: HashMap::default(),
            per_worker: HashMap::default(),
            cached: Largest::default(),
            due: Dues::default(),
            by_age: BTreeSet::new(),
            waiting_by_age: BTreeSet::new(),
            capacity: capacity.max(1),
            evicted: 0,
            tombstones: HashMap::default(),
            tombstone_order: VecDeque::new(),
        }
    }

    /// Assignments freed so far because the table was full.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The proxy cancelled `id`, which is not in the table: remember it, so the pick it names
    /// is discarded if it is recorded later.
    pub fn remember_cancel(&mut self, id: AssignmentId, now: Instant) {
        if self.tombstones.insert(id, now).is_none() {
            self.tombstone_order.push_back((now, id));
        }
        while self.tombstone_order.len() > MAX_TOMBSTONES {
            if let Some((_, old)) = self.tombstone_order.pop_front() {
                self.tombstones.remove(&old);
            }
        }
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
        p.max_cached_tokens = self.cached.largest(worker).map_or(0, u64::from);
        p.last_first_token_due = self.due.latest(worker);
        p
    }

    pub fn iter(&self) -> impl Iterator<Item = &Assignment> {
        self.by_id.values()
    }

    /// Whether `id` was cancelled before any pick of it was recorded (its proxy gave up).
    pub fn cancelled_early(&self, id: AssignmentId) -> bool {
        self.tombstones.contains_key(&id)
    }

    /// Inserts `a` unless its id is known or was cancelled already; at capacity the oldest
    /// assignment is freed first.
    pub fn insert(&mut self, a: Assignment) -> Insert {
        if self.by_id.contains_key(&a.id) {
            return Insert::Known;
        }
        if self.tombstones.remove(&a.id).is_some() {
            return Insert::Cancelled;
        }
        while self.by_id.len() >= self.capacity {
            let Some(&(_, oldest)) = self.by_age.first() else { break };
            self.remove(oldest);
            self.evicted += 1;
        }
        self.by_age.insert((a.created_at, a.id));
        if a.first_token_at.is_none() {
            self.waiting_by_age.insert((a.created_at, a.id));
        }
        let std::collections::hash_map::Entry::Vacant(slot) = self.by_id.entry(a.id) else { return Insert::Known };
        self.cached.add(&a.worker, a.cached_tokens());
        let p = self.per_worker.entry(a.worker.clone()).or_default();
        p.in_flight += 1;
        p.in_flight_tokens += u64::from(a.uncached_tokens);
        if a.first_token_at.is_none() {
            self.due.add(&a);
            p.waiting += 1;
            p.waiting_tokens += u64::from(a.uncached_tokens);
        }
        slot.insert(a);
        Insert::Inserted
    }

    /// Removes one assignment and its totals.
    fn remove(&mut self, id: AssignmentId) -> Option<Assignment> {
        let a = self.by_id.remove(&id)?;
        self.by_age.remove(&(a.created_at, id));
        self.waiting_by_age.remove(&(a.created_at, id));
        self.untrack(&a);
        Some(a)
    }

    pub fn first_token(&mut self, id: AssignmentId, now: Instant) -> ReportOutcome {
        let Some(a) = self.by_id.get_mut(&id) else { return ReportOutcome::Unknown };
        if a.first_token_at.is_some() {
            return ReportOutcome::Duplicate;
        }
        a.first_token_at = Some(now);
        let a = a.clone();
        self.waiting_by_age.remove(&(a.created_at, id));
        self.due.remove(&a);
        self.due.started(&a.worker, now);
        if let Some(p) = self.per_worker.get_mut(&a.worker) {
            p.waiting = p.waiting.saturating_sub(1);
            p.waiting_tokens = p.waiting_tokens.saturating_sub(u64::from(a.uncached_tokens));
        }
        ReportOutcome::FirstToken(a)
    }

    /// COMPLETE or CANCEL.
    pub fn finish(&mut self, id: AssignmentId) -> ReportOutcome {
        match self.remove(id) {
            Some(a) => ReportOutcome::Freed(a),
            None => ReportOutcome::Unknown,
        }
    }

    /// Frees every assignment whose TTL ran out at `now`, oldest first, and forgets early
    /// cancels older than the first-token TTL.
    pub fn expire(&mut self, now: Instant) -> Expired {
        let mut out = Expired::default();
        let due = |set: &BTreeSet<(Instant, AssignmentId)>, ttl: Duration| {
            set.first().filter(|(t, _)| now.saturating_duration_since(*t) >= ttl).map(|(_, id)| *id)
        };
        while let Some(id) = due(&self.waiting_by_age, self.first_token_ttl) {
            self.remove(id);
            out.first_token += 1;
        }
        while let Some(id) = due(&self.by_age, self.ttl) {
            self.remove(id);
            out.complete += 1;
        }
        while let Some(&(t, id)) = self.tombstone_order.front() {
            if now.saturating_duration_since(t) < self.first_token_ttl {
                break;
            }
            self.tombstone_order.pop_front();
            self.tombstones.remove(&id);
        }
        out
    }

    /// Drops everything (benchmark passes) and returns how many were dropped.
    pub fn clear(&mut self) -> usize {
        let n = self.by_id.len();
        self.by_id.clear();
        self.per_worker.clear();
        self.cached = Largest::default();
        self.due = Dues::default();
        self.by_age.clear();
        self.waiting_by_age.clear();
        n
    }

    /// Drops the assignments of a removed worker.
    pub fn forget_worker(&mut self, worker: &WorkerId) {
        let ids: Vec<AssignmentId> = self.by_id.values().filter(|a| &a.worker == worker).map(|a| a.id).collect();
        for id in ids {
            self.remove(id);
        }
    }

    fn untrack(&mut self, a: &Assignment) {
        self.cached.remove(&a.worker, a.cached_tokens());
        if a.first_token_at.is_none() {
            self.due.remove(a);
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
    use kvroute_score::{Features, Policy};

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
            budget: None,
            reserved: 0,
            background: false,
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
        t.insert(assignment(2, "w", 50, now + Duration::from_millis(1)));
        let due = Some(now + Duration::from_millis(11)); // the later one's predicted 10 ms
        assert_eq!(t.pending(&w), Pending { in_flight: 2, waiting: 2, waiting_tokens: 150, in_flight_tokens: 150, max_cached_tokens: 0, last_first_token_due: due });
        assert!(matches!(t.first_token(AssignmentId(1), now), ReportOutcome::FirstToken(_)));
        assert_eq!(t.first_token(AssignmentId(1), now), ReportOutcome::Duplicate);
        let rebased = Some(now + Duration::from_millis(10)); // its own prefill after the report
        assert_eq!(t.pending(&w), Pending { in_flight: 2, waiting: 1, waiting_tokens: 50, in_flight_tokens: 150, max_cached_tokens: 0, last_first_token_due: rebased });
        assert!(matches!(t.finish(AssignmentId(1)), ReportOutcome::Freed(_)));
        assert!(matches!(t.finish(AssignmentId(2)), ReportOutcome::Freed(_)));
        assert_eq!(t.finish(AssignmentId(2)), ReportOutcome::Unknown);
        assert_eq!((t.pending(&w), t.len()), (Pending::default(), 0));
    }

    #[tokio::test(start_paused = true)]
    async fn one_pick_counts_as_started_once_every_waiting_one_is_past_its_predicted_first_token() {
        let mut t = table();
        let now = Instant::now();
        let w = WorkerId::new("w");
        t.insert(assignment(1, "w", 100, now));
        t.insert(assignment(2, "w", 50, now + Duration::from_millis(5)));
        let unstarted = |t: &Assignments, after_ms: u64| t.pending(&w).unstarted_at(now + Duration::from_millis(after_ms));
        assert_eq!((unstarted(&t, 12), unstarted(&t, 15), unstarted(&t, 1_000)), (2, 1, 1), "one less only once the last is due");
        t.first_token(AssignmentId(2), now);
        assert_eq!((unstarted(&t, 9), unstarted(&t, 10)), (1, 0), "the later one reported: the earlier one's due counts");
        t.finish(AssignmentId(1));
        assert_eq!(t.pending(&w).last_first_token_due, None, "a freed pick leaves no due time behind");
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_token_makes_the_picks_behind_it_due_within_their_own_prefill() {
        let mut t = table();
        let now = Instant::now();
        let w = WorkerId::new("w");
        // Three picks on one worker, each predicted behind the ones before it: 1000 ms for the
        // first (all its own), 2000 ms for the second (half its own), 3000 ms for the third
        // (a third its own), so each one's own prefill is 1000 ms.
        for (id, ttft, tokens) in [(1, 1_000.0, 100.0), (2, 2_000.0, 200.0), (3, 3_000.0, 300.0)] {
            let mut a = assignment(id, "w", 100, now);
            a.created_at = now + Duration::from_millis(id);
            (a.predicted_ttft_ms, a.features.tokens) = (ttft, tokens);
            t.insert(a);
        }
        let due = |t: &Assignments| t.pending(&w).last_first_token_due.map(|d| d.duration_since(now).as_millis());
        assert_eq!(due(&t), Some(3_003));
        // The first one's prefill went faster than predicted: its first token at 400 ms puts the
        // third within its own prefill and the second's, at 2400 ms.
        t.first_token(AssignmentId(1), now + Duration::from_millis(400));
        assert_eq!(due(&t), Some(2_400));
        // The second started at 2600 ms, later than its rebased due: the third is due 1000 ms
        // after it, 3600 ms, but never later than its own prediction.
        t.first_token(AssignmentId(2), now + Duration::from_millis(2_600));
        assert_eq!(due(&t), Some(2_400), "a report never pushes a due past what it was");
        t.first_token(AssignmentId(3), now + Duration::from_millis(2_700));
        assert_eq!(due(&t), None);
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

    #[tokio::test(start_paused = true)]
    async fn a_full_table_frees_its_oldest_and_early_cancels_discard_their_pick() {
        let mut t = Assignments::with_capacity(Duration::from_secs(600), Duration::from_secs(60), 2);
        let start = Instant::now();
        for id in 1..=3 {
            assert_eq!(t.insert(assignment(id, "w", 10, start + Duration::from_millis(id))), Insert::Inserted);
        }
        assert_eq!((t.len(), t.evicted(), t.contains(AssignmentId(1))), (2, 1, false), "the oldest went");
        assert_eq!(t.pending(&WorkerId::new("w")).in_flight, 2);
        assert_eq!(t.insert(assignment(3, "w", 10, start)), Insert::Known);
        t.remember_cancel(AssignmentId(9), start);
        assert_eq!(t.insert(assignment(9, "w", 10, start)), Insert::Cancelled);
        assert_eq!(t.insert(assignment(9, "w", 10, start)), Insert::Inserted, "a cancel discards one pick");
        t.remember_cancel(AssignmentId(10), start);
        tokio::time::advance(Duration::from_secs(61)).await;
        t.expire(Instant::now());
        assert_eq!(t.insert(assignment(10, "w", 10, Instant::now())), Insert::Inserted, "early cancels are forgotten after the TTL");
    }
}
