//! Generated answers that round-trip through the tokenizer, as a real worker's do.
//!
//! vLLM caches the token ids it sampled and returns their decoding; a client that sends the
//! answer back inside the next turn's history re-tokenizes that text, and the next turn hits
//! the answer's cached blocks only if the re-tokenization gives the same ids. So the simulator
//! writes filler text, encodes it with the model's tokenizer, keeps exactly those ids (cut or
//! padded to the output length) as what the engine "samples", and streams their decoding.
//!
//! Invariant: `encode(decode(ids)) == ids`, and the per-token pieces concatenate to
//! `decode(ids)`. It holds because every filler word is a leading-space word the model's
//! tokenizer keeps as one token that decodes to itself ([`FillerWords::for_tokenizer`] checks
//! this once per tokenizer, when an [`Answerer`] is built): byte-level BPE pre-tokenizers split
//! text before each such word, so any sequence of them encodes word by word, and a cut between
//! two tokens is a cut between two words. With the byte fallback every byte is a token and the
//! words are ASCII.
//!
//! Data flow: this module sits on top of [`crate::chat`] (it encodes and decodes with the
//! worker's [`ChatTokenizer`]); the HTTP layer asks an [`Answerer`] for the ids the engine
//! will emit and the text to stream. The tokenizer does not know answers exist.

use crate::chat::{ChatError, ChatTokenizer};
use std::sync::Arc;

/// Candidate filler words; a model keeps those that are single, self-decoding tokens.
const WORDS: &[&str] = &[
    " the", " cache", " routes", " a", " token", " to", " warm", " worker", " and", " prefix", " block", " of",
    " is", " in", " request", " model", " each", " with", " that", " for", " on", " it", " this", " by", " from",
    " fast", " hit", " key", " load", " time", " first", " next", " same", " state", " turn", " page",
];

/// The filler words usable with one tokenizer.
#[derive(Clone, Debug)]
pub struct FillerWords(Vec<&'static str>);

impl FillerWords {
    /// Every candidate: right for byte tokens, where any ASCII text round-trips.
    pub fn bytes() -> FillerWords {
        FillerWords(WORDS.to_vec())
    }

    /// The candidates `tokenizer` encodes as one token that decodes back to the word. With a
    /// vocabulary keeping none of them (not seen in practice) all are used and a cut may split
    /// a word; the answer then still streams, it just may not round-trip.
    pub fn for_tokenizer(tokenizer: &ChatTokenizer) -> FillerWords {
        let ChatTokenizer::Model(model) = tokenizer else { return FillerWords::bytes() };
        let keep: Vec<&'static str> = WORDS
            .iter()
            .copied()
            .filter(|w| match model.encoder().encode_uncached(w, false).as_deref() {
                Ok([id]) => tokenizer.decode(&[*id]).is_ok_and(|d| d == *w),
                _ => false,
            })
            .collect();
        FillerWords(if keep.is_empty() { WORDS.to_vec() } else { keep })
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `count` words picked by a seeded generator, concatenated.
    fn text(&self, rng: &mut SplitMix, count: usize) -> String {
        let mut text = String::with_capacity(count * 6);
        for _ in 0..count {
            text.push_str(self.0[(rng.next() % self.0.len() as u64) as usize]);
        }
        text
    }
}

/// What the engine will sample, and the text of each token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    pub ids: Vec<u32>,
    /// `pieces[i]` is token i's text; their concatenation is the decoding of `ids`.
    pub pieces: Vec<String>,
}

/// A deterministic seed for a prompt: the same prompt gets the same answer, as with greedy
/// decoding.
pub fn seed_for(prompt: &[u32]) -> u64 {
    prompt.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, t| (h ^ u64::from(*t)).wrapping_mul(0x0100_0000_01b3))
}

/// The seed of sample `index` of a prompt (`n` > 1 samples differ, as sampling at a nonzero
/// temperature makes them): sample 0 is [`seed_for`]'s, what an `n` = 1 request gets.
pub fn sample_seed(prompt: &[u32], index: usize) -> u64 {
    seed_for(prompt) ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Makes up answers for one tokenizer. The filler words are chosen once, here, because the
/// check costs a few dozen encodes and depends only on the vocabulary.
#[derive(Debug)]
pub struct Answerer {
    tokenizer: Arc<ChatTokenizer>,
    words: FillerWords,
}

impl Answerer {
    pub fn new(tokenizer: Arc<ChatTokenizer>) -> Answerer {
        let words = FillerWords::for_tokenizer(&tokenizer);
        Answerer { tokenizer, words }
    }

    pub fn tokenizer(&self) -> &ChatTokenizer {
        &self.tokenizer
    }

    pub fn words(&self) -> &FillerWords {
        &self.words
    }

    /// An answer of exactly `len` tokens (see the module docs for why it round-trips).
    pub fn answer(&self, seed: u64, len: usize) -> Result<Answer, ChatError> {
        let mut rng = SplitMix(seed);
        let mut ids = Vec::with_capacity(len);
        match &*self.tokenizer {
            ChatTokenizer::Model(model) => {
                // Every word is at least one token, so one round usually suffices; padding
                // appends whole words, which encode independently of what precedes them.
                while ids.len() < len {
                    let text = self.words.text(&mut rng, len - ids.len());
                    ids.extend(model.encoder().encode_uncached(&text, false)?);
                }
                ids.truncate(len);
                let pieces = ids.iter().map(|id| self.tokenizer.decode(&[*id])).collect::<Result<_, _>>()?;
                Ok(Answer { ids, pieces })
            }
            ChatTokenizer::ByteFallback(_) => {
                // Every word is at least two bytes, so half the missing length in words
                // always covers it.
                while ids.len() < len {
                    ids.extend(self.words.text(&mut rng, (len - ids.len()).div_ceil(2)).bytes().map(u32::from));
                }
                ids.truncate(len);
                let pieces = ids.iter().map(|b| char::from(*b as u8).to_string()).collect();
                Ok(Answer { ids, pieces })
            }
        }
    }
}

/// splitmix64: a tiny seeded generator, enough to vary filler words.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn round_trips(answers: &Answerer, seeds: std::ops::Range<u64>) {
        let tok = answers.tokenizer();
        for seed in seeds {
            let len = 1 + (seed as usize * 37) % 300;
            let a = answers.answer(seed, len).unwrap();
            assert_eq!((a.ids.len(), a.pieces.len()), (len, len), "seed {seed}");
            let text = tok.decode(&a.ids).unwrap();
            assert_eq!(a.pieces.concat(), text, "seed {seed}: pieces concatenate to the decoding");
            assert_eq!(tok.encode_text(&text).unwrap(), a.ids, "seed {seed}: encode(decode(ids)) == ids");
            assert_eq!(answers.answer(seed, len).unwrap(), a, "seed {seed}: deterministic");
        }
    }

    #[test]
    fn byte_fallback_answers_round_trip() {
        round_trips(&Answerer::new(Arc::new(ChatTokenizer::byte_fallback())), 0..500);
    }

    /// The repository root: `$KVROUTE_ROOT` (set by scripts/test.sh), else the parent of this
    /// crate, as in the e2e crate's `paths::repo_root`.
    fn repo_root() -> PathBuf {
        std::env::var_os("KVROUTE_ROOT").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
    }

    /// The Qwen3 fixture, located the way every other test locates it: the idempotent
    /// `tokenize/fetch-tokenizer.sh` prints its directory under `.cache/`. A missing fixture
    /// fails the test: skipping would let the round-trip claim pass unchecked.
    fn qwen3() -> Answerer {
        let script = repo_root().join("tokenize/fetch-tokenizer.sh");
        let setup = "run scripts/setup.sh first (it puts the Qwen3 tokenizer under .cache/)";
        let out = Command::new("bash").arg(&script).output().unwrap_or_else(|e| panic!("cannot run {}: {e}; {setup}", script.display()));
        assert!(out.status.success(), "{} failed: {}; {setup}", script.display(), String::from_utf8_lossy(&out.stderr));
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let tokenizer = ChatTokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("loading the Qwen3 fixture from {}: {e}; {setup}", dir.display()));
        Answerer::new(Arc::new(tokenizer))
    }

    #[test]
    fn model_answers_round_trip_and_continue_a_rendered_prompt() {
        let answers = qwen3();
        let tok = answers.tokenizer();
        assert_eq!(tok.kind(), crate::chat::TokenizerKind::HuggingFace, "the fixture is a model tokenizer");
        assert!(answers.words().len() >= 20, "most filler words are single Qwen3 tokens: {:?}", answers.words());
        round_trips(&answers, 0..300);

        // Turn two's rendering re-tokenizes turn one's answer to the ids turn one cached.
        let turn1 = serde_json::json!({"messages": [{"role": "user", "content": "Explain prefix caching."}], "add_generation_prompt": true});
        let prompt = tok.encode_chat(&turn1.to_string(), kvroute_tokenize::Api::ChatCompletions).unwrap();
        for seed in 0..50 {
            let a = answers.answer(seed, 40).unwrap();
            let turn2 = serde_json::json!({"messages": [
                {"role": "user", "content": "Explain prefix caching."},
                {"role": "assistant", "content": tok.decode(&a.ids).unwrap()},
                {"role": "user", "content": "And routing?"},
            ], "add_generation_prompt": true});
            let ids = tok.encode_chat(&turn2.to_string(), kvroute_tokenize::Api::ChatCompletions).unwrap();
            assert_eq!(ids[..prompt.len() + 40], [prompt.as_slice(), a.ids.as_slice()].concat(), "seed {seed}");
        }
    }
}
