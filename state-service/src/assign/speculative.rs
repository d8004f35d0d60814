//! Speculative credit: right after a pick, the chosen worker is credited with the request's
//! keys for a short time. A burst of requests sharing a brand-new prefix then follows the
//! first one instead of scattering before the worker's KV events arrive. Lookups take, per
//! worker, the larger of the index match and the speculative match.
//!
//! Keys are chained: a key stands for its whole prefix, so one credited key at position `q`
//! proves that the worker was credited with this request's first `q + 1` keys. A credit
//! therefore records only every [`STRIDE`]-th key and the last one (32 of an 8k-token
//! prompt's 512). A lookup reads every sampled position of the request's keys, then looks
//! at every position of the stride after each worker's last sampled hit, where a
//! credited prompt's last key can be. A request that extends a credited prompt (the next
//! turn) matches it exactly; one that leaves it inside a stride (same system prompt, another
//! question) matches it rounded down to a multiple of the stride: under 256 tokens at block
//! size 16, noise next to a prediction's tolerance, and the KV events bring the exact length
//! a few milliseconds later. Each pick credits and later purges keys in a table of hundreds
//! of thousands, cache misses all: in `examples/pick_bench.rs` a pick of 512 unique keys took
//! p50 145 us with a heap-allocated holder list per key, 37 us with the inline arrays below
//! and every key credited, 5 us sampled.
//!
//! The TTL is the same for every credit, so expiries come in insertion order and a queue
//! purges them without a scan. Each (key, worker) pair counts the live credits that name it:
//! a renewed credit outlives the older one's expiry without timestamps per key. The per-key
//! record is a small inline array, never an allocation: at most [`HOLDERS`] workers per key;
//! a key that already has that many keeps them and records no more until one expires.

use kvroute_kv::hasher::SeededState;
use kvroute_kv::types::{BlockKey, WorkerId, WorkerSlots};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// Workers one key can hold credit for at once.
pub const HOLDERS: usize = 4;

/// A credit records the keys at positions `STRIDE - 1, 2 * STRIDE - 1, ...` and its last key.
pub const STRIDE: usize = 16;

/// One key's credit: `(worker, live credits)` pairs, `count == 0` for a free place.
type Holders = [(u32, u32); HOLDERS];

#[derive(Debug)]
pub struct Speculative {
    ttl: Duration,
    workers: WorkerSlots,
    by_key: HashMap<BlockKey, Holders, SeededState>,
    queue: VecDeque<(Instant, u32, Vec<BlockKey>)>,
}

impl Speculative {
    pub fn new(ttl: Duration) -> Self {
        Speculative { ttl, workers: WorkerSlots::default(), by_key: HashMap::default(), queue: VecDeque::new() }
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
        let Some(last) = keys.last() else { return };
        self.purge(now);
        let w = self.workers.intern(worker);
        let sampled = keys.iter().skip(STRIDE - 1).step_by(STRIDE);
        let extra = (!keys.len().is_multiple_of(STRIDE)).then_some(last);
        let mut recorded = Vec::with_capacity(keys.len() / STRIDE + 1);
        for key in sampled.chain(extra) {
            let holders = self.by_key.entry(*key).or_default();
            let place = holders.iter().position(|&(h, n)| h == w && n > 0).or_else(|| holders.iter().position(|&(_, n)| n == 0));
            if let Some(i) = place {
                holders[i] = (w, holders[i].1 + 1);
                recorded.push(*key);
            }
        }
        self.queue.push_back((now + self.ttl, w, recorded));
    }

    /// Per worker, how many leading `keys` it holds credit for at `now`, as the module doc
    /// describes (workers without any are left out).
    pub fn matches(&mut self, keys: &[BlockKey], now: Instant) -> Vec<(WorkerId, u32)> {
        self.purge(now);
        let mut held = vec![0u32; self.workers.len()];
        let credit_at = |q: usize, held: &mut [u32]| {
            for &(w, _) in self.by_key.get(&keys[q]).into_iter().flatten().filter(|(_, n)| *n > 0) {
                held[w as usize] = held[w as usize].max(q as u32 + 1);
            }
        };
        // Every sampled position, not only up to the first miss: a key can lack a credit that
        // later keys of the same prompt have (it had HOLDERS others when the credit came).
        for q in (STRIDE - 1..keys.len()).step_by(STRIDE) {
            credit_at(q, &mut held);
        }
        // A credited prompt whose length is not a multiple of STRIDE ends in the stride after
        // its worker's last sampled hit (or in the first stride).
        let mut frontiers: Vec<usize> = held.iter().map(|&n| n as usize).chain([0]).collect();
        frontiers.sort_unstable();
        frontiers.dedup();
        for from in frontiers {
            for q in from..(from + STRIDE - 1).min(keys.len()) {
                credit_at(q, &mut held);
            }
        }
        self.workers.named(held)
    }

    /// Drops expired credit.
    pub fn purge(&mut self, now: Instant) {
        while self.queue.front().is_some_and(|(until, _, _)| *until <= now) {
            let Some((_, w, keys)) = self.queue.pop_front() else { break };
            for key in keys {
                let Some(holders) = self.by_key.get_mut(&key) else { continue };
                if let Some(h) = holders.iter_mut().find(|(h, n)| *h == w && *n > 0) {
                    h.1 -= 1;
                }
                if holders.iter().all(|&(_, n)| n == 0) {
                    self.by_key.remove(&key);
                }
            }
        }
    }

    pub fn forget_worker(&mut self, worker: &WorkerId) {
        let Some(w) = self.workers.find(worker) else { return };
        self.by_key.retain(|_, holders| {
            for (h, n) in holders.iter_mut() {
                if *h == w {
                    *n = 0;
                }
            }
            holders.iter().any(|&(_, n)| n > 0)
        });
        self.queue.retain(|(_, h, _)| *h != w);
        self.workers.release(w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(range: std::ops::Range<u64>) -> Vec<BlockKey> {
        range.map(BlockKey).collect()
    }

    fn held(m: &[(WorkerId, u32)], w: &WorkerId) -> Option<u32> {
        m.iter().find(|(x, _)| x == w).map(|(_, n)| *n)
    }

    #[tokio::test(start_paused = true)]
    async fn credit_lasts_for_the_ttl() {
        let mut s = Speculative::new(Duration::from_secs(2));
        let (a, b) = (WorkerId::new("a"), WorkerId::new("b"));
        s.credit(&keys(0..4), &a, Instant::now());
        s.credit(&keys(0..2), &b, Instant::now());
        let m = s.matches(&keys(0..6), Instant::now());
        assert_eq!((held(&m, &a), held(&m, &b)), (Some(4), Some(2)));
        assert!(s.matches(&keys(50..52), Instant::now()).is_empty());
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert_eq!(held(&s.matches(&keys(0..6), Instant::now()), &a), Some(4));
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
        assert_eq!(held(&s.matches(&keys(0..2), Instant::now()), &a), Some(2));
        s.forget_worker(&a);
        assert!(s.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_credits_at_most_holders_workers() {
        let mut s = Speculative::new(Duration::from_secs(2));
        let workers: Vec<WorkerId> = (0..=HOLDERS).map(|i| WorkerId::new(&format!("w{i}"))).collect();
        for w in &workers {
            s.credit(&keys(0..3), w, Instant::now());
        }
        let m = s.matches(&keys(0..3), Instant::now());
        assert_eq!(m.len(), HOLDERS);
        assert_eq!(held(&m, &workers[HOLDERS]), None);
        // The unrecorded credit does not take anything away when it expires.
        tokio::time::advance(Duration::from_secs(1)).await;
        s.credit(&keys(0..3), &workers[0], Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        let m = s.matches(&keys(0..3), Instant::now());
        assert_eq!((m.len(), held(&m, &workers[0])), (1, Some(3)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(s.matches(&keys(0..3), Instant::now()).is_empty());
        assert!(s.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_longer_credit_outlives_the_full_keys_it_skipped() {
        // Four workers fill keys 15 and 31 of a 32-key prompt; a fifth, credited a second
        // later with a 64-key extension, is recorded only at 47 and 63. Once the four expire,
        // the fifth still matches the whole extension.
        let mut s = Speculative::new(Duration::from_secs(2));
        let workers: Vec<WorkerId> = (0..=HOLDERS).map(|i| WorkerId::new(&format!("w{i}"))).collect();
        for w in &workers[..HOLDERS] {
            s.credit(&keys(0..32), w, Instant::now());
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        s.credit(&keys(0..64), &workers[HOLDERS], Instant::now());
        tokio::time::advance(Duration::from_millis(1500)).await;
        let m = s.matches(&keys(0..80), Instant::now());
        assert_eq!(m, vec![(workers[HOLDERS].clone(), 64)]);
        // A forgotten worker's slot is reused without inheriting its credit.
        s.forget_worker(&workers[HOLDERS]);
        s.credit(&keys(100..103), &WorkerId::new("new"), Instant::now());
        assert!(s.matches(&keys(0..64), Instant::now()).is_empty());
        assert_eq!(held(&s.matches(&keys(100..103), Instant::now()), &WorkerId::new("new")), Some(3));
    }

    /// Chained keys of a token path: equal choices give equal keys up to the first difference.
    fn chained(choices: &[u8]) -> Vec<BlockKey> {
        let mut h = 0x51u64;
        choices.iter().map(|&c| { h = (h ^ u64::from(c)).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29); BlockKey(h) }).collect()
    }

    proptest::proptest! {
        /// Per worker, the longest common prefix with any prompt it was credited with: whole
        /// when the request extends that prompt, else rounded down to the stride.
        #[test]
        fn sampled_credit_matches_the_full_prefix(
            credits in proptest::collection::vec((proptest::collection::vec(0u8..2, 0..70), 0usize..HOLDERS, 0u64..1500), 1..12),
            base in 0usize..12,
            cut in 0usize..80,
            suffix in proptest::collection::vec(0u8..2, 0..20),
        ) {
            // The query shares a prefix with one of the credited prompts, often all of it.
            let from = &credits[base % credits.len()].0;
            let query: Vec<u8> = from[..cut.min(from.len())].iter().chain(&suffix).copied().collect();
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
            rt.block_on(async {
                let workers: Vec<WorkerId> = (0..HOLDERS).map(|i| WorkerId::new(&format!("w{i}"))).collect();
                let mut s = Speculative::new(Duration::from_secs(2));
                // Each credit comes some ms after the one before; the query comes 2 s after
                // the first, when the credits made in its first millisecond have expired.
                let start = Instant::now();
                let mut at = Vec::new();
                for (choices, w, after_ms) in &credits {
                    tokio::time::advance(Duration::from_millis(*after_ms / credits.len() as u64)).await;
                    at.push(Instant::now());
                    s.credit(&chained(choices), &workers[*w], Instant::now());
                }
                tokio::time::advance((start + Duration::from_millis(2000)).saturating_duration_since(Instant::now())).await;
                let now = Instant::now();
                let live: Vec<_> = credits.iter().zip(&at).filter(|(_, t)| **t + Duration::from_secs(2) > now).map(|(c, _)| c).collect();
                let query = chained(&query);
                let mut got = s.matches(&query, now);
                got.sort();
                let mut want: Vec<(WorkerId, u32)> = workers.iter().enumerate().filter_map(|(i, w)| {
                    let best = live.iter().filter(|(_, c, _)| *c == i)
                        .map(|(choices, _, _)| {
                            let common = chained(choices).iter().zip(&query).take_while(|(a, b)| a == b).count();
                            if common == choices.len() { common } else { common / STRIDE * STRIDE }
                        })
                        .max().unwrap_or(0);
                    (best > 0).then(|| (w.clone(), best as u32))
                }).collect();
                want.sort();
                proptest::prop_assert_eq!(got, want);
                Ok(())
            })?;
        }
    }
}
