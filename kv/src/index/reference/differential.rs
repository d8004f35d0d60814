//! The seeded differential harness: random vLLM-like event streams, applied to an index under
//! test and to [`ReferenceIndex`]; after every batch both must agree on `ApplyStats`,
//! `engine_blocks` of every engine and `match_prefix` of every prompt the stream knows.
//!
//! Generic over [`KvIndex`] (a factory makes a fresh, empty index per seed) so every backend,
//! including the Redis store, runs the same streams. A failure names the seed and batch, so
//! `check_seed(make, seed, batches, &mut Coverage::default())` replays it exactly.
//!
//! Streams look like vLLM's: engine hashes are a function of (parent hash, tokens, extra
//! keys), chains branch from shared prefixes over a tiny token alphabet (so engines share
//! keys), hashes span the full u64 range. Mixed in: duplicate stores, stores whose parent is
//! unknown, partial and wrong-size blocks, an "extra key" variant that gives one prompt two
//! engine hashes with one kvroute key, removes of known and unknown hashes per tier,
//! `AllBlocksCleared`, and out-of-band `clear_engine` (what ingestion does on a restart).

use super::ReferenceIndex;
use crate::index::{ApplyStats, KvIndex, PrefixMatch};
use crate::types::{BlockKey, EngineHash, EngineSlot, KvEvent, Tier};
use kvroute_core::keys::{token_block_keys, KeyRoot};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

const MODEL: &str = "test-model";
const BS: u32 = 4;
const ENGINES: [EngineSlot; 5] = [EngineSlot(0), EngineSlot(1), EngineSlot(63), EngineSlot(64), EngineSlot(130)];

/// What the streams exercised, so a test can assert the generator still reaches the
/// interesting cases (a differential test over trivial streams proves nothing).
#[derive(Clone, Copy, Debug, Default)]
pub struct Coverage {
    pub totals: ApplyStats,
    pub clear_engine_calls: u64,
    /// `match_prefix` results compared that had at least one engine.
    pub nonempty_matches: u64,
    /// Largest `matched_blocks` seen, and the most engines matching one query.
    pub max_matched: u32,
    pub max_engines: usize,
    /// Matches whose GPU prefix is shorter than the whole match (blocks only offloaded).
    pub split_matches: u64,
}

/// Runs `batches` batches for every seed; the first divergence is the error.
pub fn check(
    make: &dyn Fn() -> Box<dyn KvIndex>,
    seeds: impl IntoIterator<Item = u64>,
    batches: usize,
) -> Result<Coverage, String> {
    let mut cov = Coverage::default();
    for seed in seeds {
        check_seed(make, seed, batches, &mut cov)?;
    }
    Ok(cov)
}

pub fn check_seed(make: &dyn Fn() -> Box<dyn KvIndex>, seed: u64, batches: usize, cov: &mut Coverage) -> Result<(), String> {
    let subject = make();
    let reference = ReferenceIndex::new();
    let mut g = Gen::new(seed);
    for b in 0..batches {
        let engine = ENGINES[g.rng.gen_range(0..ENGINES.len())];
        let fail = |what: String| Err(format!("seed {seed} batch {b} engine {engine:?}: {what}"));
        if g.rng.gen_bool(0.02) {
            subject.clear_engine(engine);
            reference.clear_engine(engine);
            cov.clear_engine_calls += 1;
        } else {
            let events = g.batch(engine);
            let (got, want) = (subject.apply(engine, MODEL, BS, &events), reference.apply(engine, MODEL, BS, &events));
            if got != want {
                return fail(format!("ApplyStats {got:?} != reference {want:?} for {events:?}"));
            }
            add(&mut cov.totals, &got);
        }
        for e in ENGINES {
            let (got, want) = (subject.engine_blocks(e), reference.engine_blocks(e));
            if got != want {
                return fail(format!("engine_blocks({e:?}) = {got}, reference {want}"));
            }
        }
        for keys in g.queries() {
            let (got, want) = (sorted(subject.match_prefix(&keys)), sorted(reference.match_prefix(&keys)));
            if got != want {
                return fail(format!("match_prefix of {} keys = {got:?}, reference {want:?}", keys.len()));
            }
            cov.nonempty_matches += u64::from(!got.is_empty());
            cov.max_engines = cov.max_engines.max(got.len());
            cov.max_matched = cov.max_matched.max(got.iter().map(|m| m.1).max().unwrap_or(0));
            cov.split_matches += got.iter().filter(|m| m.2 < m.1).count() as u64;
        }
    }
    Ok(())
}

fn add(t: &mut ApplyStats, s: &ApplyStats) {
    t.blocks_stored += s.blocks_stored;
    t.blocks_removed += s.blocks_removed;
    t.clears += s.clears;
    t.rejected_unknown_parent += s.rejected_unknown_parent;
    t.rejected_unknown_hash += s.rejected_unknown_hash;
    t.rejected_bad_block += s.rejected_bad_block;
}

fn sorted(mut v: Vec<PrefixMatch>) -> Vec<(u32, u32, u32)> {
    v.sort_by_key(|m| m.engine);
    v.into_iter().map(|m| (m.engine.0, m.matched_blocks, m.gpu_blocks)).collect()
}

struct Prompt {
    tokens: Vec<u32>,
    lora: Option<String>,
    salt: Option<String>,
}

impl Prompt {
    fn keys(&self) -> Vec<BlockKey> {
        let root = KeyRoot::new(self.lora.as_deref().unwrap_or(MODEL), self.salt.as_deref().unwrap_or(""));
        token_block_keys(&root, &self.tokens, BS as usize)
    }

    /// vLLM-style engine hashes: chained over (parent, tokens, extra keys); `variant` plays
    /// the role of an extra key kvroute does not see (e.g. a different image).
    fn engine_hashes(&self, variant: u8) -> Vec<EngineHash> {
        let mut parent = 0xdead_beef_u64;
        let extra = (&self.lora, &self.salt, variant);
        self.tokens
            .chunks_exact(BS as usize)
            .map(|block| {
                let mut h = DefaultHasher::new();
                (parent, block, &extra).hash(&mut h);
                parent = h.finish();
                EngineHash(parent)
            })
            .collect()
    }
}

struct Gen {
    rng: StdRng,
    prompts: Vec<Prompt>,
    /// Per engine (index into ENGINES): hashes it was told about, for removes and parents.
    emitted: Vec<Vec<EngineHash>>,
}

impl Gen {
    fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut prompts: Vec<Prompt> = Vec::new();
        for _ in 0..12 {
            let mut tokens: Vec<u32> = match prompts.len() {
                0 => Vec::new(),
                n => {
                    let base = &prompts[rng.gen_range(0..n)].tokens;
                    let cut = rng.gen_range(0..=base.len() / BS as usize) * BS as usize;
                    base[..cut].to_vec()
                }
            };
            let extra = rng.gen_range(0..6) * BS as usize + rng.gen_range(0..BS as usize);
            tokens.extend((0..extra).map(|_| rng.gen_range(0..3u32)));
            let lora = rng.gen_bool(0.2).then(|| "lora-a".to_string());
            let salt = rng.gen_bool(0.2).then(|| "salt-1".to_string());
            prompts.push(Prompt { tokens, lora, salt });
        }
        Gen { rng, prompts, emitted: vec![Vec::new(); ENGINES.len()] }
    }

    fn batch(&mut self, engine: EngineSlot) -> Vec<KvEvent> {
        let ei = ENGINES.iter().position(|e| *e == engine).unwrap_or(0);
        let n = self.rng.gen_range(1..=4);
        (0..n)
            .filter_map(|_| match self.rng.gen_range(0..100) {
                0..=59 => self.store(ei),
                60..=96 => Some(self.remove(ei)),
                _ => Some(KvEvent::AllCleared),
            })
            .collect()
    }

    fn tier(&mut self) -> Tier {
        [Tier::Gpu, Tier::Gpu, Tier::Cpu, Tier::Storage][self.rng.gen_range(0..4)]
    }

    fn store(&mut self, ei: usize) -> Option<KvEvent> {
        let p = &self.prompts[self.rng.gen_range(0..self.prompts.len())];
        let variant = if self.rng.gen_bool(0.15) { self.rng.gen_range(1..3u8) } else { 0 };
        let hashes = p.engine_hashes(variant);
        if hashes.is_empty() {
            return None;
        }
        // Prefer continuing a chain this engine was told about, as vLLM does.
        let known = |h: &EngineHash| self.emitted[ei].contains(h);
        let start = match self.rng.gen_bool(0.5) {
            true => hashes.iter().rposition(known).map_or(0, |i| (i + 1).min(hashes.len() - 1)),
            false => self.rng.gen_range(0..hashes.len()),
        };
        let len = self.rng.gen_range(1..=(hashes.len() - start).min(4));
        let mut parent = start.checked_sub(1).map(|i| hashes[i]);
        if self.rng.gen_bool(0.05) {
            parent = Some(EngineHash(self.rng.gen()));
        }
        let bs = BS as usize;
        let mut token_ids = p.tokens[start * bs..(start + len) * bs].to_vec();
        let mut block_size = BS;
        match self.rng.gen_range(0..100) {
            0..=3 => token_ids.truncate(token_ids.len() - self.rng.gen_range(1..=bs)),
            4..=6 => {
                // vLLM's partial-block event: one hash, block_size = the tokens it has.
                block_size = BS - 1;
                token_ids.truncate(bs - 1);
            }
            7 => block_size = 2 * BS,
            _ => {}
        }
        let (lora_name, cache_salt) = (p.lora.clone(), p.salt.clone());
        let hashes = hashes[start..start + len].to_vec();
        self.emitted[ei].extend(&hashes);
        let tier = self.tier();
        if tier != Tier::Gpu && self.rng.gen_bool(0.5) {
            // vLLM's offloading connector by default: one placeholder per block, no tokens,
            // no parent, block_size 0 (naming blocks the engine stored on its GPU).
            let hash = hashes[self.rng.gen_range(0..hashes.len())];
            return Some(KvEvent::Stored { hashes: vec![hash], parent: None, token_ids: Vec::new(), block_size: 0, lora_name: None, cache_salt: None, tier });
        }
        Some(KvEvent::Stored { hashes, parent, token_ids, block_size, lora_name, cache_salt, tier })
    }

    fn remove(&mut self, ei: usize) -> KvEvent {
        let n = self.rng.gen_range(1..=3);
        let hashes = (0..n)
            .map(|_| match self.emitted[ei].len() {
                0 => EngineHash(self.rng.gen()),
                len if self.rng.gen_bool(0.85) => self.emitted[ei][self.rng.gen_range(0..len)],
                _ => EngineHash(self.rng.gen()),
            })
            .collect();
        KvEvent::Removed { hashes, tier: self.tier() }
    }

    /// Every prompt's keys, each also from its second block on, and one list of noise.
    fn queries(&mut self) -> Vec<Vec<BlockKey>> {
        let mut out: Vec<Vec<BlockKey>> = self.prompts.iter().map(Prompt::keys).collect();
        let tails: Vec<_> = out.iter().filter(|k| k.len() > 1).map(|k| k[1..].to_vec()).collect();
        out.extend(tails);
        out.push((0..3).map(|_| BlockKey(self.rng.gen())).collect());
        out
    }
}
