//! A fast, seeded hasher for keys that are already hashes (kvroute keys, vLLM block hashes).
//!
//! SipHash (std's default) costs more than the rest of a lookup; an identity hash would let
//! anyone who can choose prompts pile keys into one bucket run. A folded 64x64->128 multiply
//! with a per-process random seed is one instruction pair and spreads every input bit over
//! both the low bits (bucket index) and the top bits (hashbrown's control byte).

use std::hash::{BuildHasher, Hasher};

const K: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Clone, Debug)]
pub struct SeededState {
    seed: u64,
}

impl Default for SeededState {
    fn default() -> Self {
        SeededState { seed: rand::random::<u64>() | 1 }
    }
}

impl BuildHasher for SeededState {
    type Hasher = FoldHasher;
    fn build_hasher(&self) -> FoldHasher {
        FoldHasher { h: self.seed }
    }
}

pub struct FoldHasher {
    h: u64,
}

fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl Hasher for FoldHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.h = fold_mul(self.h ^ x, K);
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    fn finish(&self) -> u64 {
        self.h
    }
}
