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
//! tokenizer keeps as one token that decodes to itself ([`FillerWords::for_model`] checks this
//! when the tokenizer loads): byte-level BPE pre-tokenizers split text before each such word,
//! so any sequence of them encodes word by word, and a cut between two tokens is a cut between
//! two words. With the byte fallback every byte is a token and the words are ASCII.

use crate::chat::{ChatError, ChatTokenizer};
use kvroute_tokenize::ModelTokenizer;

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
    pub fn for_model(tokenizer: &ModelTokenizer) -> FillerWords {
        let keep: Vec<&'static str> = WORDS
            .iter()
            .copied()
            .filter(|w| match tokenizer.encoder().encode_uncached(w, false).as_deref() {
                Ok([id]) => decode(tokenizer, &[*id]).is_ok_and(|d| d == *w),
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

impl ChatTokenizer {
    /// An answer of exactly `len` tokens (see the module docs for why it round-trips).
    pub fn answer(&self, seed: u64, len: usize) -> Result<Answer, ChatError> {
        let mut rng = SplitMix(seed);
        let mut ids = Vec::with_capacity(len);
        match self {
            ChatTokenizer::Model { tokenizer, words } => {
                // Every word is at least one token, so one round usually suffices; padding
                // appends whole words, which encode independently of what precedes them.
                while ids.len() < len {
                    let text = words.text(&mut rng, len - ids.len());
                    ids.extend(tokenizer.encoder().encode_uncached(&text, false)?);
                }
                ids.truncate(len);
                let pieces = ids.iter().map(|id| decode(tokenizer, &[*id])).collect::<Result<_, _>>()?;
                Ok(Answer { ids, pieces })
            }
            ChatTokenizer::ByteFallback(_) => {
                let words = FillerWords::bytes();
                while ids.len() < len {
                    ids.extend(words.text(&mut rng, (len - ids.len()).div_ceil(2)).bytes().map(u32::from));
                }
                ids.truncate(len);
                let pieces = ids.iter().map(|b| char::from(*b as u8).to_string()).collect();
                Ok(Answer { ids, pieces })
            }
        }
    }

    /// The text of `ids` as vLLM returns it (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ChatError> {
        match self {
            ChatTokenizer::Model { tokenizer, .. } => decode(tokenizer, ids),
            ChatTokenizer::ByteFallback(_) => {
                Ok(String::from_utf8_lossy(&ids.iter().map(|b| *b as u8).collect::<Vec<u8>>()).into_owned())
            }
        }
    }
}

fn decode(tokenizer: &ModelTokenizer, ids: &[u32]) -> Result<String, ChatError> {
    tokenizer.encoder().tokenizer().decode(ids, true).map_err(|e| ChatError::Encode(format!("decode: {e}")))
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

    fn round_trips(tok: &ChatTokenizer, seeds: std::ops::Range<u64>) {
        for seed in seeds {
            let len = 1 + (seed as usize * 37) % 300;
            let a = tok.answer(seed, len).unwrap();
            assert_eq!((a.ids.len(), a.pieces.len()), (len, len), "seed {seed}");
            let text = tok.decode(&a.ids).unwrap();
            assert_eq!(a.pieces.concat(), text, "seed {seed}: pieces concatenate to the decoding");
            assert_eq!(tok.encode_text(&text).unwrap(), a.ids, "seed {seed}: encode(decode(ids)) == ids");
            assert_eq!(tok.answer(seed, len).unwrap(), a, "seed {seed}: deterministic");
        }
    }

    #[test]
    fn byte_fallback_answers_round_trip() {
        round_trips(&ChatTokenizer::byte_fallback(), 0..500);
    }

    /// The Qwen3 fixture, when `tokenize/fetch-tokenizer.sh` has fetched it (it needs the
    /// network once; `cargo test -p kvroute-tokenize` and the e2e tests fetch it too).
    fn qwen3() -> Option<ChatTokenizer> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = std::process::Command::new("bash").arg(root.join("tokenize/fetch-tokenizer.sh")).output().ok()?;
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || dir.is_empty() {
            eprintln!("skipping: no tokenizer fixture ({})", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        Some(ChatTokenizer::from_dir(std::path::Path::new(&dir)).unwrap())
    }

    #[test]
    fn model_answers_round_trip_and_continue_a_rendered_prompt() {
        let Some(tok) = qwen3() else { return };
        let ChatTokenizer::Model { words, .. } = &tok else { panic!("a model tokenizer") };
        assert!(words.len() >= 20, "most filler words are single Qwen3 tokens: {words:?}");
        round_trips(&tok, 0..300);

        // Turn two's rendering re-tokenizes turn one's answer to the ids turn one cached.
        let turn1 = serde_json::json!({"messages": [{"role": "user", "content": "Explain prefix caching."}], "add_generation_prompt": true});
        let prompt = tok.encode_chat(&turn1.to_string(), kvroute_tokenize::Api::ChatCompletions).unwrap();
        for seed in 0..50 {
            let a = tok.answer(seed, 40).unwrap();
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
