//! Seeded content: token-id blocks and word text. Every piece of content is a pure function
//! of (seed, namespace, index), so equal inputs give byte-identical prompts in any run and
//! on any machine, and different namespaces never collide by accident.
//!
//! Token ids are drawn from 1000..100_000: inside any real vocabulary (Qwen3 has ~151k) and
//! clear of the low ids where special and byte tokens live. Text is built from common
//! English words with a leading space, which byte-level BPE tokenizers (Qwen3, Llama 3) map
//! to about one token per word, so `words == tokens` is a fair approximation; with the sim's
//! byte-fallback tokenizer a word is ~5 tokens instead (documented in bench/README.md).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Namespaces keep e.g. group prefix #3 and question #3 distinct.
#[derive(Clone, Copy, Debug)]
pub enum Ns {
    Prefix = 1,
    Question = 2,
    Independent = 3,
    TraceBlock = 4,
    TraceTail = 5,
    Answer = 6,
    Order = 7,
    /// The production-shaped trace generator's random streams.
    Production = 8,
}

/// A generator for one (seed, namespace, index) triple.
pub fn rng_for(seed: u64, ns: Ns, index: u64) -> StdRng {
    // splitmix64-style mixing so nearby indices give unrelated streams.
    let mut z = seed ^ (ns as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    StdRng::seed_from_u64(z ^ (z >> 31))
}

pub fn tokens(seed: u64, ns: Ns, index: u64, len: usize) -> Vec<u32> {
    let mut rng = rng_for(seed, ns, index);
    (0..len).map(|_| rng.gen_range(1000..100_000)).collect()
}

const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be",
    "by", "this", "are", "or", "from", "at", "which", "an", "but", "not", "have", "has", "all",
    "can", "new", "one", "more", "will", "other", "their", "time", "about", "when", "there",
    "data", "file", "code", "function", "value", "return", "type", "error", "test", "build",
    "request", "server", "client", "cache", "memory", "block", "token", "model", "worker",
    "queue", "route", "state", "event", "index", "table", "field", "string", "number", "list",
    "map", "key", "node", "path", "user", "service", "config", "module", "system", "process",
    "thread", "lock", "read", "write", "open", "close", "start", "stop", "run", "check", "set",
    "get", "add", "remove", "update", "load", "store", "send", "receive", "parse", "format",
    "project", "change", "issue", "review", "branch", "commit", "merge", "release", "version",
    "design", "plan", "team", "work", "day", "week", "year", "first", "last", "next", "small",
    "large", "fast", "slow", "good", "simple", "clear", "main", "local", "remote", "public",
];

/// `len` words, each with a leading space (about `len` tokens with a BPE tokenizer).
pub fn words(seed: u64, ns: Ns, index: u64, len: usize) -> String {
    let mut rng = rng_for(seed, ns, index);
    let mut s = String::with_capacity(len * 6);
    for _ in 0..len {
        s.push(' ');
        s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_triple_same_content() {
        assert_eq!(tokens(7, Ns::Prefix, 3, 64), tokens(7, Ns::Prefix, 3, 64));
        assert_eq!(words(7, Ns::Prefix, 3, 64), words(7, Ns::Prefix, 3, 64));
    }

    #[test]
    fn namespaces_indices_and_seeds_differ() {
        let a = tokens(7, Ns::Prefix, 3, 32);
        assert_ne!(a, tokens(7, Ns::Question, 3, 32));
        assert_ne!(a, tokens(7, Ns::Prefix, 4, 32));
        assert_ne!(a, tokens(8, Ns::Prefix, 3, 32));
    }

    #[test]
    fn shorter_is_a_prefix_of_longer() {
        let long = tokens(1, Ns::TraceBlock, 9, 512);
        assert_eq!(&long[..100], &tokens(1, Ns::TraceBlock, 9, 100)[..]);
        assert!(long.iter().all(|t| (1000..100_000).contains(t)));
        assert_eq!(words(1, Ns::Answer, 0, 10).split_whitespace().count(), 10);
    }
}
