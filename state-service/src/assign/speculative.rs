//! Speculative credit: right after a pick, the chosen worker is credited with the request's
//! keys for a short time. A burst of requests sharing a brand-new prefix then follows the
//! first one instead of scattering before the worker's KV events arrive. Lookups take, per
//! worker, the larger of the index match and the speculative match.
//!
//! The TTL is the same for every credit, so expiries come in insertion order and a queue
//! purges them without a scan.

use crate::types::{BlockKey, WorkerId};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug)]
pub struct Speculative {
    ttl: Duration,
    by_key: HashMap<BlockKey, Vec<(WorkerId, Instant)>>,
    queue: VecDeque<(Instant, WorkerId, Vec<BlockKey>)>,
}

impl Speculative {
    pub fn new(ttl: Duration) -> Self {
        Speculative { ttl, by_key: HashMap::new(), queue: VecDeque::new() }
    }

    /// Number of keys with live credit.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn clear(&mut self) {
        self.by_key.clear();
        self.queue.clear();
    }

    /// Credits `worker` with `keys` until `now + ttl`.
    pub fn credit(&mut self, keys: &[BlockKey], worker: &WorkerId, now: Instant) {
        if keys.is_empty() {
            return;
        }
        self.purge(now);
        let until = now + self.ttl;
        for key in keys {
            let holders = self.by_key.entry(*key).or_default();
            match holders.iter_mut().find(|(w, _)| w == worker) {
                Some(h) => h.1 = until,
                None => holders.push((worker.clone(), until)),
            }
        }
        self.queue.push_back((until, worker.clone(), keys.to_vec()));
    }

    /// Per worker, how many leading `keys` it holds credit for at `now`.
    pub fn matches(&self, keys: &[BlockKey], now: Instant) -> HashMap<WorkerId, u32> {
        let mut out: HashMap<WorkerId, u32> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let mut advanced = false;
            for (worker, until) in self.by_key.get(key).into_iter().flatten() {
                let held = out.get(worker).copied().unwrap_or(0);
                if *until > now && held == i as u32 {
                    out.insert(worker.clone(), held + 1);
                    advanced = true;
                }
            }
            if !advanced {
                break;
            }
        }
        out
    }

    /// Drops expired credit.
    pub fn purge(&mut self, now: Instant) {
        while self.queue.front().is_some_and(|(until, _, _)| *until <= now) {
            let Some((_, worker, keys)) = self.queue.pop_front() else { break };
            for key in keys {
                if let Some(holders) = self.by_key.get_mut(&key) {
                    holders.retain(|(w, until)| !(w == &worker && *until <= now));
                    if holders.is_empty() {
                        self.by_key.remove(&key);
                    }
                }
            }
        }
    }

    pub fn forget_worker(&mut self, worker: &WorkerId) {
        self.by_key.retain(|_, holders| {
            holders.retain(|(w, _)| w != worker);
            !holders.is_empty()
        });
        self.queue.retain(|(_, w, _)| w != worker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(range: std::ops::Range<u64>) -> Vec<BlockKey> {
        range.map(BlockKey).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn credit_lasts_for_the_ttl() {
        let mut s = Speculative::new(Duration::from_secs(2));
        let (a, b) = (WorkerId::new("a"), WorkerId::new("b"));
        s.credit(&keys(0..4), &a, Instant::now());
        s.credit(&keys(0..2), &b, Instant::now());
        let m = s.matches(&keys(0..6), Instant::now());
        assert_eq!((m.get(&a), m.get(&b)), (Some(&4), Some(&2)));
        assert!(s.matches(&keys(50..52), Instant::now()).is_empty());
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert_eq!(s.matches(&keys(0..6), Instant::now()).get(&a), Some(&4));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(s.matches(&keys(0..6), Instant::now()).is_empty());
        s.purge(Instant::now());
        assert!(s.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn renewed_credit_survives_the_old_expiry() {
        let mut s = Speculative::new(Duration::from_secs(2));
        let a = WorkerId::new("a");
        s.credit(&keys(0..2), &a, Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        s.credit(&keys(0..2), &a, Instant::now());
        tokio::time::advance(Duration::from_millis(1500)).await;
        s.purge(Instant::now());
        assert_eq!(s.matches(&keys(0..2), Instant::now()).get(&a), Some(&2));
        s.forget_worker(&a);
        assert!(s.is_empty());
    }
}
