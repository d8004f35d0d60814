//! One model's queue of waiting picks, as a pure data structure (no clock of its own, no I/O).
//!
//! Order: classes by `(order, name)`; within a class, deficit round robin over tenants, each
//! visit adding `quantum x weight` prefill tokens to the tenant's deficit and serving while
//! the deficit covers its next request's cost (a tenant that empties loses its deficit, as in
//! DRR, and one that had nothing queued joins the ring at its front, so a tenant sending below
//! its share is served at the next dispatch); within a tenant, the smallest
//! `cost - aging x seconds waited` first.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// A queued pick.
#[derive(Debug)]
pub struct Entry<T> {
    pub ticket: u64,
    pub tenant: String,
    /// Predicted prefill tokens: what it costs its tenant's share.
    pub cost: u64,
    /// When it started waiting (earlier than its arrival here when another replica held it).
    pub since: Instant,
    pub deadline: Instant,
    pub job: T,
}

struct TenantQueue<T> {
    entries: Vec<Entry<T>>,
    deficit: u64,
    weight: u64,
    /// Its turn in the ring has begun (its quantum added).
    in_turn: bool,
}

impl<T> TenantQueue<T> {
    /// The entry to serve next: least cost after aging (ties: the older); infinite aging is
    /// first in, first out.
    fn best(&self, now: Instant, aging_per_s: f64) -> usize {
        if aging_per_s.is_infinite() {
            return (0..self.entries.len()).min_by_key(|&i| self.entries[i].since).unwrap_or(0);
        }
        let score = |e: &Entry<T>| e.cost as f64 - aging_per_s * now.saturating_duration_since(e.since).as_secs_f64();
        let mut best = 0;
        for (i, e) in self.entries.iter().enumerate().skip(1) {
            let (s, b) = (score(e), score(&self.entries[best]));
            if s < b || (s == b && e.since < self.entries[best].since) {
                best = i;
            }
        }
        best
    }
}

struct ClassQueue<T> {
    tenants: HashMap<String, TenantQueue<T>>,
    /// Tenants with queued entries, in round-robin order (the front is being served).
    ring: VecDeque<String>,
}

impl<T> Default for ClassQueue<T> {
    fn default() -> Self {
        ClassQueue { tenants: HashMap::new(), ring: VecDeque::new() }
    }
}

impl<T> ClassQueue<T> {
    fn pop_next(&mut self, now: Instant, aging_per_s: f64, quantum: u64) -> Option<Entry<T>> {
        loop {
            let name = self.ring.front()?.clone();
            let Some(t) = self.tenants.get_mut(&name) else {
                self.ring.pop_front();
                continue;
            };
            if t.entries.is_empty() {
                self.tenants.remove(&name);
                self.ring.pop_front();
                continue;
            }
            // Its turn begins with its quantum; it serves while the deficit lasts, then the
            // next tenant's turn begins.
            if !t.in_turn {
                t.in_turn = true;
                t.deficit += quantum.max(1) * t.weight;
            }
            let i = t.best(now, aging_per_s);
            let cost = t.entries[i].cost.max(1);
            if t.deficit >= cost {
                t.deficit -= cost;
                let e = t.entries.swap_remove(i);
                if t.entries.is_empty() {
                    self.tenants.remove(&name);
                    self.ring.pop_front();
                }
                return Some(e);
            }
            t.in_turn = false;
            self.ring.rotate_left(1);
        }
    }

    fn remove_where(&mut self, mut gone: impl FnMut(&Entry<T>) -> bool) -> Vec<Entry<T>> {
        let mut out = Vec::new();
        for t in self.tenants.values_mut() {
            let mut i = 0;
            while i < t.entries.len() {
                if gone(&t.entries[i]) {
                    out.push(t.entries.swap_remove(i));
                } else {
                    i += 1;
                }
            }
        }
        self.tenants.retain(|_, t| !t.entries.is_empty());
        let tenants = &self.tenants;
        self.ring.retain(|n| tenants.contains_key(n));
        out
    }
}

/// Where a ticket sits.
#[derive(Clone)]
struct Place {
    class: (u32, String),
    tenant: String,
}

/// One model's waiting picks.
pub struct Queue<T> {
    classes: BTreeMap<(u32, String), ClassQueue<T>>,
    places: HashMap<u64, Place>,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue { classes: BTreeMap::new(), places: HashMap::new() }
    }
}

impl<T> Queue<T> {
    pub fn len(&self) -> usize {
        self.places.len()
    }

    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// Queues `entry` in class `(order, class)` with its tenant's `weight`. A ticket already
    /// queued is replaced.
    pub fn push(&mut self, order: u32, class: &str, weight: u32, entry: Entry<T>) {
        self.remove(entry.ticket);
        let key = (order, class.to_string());
        let q = self.classes.entry(key.clone()).or_default();
        let t = q.tenants.entry(entry.tenant.clone()).or_insert_with(|| TenantQueue { entries: Vec::new(), deficit: 0, weight: 1, in_turn: false });
        t.weight = u64::from(weight.max(1));
        if t.entries.is_empty() && !q.ring.contains(&entry.tenant) {
            // A tenant with nothing queued is served next, as a sparse flow in FQ-CoDel: a
            // tenant below its share waits for no other's quantum, only for capacity. One
            // that keeps a backlog never comes back to the front this way.
            q.ring.push_front(entry.tenant.clone());
        }
        self.places.insert(entry.ticket, Place { class: key, tenant: entry.tenant.clone() });
        t.entries.push(entry);
    }

    /// Puts back an entry [`Queue::pop_next`] gave out but that was not dispatched: its cost is
    /// refunded to its tenant's deficit, and the tenant is served first again (where it was).
    /// Entries taken in one pass are put back after it, so a pass never sees one twice. An
    /// entry whose ticket was queued again meanwhile (its proxy called while it was out) is
    /// given back instead: the newer one stands.
    pub fn put_back(&mut self, order: u32, class: &str, weight: u32, entry: Entry<T>) -> Option<Entry<T>> {
        if self.places.contains_key(&entry.ticket) {
            return Some(entry);
        }
        let key = (order, class.to_string());
        let q = self.classes.entry(key.clone()).or_default();
        // A tenant the pass emptied was in its turn (its quantum spent on what comes back).
        let t = q.tenants.entry(entry.tenant.clone()).or_insert_with(|| TenantQueue { entries: Vec::new(), deficit: 0, weight: 1, in_turn: true });
        t.weight = u64::from(weight.max(1));
        t.deficit += entry.cost.max(1);
        if !q.ring.contains(&entry.tenant) {
            q.ring.push_front(entry.tenant.clone());
        }
        self.places.insert(entry.ticket, Place { class: key, tenant: entry.tenant.clone() });
        t.entries.push(entry);
        None
    }

    /// How many picks of `tenant` wait in class `class`.
    pub fn flow_len(&self, class: &str, tenant: &str) -> usize {
        let in_class = self.classes.iter().filter(|((_, name), _)| name == class);
        in_class.filter_map(|(_, q)| q.tenants.get(tenant)).map(|t| t.entries.len()).sum()
    }

    pub fn get_mut(&mut self, ticket: u64) -> Option<&mut Entry<T>> {
        let place = self.places.get(&ticket)?;
        let t = self.classes.get_mut(&place.class)?.tenants.get_mut(&place.tenant)?;
        t.entries.iter_mut().find(|e| e.ticket == ticket)
    }

    pub fn remove(&mut self, ticket: u64) -> Option<Entry<T>> {
        let place = self.places.remove(&ticket)?;
        let q = self.classes.get_mut(&place.class)?;
        let mut out = q.remove_where(|e| e.ticket == ticket);
        if q.tenants.is_empty() {
            self.classes.remove(&place.class);
        }
        out.pop()
    }

    /// The next entry to dispatch, taken out of the queue.
    pub fn pop_next(&mut self, now: Instant, aging_per_s: f64, quantum: u64) -> Option<Entry<T>> {
        let (key, e) = self.classes.iter_mut().find_map(|(k, q)| q.pop_next(now, aging_per_s, quantum).map(|e| (k.clone(), e)))?;
        if self.classes.get(&key).is_some_and(|q| q.tenants.is_empty()) {
            self.classes.remove(&key);
        }
        self.places.remove(&e.ticket);
        Some(e)
    }

    /// Entries whose deadline is at or before `now`, taken out of the queue.
    pub fn expire(&mut self, now: Instant) -> Vec<Entry<T>> {
        self.remove_where(|e| e.deadline <= now)
    }

    /// Entries for which `gone` holds, taken out of the queue.
    pub fn remove_where(&mut self, mut gone: impl FnMut(&Entry<T>) -> bool) -> Vec<Entry<T>> {
        let mut out = Vec::new();
        for q in self.classes.values_mut() {
            out.extend(q.remove_where(&mut gone));
        }
        self.classes.retain(|_, q| !q.tenants.is_empty());
        for e in &out {
            self.places.remove(&e.ticket);
        }
        out
    }

    /// How long the oldest entry has waited.
    pub fn oldest_wait(&self, now: Instant) -> Duration {
        self.classes
            .values()
            .flat_map(|q| q.tenants.values())
            .flat_map(|t| t.entries.iter())
            .map(|e| now.saturating_duration_since(e.since))
            .max()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ticket: u64, tenant: &str, cost: u64, since: Instant) -> Entry<()> {
        Entry { ticket, tenant: tenant.into(), cost, since, deadline: since + Duration::from_secs(60), job: () }
    }

    fn drain(q: &mut Queue<()>, now: Instant) -> Vec<u64> {
        std::iter::from_fn(|| q.pop_next(now, 0.0, 1_000).map(|e| e.ticket)).collect()
    }

    #[test]
    fn classes_go_strictly_by_order() {
        let now = Instant::now();
        let mut q = Queue::default();
        q.push(2, "batch", 1, entry(1, "a", 10, now));
        q.push(0, "interactive", 1, entry(2, "a", 5_000, now));
        q.push(1, "standard", 1, entry(3, "a", 10, now));
        assert_eq!(drain(&mut q, now), vec![2, 3, 1]);
        assert!(q.is_empty());
    }

    #[test]
    fn tenants_share_a_class_by_prefill_tokens_and_weight() {
        let now = Instant::now();
        for weight_b in [1u32, 3] {
            let mut q = Queue::default();
            // Tenant a queues requests of 1,000 tokens, b of 250.
            for i in 0..40 {
                q.push(1, "standard", 1, entry(i, "a", 1_000, now));
            }
            for i in 0..100 {
                q.push(1, "standard", weight_b, entry(100 + i, "b", 250, now));
            }
            // Whole rounds: a serves 1,000 tokens a round, b 1,000 x its weight.
            let (mut tokens_a, mut tokens_b) = (0u64, 0u64);
            while tokens_a + tokens_b < 20_000 {
                let e = q.pop_next(now, 0.0, 1_000).unwrap();
                if e.tenant == "a" {
                    tokens_a += e.cost;
                } else {
                    tokens_b += e.cost;
                }
            }
            assert_eq!(tokens_b, tokens_a * u64::from(weight_b), "b gets {weight_b}x a's prefill tokens");
            // In requests: 4 x weight of b's small ones per big one of a's.
            assert_eq!(tokens_b / 250, 4 * u64::from(weight_b) * (tokens_a / 1_000));
        }
    }

    #[test]
    fn a_tenant_with_nothing_queued_is_served_next_not_after_the_backlog_s_quantum() {
        let now = Instant::now();
        let mut q = Queue::default();
        for i in 0..20 {
            q.push(1, "standard", 1, entry(i, "a", 1_000, now));
        }
        // a is being served with a quantum worth 8 of its requests.
        assert_eq!(q.pop_next(now, 0.0, 8_000).map(|e| e.tenant), Some("a".to_string()));
        q.push(1, "standard", 1, entry(100, "b", 1_000, now));
        assert_eq!(q.pop_next(now, 0.0, 8_000).map(|e| e.ticket), Some(100));
        // Then a's backlog again, and b, sending again, is next again.
        assert_eq!(q.pop_next(now, 0.0, 8_000).map(|e| e.tenant), Some("a".to_string()));
        q.push(1, "standard", 1, entry(101, "b", 1_000, now));
        assert_eq!(q.pop_next(now, 0.0, 8_000).map(|e| e.ticket), Some(101));
    }

    #[test]
    fn shortest_first_within_a_tenant_with_aging_bounding_the_wait() {
        let t0 = Instant::now();
        let mut q = Queue::default();
        q.push(1, "standard", 1, entry(1, "a", 30_000, t0));
        q.push(1, "standard", 1, entry(2, "a", 500, t0 + Duration::from_secs(1)));
        // Without aging the short one goes first.
        let now = t0 + Duration::from_secs(2);
        assert_eq!(q.pop_next(now, 0.0, 100_000).map(|e| e.ticket), Some(2));
        // With 8,192 tokens/s of aging, the 30k-token request has waited 6 s by t0+6 (score
        // 30,000 - 49,152) and goes before a fresh 1-token one: a request of c tokens is
        // overtaken by shorter ones for at most c / 8,192 s.
        let later = t0 + Duration::from_secs(6);
        q.push(1, "standard", 1, entry(3, "a", 1, later));
        q.push(1, "standard", 1, entry(4, "a", 2, later + Duration::from_millis(10)));
        assert_eq!(q.pop_next(later, 8_192.0, 100_000).map(|e| e.ticket), Some(1), "aged past a fresh 1-token request");
        // Infinite aging is first in, first out.
        q.push(1, "standard", 1, entry(5, "a", 1, later + Duration::from_secs(1)));
        assert_eq!(q.pop_next(later, f64::INFINITY, 100_000).map(|e| e.ticket), Some(3));
        assert_eq!(q.pop_next(later, f64::INFINITY, 100_000).map(|e| e.ticket), Some(4));
    }

    #[test]
    fn entries_put_back_after_a_pass_keep_their_turn_and_their_tenant_its_share() {
        let now = Instant::now();
        let mut q = Queue::default();
        for i in 0..4 {
            q.push(1, "standard", 1, entry(10 + i, "b", 1_000, now));
        }
        for i in 0..4 {
            q.push(1, "standard", 1, entry(i, "a", 1_000, now));
        }
        // A pass takes three entries and dispatches only the second.
        let taken: Vec<Entry<()>> = (0..3).map(|_| q.pop_next(now, 0.0, 1_000).unwrap()).collect();
        let order: Vec<&str> = taken.iter().map(|e| e.tenant.as_str()).collect();
        assert_eq!(order, ["a", "b", "a"]);
        let mut taken = taken.into_iter();
        let (first, _dispatched, third) = (taken.next().unwrap(), taken.next(), taken.next().unwrap());
        for e in [third, first] {
            assert!(q.put_back(1, "standard", 1, e).is_none());
        }
        assert_eq!(q.len(), 7);
        // A ticket queued again while out of the queue is not put back twice.
        let again = entry(0, "a", 1_000, now);
        assert!(q.put_back(1, "standard", 1, again).is_some());
        assert_eq!(q.len(), 7);
        // Over the rest, a and b still alternate and a's two held entries come back first.
        let rest: Vec<String> = std::iter::from_fn(|| q.pop_next(now, 0.0, 1_000).map(|e| e.tenant)).collect();
        let a = rest.iter().filter(|t| *t == "a").count();
        assert_eq!((a, rest.len() - a), (4, 3));
        assert_eq!(&rest[..2], ["a", "a"], "a's refunded deficit serves its held entries first");
    }

    #[test]
    fn expiry_and_removal_keep_the_ring_consistent() {
        let now = Instant::now();
        let mut q = Queue::default();
        let mut short = entry(1, "a", 10, now);
        short.deadline = now + Duration::from_millis(10);
        q.push(1, "standard", 1, short);
        q.push(1, "standard", 1, entry(2, "b", 10, now));
        q.push(1, "standard", 1, entry(3, "b", 10, now));
        assert_eq!(q.len(), 3);
        let gone: Vec<u64> = q.expire(now + Duration::from_millis(10)).iter().map(|e| e.ticket).collect();
        assert_eq!(gone, vec![1]);
        assert!(q.remove(3).is_some());
        assert!(q.remove(3).is_none());
        assert!(q.get_mut(2).is_some());
        assert_eq!(drain(&mut q, now), vec![2]);
        assert!(q.is_empty() && q.classes.is_empty());
        // A ticket pushed again replaces itself.
        q.push(1, "standard", 1, entry(5, "a", 10, now));
        q.push(0, "interactive", 1, entry(5, "a", 10, now));
        assert_eq!(q.len(), 1);
        assert_eq!(drain(&mut q, now), vec![5]);
    }
}
