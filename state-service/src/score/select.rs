//! Choosing among scored candidates: the minimum score, ties broken by load, then at random.
//!
//! Scores within [`TIE_MS`] of each other count as equal: float noise must not decide
//! placement, load should.

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

    #[test]
    fn same_seed_same_choice() {
        let c = [s(1.0, 0); 8];
        let a: Vec<_> = (0..16).map({ let mut r = StdRng::seed_from_u64(9); move |_| pick_min(&c, &mut r) }).collect();
        let b: Vec<_> = (0..16).map({ let mut r = StdRng::seed_from_u64(9); move |_| pick_min(&c, &mut r) }).collect();
        assert_eq!(a, b);
    }
}
