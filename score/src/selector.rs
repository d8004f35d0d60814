//! The pick's own randomness and round-robin ticket, with no lock on the pick path.
//!
//! Each pick gets a fresh [`PickRng`] seeded from the service seed and the pick's sequence
//! number (an atomic counter), so picks never contend for a shared generator and a seeded
//! service draws the same numbers for the same sequence of picks.

use rand::RngCore;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Selector {
    seed: u64,
    picks: AtomicU64,
    round_robin: AtomicU64,
}

impl Selector {
    /// `seed`: reproducible tie-breaks and assignment ids; `None` draws one.
    pub fn new(seed: Option<u64>) -> Selector {
        Selector { seed: seed.unwrap_or_else(rand::random), picks: AtomicU64::new(0), round_robin: AtomicU64::new(0) }
    }

    /// This pick's generator.
    pub fn rng(&self) -> PickRng {
        let n = self.picks.fetch_add(1, Ordering::Relaxed);
        PickRng::new(self.seed ^ n.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// The next round-robin number (only round-robin picks take one).
    pub fn ticket(&self) -> u64 {
        self.round_robin.fetch_add(1, Ordering::Relaxed)
    }

    /// Round robin starts over (between benchmark passes).
    pub fn reset(&self) {
        self.round_robin.store(0, Ordering::Relaxed);
    }
}

/// SplitMix64: a few nanoseconds a number, statistically fine for tie-breaks and ids (not
/// for secrets: assignment ids are names, not credentials).
pub struct PickRng(u64);

impl PickRng {
    pub fn new(seed: u64) -> PickRng {
        let mut rng = PickRng(seed);
        // One round, so seeds that differ in few bits start far apart.
        rng.next_u64();
        rng
    }
}

impl RngCore for PickRng {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn seeded_selectors_repeat_and_picks_differ() {
        let (a, b) = (Selector::new(Some(9)), Selector::new(Some(9)));
        let draw = |s: &Selector| (0..8).map(|_| s.rng().next_u64()).collect::<Vec<_>>();
        let (x, y) = (draw(&a), draw(&b));
        assert_eq!(x, y);
        let distinct: std::collections::BTreeSet<_> = x.iter().collect();
        assert_eq!(distinct.len(), 8);
        let mut rng = a.rng();
        let n: usize = (0..1000).map(|_| rng.gen_range(0..4usize)).filter(|&v| v == 0).count();
        assert!((150..350).contains(&n), "roughly uniform: {n} of 1000 were 0");
    }
}
