//! Choosing among scored candidates: the minimum score, ties broken by load, then at random.
//!
//! Scores within [`TIE_MS`] of each other count as equal: float noise must not decide
//! placement, load should.
//!
//! The kvroute policy ([`pick_cheapest`]) minimises each candidate's placement cost (its
//! predicted TTFT plus what its prefill costs the requests queued behind it:
//! [`super::model::placement_cost`]) and widens the tie: predictions are estimates, and
//! within their error the worker that reuses the longest cached prefix is the better bet for
//! the fleet. The typical case is a burst sharing a new prefix: the second request predicts
//! about the same TTFT on the worker prefilling that prefix (it waits, then reuses it) as on
//! an idle worker (which recomputes it). Sending it to the idle worker wastes a whole prefill
//! and scatters the group; keeping it costs at most `tolerance` of its TTFT.

use super::peers::{self, PeerView, Request};
use super::Policy;
use rand::Rng;

/// Scores closer than this (milliseconds for TTFT) are a tie.
pub const TIE_MS: f64 = 1e-6;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    pub score: f64,
    pub load: u64,
}

/// Index of the best candidate, or `None` when there are none.
pub fn pick_min<R: Rng + ?Sized>(candidates: &[Scored], rng: &mut R) -> Option<usize> {
    let best = candidates.iter().map(|c| c.score).fold(f64::INFINITY, f64::min);
    let near = |c: &Scored| c.score <= best + TIE_MS || (best.is_infinite() && c.score.is_infinite());
    let least_load = candidates.iter().filter(|c| near(c)).map(|c| c.load).min()?;
    let tied: Vec<usize> = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| near(c) && c.load == least_load)
        .map(|(i, _)| i)
        .collect();
    Some(tied[rng.gen_range(0..tied.len())])
}

/// Index of the candidate with the lowest placement cost, where every cost within
/// `tolerance` (relative, e.g. 0.1 = 10%) of the lowest counts as tied; ties go to the most
/// matched blocks, then the least load, then random.
pub fn pick_cheapest<R: Rng + ?Sized>(candidates: &[Choice], tolerance: f64, rng: &mut R) -> Option<usize> {
    let best = candidates.iter().map(|c| c.cost_ms).fold(f64::INFINITY, f64::min);
    let limit = best * (1.0 + tolerance.max(0.0)) + TIE_MS;
    let near = |c: &&Choice| c.cost_ms <= limit || (best.is_infinite() && c.cost_ms.is_infinite());
    let most_matched = candidates.iter().filter(near).map(|c| c.matched_blocks).max()?;
    let scored: Vec<Scored> = candidates
        .iter()
        .map(|c| {
            let eligible = near(&c) && c.matched_blocks == most_matched;
            Scored { score: if eligible { 0.0 } else { f64::INFINITY }, load: c.load }
        })
        .collect();
    pick_min(&scored, rng)
}

/// What a policy sees of one candidate worker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    /// What kvroute minimises: predicted TTFT plus the prefill's cost to the requests queued
    /// behind it ([`super::model::placement_cost`]).
    pub cost_ms: f64,
    /// Leading prompt blocks it holds (KV index or speculative credit, or learned text
    /// chunks when the prompt has no exact keys).
    pub matched_blocks: u32,
    /// Requests queued or running there.
    pub load: u64,
    /// What the peer policies read.
    pub peer: PeerView,
}

/// What every candidate shares: the request and the policy's parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Context {
    /// kvroute's affinity tolerance.
    pub tolerance: f64,
    /// This pick's round-robin number.
    pub ticket: u64,
    pub request: Request,
}

/// Index into `candidates` (non-empty; 0 otherwise) of the worker `policy` takes. A pure
/// function of its arguments and the rng's state: the one place policies differ.
pub fn choose<R: Rng + ?Sized>(policy: Policy, candidates: &[Choice], ctx: &Context, rng: &mut R) -> usize {
    let (tolerance, ticket) = (ctx.tolerance, ctx.ticket);
    let n = candidates.len();
    if n == 0 {
        return 0;
    }
    let by = |score: &dyn Fn(&Choice) -> f64| -> Vec<Scored> { candidates.iter().map(|c| Scored { score: score(c), load: c.load }).collect() };
    let picked = match policy {
        Policy::Random => Some(rng.gen_range(0..n)),
        Policy::RoundRobin => Some((ticket % n as u64) as usize),
        Policy::LeastLoaded => pick_min(&by(&|c| c.load as f64), rng),
        Policy::Kvroute => pick_cheapest(candidates, tolerance, rng),
        Policy::SglangCacheAware | Policy::LlmdDefault | Policy::DynamoKv => {
            let views: Vec<PeerView> = candidates.iter().map(|c| c.peer).collect();
            Some(match policy {
                Policy::SglangCacheAware => peers::sglang(&views, &ctx.request),
                Policy::LlmdDefault => peers::llmd(&views, &ctx.request, rng),
                _ => peers::dynamo(&views, &ctx.request, rng),
            })
        }
    };
    picked.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};
    use std::collections::BTreeSet;

    fn s(score: f64, load: u64) -> Scored {
        Scored { score, load }
    }

    #[test]
    fn lowest_score_then_lowest_load_then_random() {
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(pick_min(&[], &mut rng), None);
        assert_eq!(pick_min(&[s(5.0, 0), s(3.0, 9), s(4.0, 0)], &mut rng), Some(1));
        assert_eq!(pick_min(&[s(3.0, 4), s(3.0, 2), s(9.0, 0)], &mut rng), Some(1));
        let seen: BTreeSet<usize> =
            (0..64).filter_map(|_| pick_min(&[s(1.0, 1), s(2.0, 0), s(1.0, 1), s(1.0, 1)], &mut rng)).collect();
        assert_eq!(seen, BTreeSet::from([0, 2, 3]));
    }

    fn c(cost_ms: f64, matched_blocks: u32, load: u64) -> Choice {
        Choice { cost_ms, matched_blocks, load, peer: PeerView::default() }
    }

    #[test]
    fn near_ties_go_to_the_longest_cached_prefix() {
        let mut rng = StdRng::seed_from_u64(3);
        // The warm worker is 5% slower: within 10%, it keeps the prefix's group together.
        assert_eq!(pick_cheapest(&[c(1000.0, 0, 0), c(1050.0, 375, 1)], 0.1, &mut rng), Some(1));
        // 20% slower is beyond the tolerance: the fastest wins.
        assert_eq!(pick_cheapest(&[c(1000.0, 0, 0), c(1200.0, 375, 1)], 0.1, &mut rng), Some(0));
        // No tolerance: plain fastest.
        assert_eq!(pick_cheapest(&[c(1000.0, 0, 0), c(1050.0, 375, 1)], 0.0, &mut rng), Some(0));
        // Equal match: load decides among the near ones.
        assert_eq!(pick_cheapest(&[c(1000.0, 3, 5), c(1020.0, 3, 1), c(5000.0, 9, 0)], 0.1, &mut rng), Some(1));
        assert_eq!(pick_cheapest(&[], 0.1, &mut rng), None);
    }

    #[test]
    fn same_seed_same_choice() {
        let c = [s(1.0, 0); 8];
        let a: Vec<_> = (0..16).map({ let mut r = StdRng::seed_from_u64(9); move |_| pick_min(&c, &mut r) }).collect();
        let b: Vec<_> = (0..16).map({ let mut r = StdRng::seed_from_u64(9); move |_| pick_min(&c, &mut r) }).collect();
        assert_eq!(a, b);
    }

    fn ctx(ticket: u64) -> Context {
        Context { tolerance: 0.3, ticket, request: Request::default() }
    }

    #[test]
    fn each_policy_reads_only_its_own_signal() {
        let mut rng = StdRng::seed_from_u64(7);
        // 0: cheapest; 2: least loaded.
        let cands = [c(10.0, 0, 5), c(50.0, 0, 5), c(90.0, 0, 1)];
        assert_eq!(choose(Policy::Kvroute, &cands, &ctx(0), &mut rng), 0);
        assert_eq!(choose(Policy::LeastLoaded, &cands, &ctx(0), &mut rng), 2);
        let rr: Vec<usize> = (0..6).map(|t| choose(Policy::RoundRobin, &cands, &ctx(t), &mut rng)).collect();
        assert_eq!(rr, vec![0, 1, 2, 0, 1, 2]);
        let random: BTreeSet<usize> = (0..64).map(|_| choose(Policy::Random, &cands, &ctx(0), &mut rng)).collect();
        assert_eq!(random.len(), 3);
        assert_eq!(choose(Policy::Kvroute, &[], &ctx(0), &mut rng), 0);
    }

    #[test]
    fn the_same_rng_state_gives_the_same_choice() {
        let cands = [c(10.0, 1, 0), c(10.0, 1, 0), c(10.0, 1, 0)];
        let run = |seed| (0..16).map(|_| choose(Policy::Kvroute, &cands, &ctx(0), &mut StdRng::seed_from_u64(seed))).collect::<Vec<_>>();
        assert_eq!(run(3), run(3));
        // ...and the rng is what breaks the three-way tie: other seeds choose otherwise.
        assert!((4..20).any(|seed| run(seed) != run(3)), "ties broken without the rng");
    }
}
