//! Prompt text -> token ids, through the piece cache.
//!
//! The prompt is split at added tokens ([`crate::pieces`]); each text piece is looked up by
//! hash and encoded with `tokenizers` (no special tokens added) only on a miss. A warm turn of
//! a conversation therefore encodes only its new messages; the rest costs a hash and a lookup
//! per piece. Equality with whole-prompt encoding is the invariant the tests check.
//!
//! A long text piece is encoded and cached in chunks of about [`CHUNK_BYTES`], cut at the first
//! space no pre-token spans past each chunk's start ([`SpaceCuts`]); a cut depends only on the
//! text before it, so a prompt that repeats an earlier prompt's text (one long message grown by
//! a paragraph) finds that text's chunks cached. Chunking is on only when the tokenizer passes
//! a check that chunk encodings concatenate to the whole.
//!
//! A bounded encoding ([`CachedEncoder::encode_prefix`]) stops at a piece or chunk boundary, or
//! inside a chunk at a space no pre-token spans, so its ids are always the whole text's first
//! ids.
//!
//! Data flow: rendered text in (from `model`, or any caller holding text), ids out; built on
//! [`crate::pieces`] and [`crate::cache`], with no knowledge of chat rendering.

use crate::cache::{CacheStats, PieceCache, PieceHash};
use crate::error::TokenizeError;
use crate::pieces::{Piece, Splitter};
use std::sync::Arc;

/// What [`CachedEncoder::encode_prefix`] encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prefix {
    /// The first ids of the whole text's encoding, exactly.
    pub ids: Vec<u32>,
    /// Text bytes left unencoded (0 when complete).
    pub rest_bytes: usize,
}

impl Prefix {
    pub fn complete(&self) -> bool {
        self.rest_bytes == 0
    }
}

/// Text pieces longer than this are encoded and cached in chunks of at least this many bytes.
pub const CHUNK_BYTES: usize = 2048;

pub struct CachedEncoder {
    tokenizer: tokenizers::Tokenizer,
    splitter: Splitter,
    cache: PieceCache,
    space_cuts: SpaceCuts,
    /// Whether long pieces are chunked: space cuts are exact and, on the probes, the encodings
    /// of the two sides of every cut concatenate to the whole.
    chunked: bool,
}

impl std::fmt::Debug for CachedEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedEncoder")
            .field("splitting", &self.splitter.is_enabled())
            .field("space_cuts", &self.space_cuts)
            .field("chunked", &self.chunked)
            .field("cache", &self.cache)
            .finish()
    }
}

impl CachedEncoder {
    pub fn new(tokenizer: tokenizers::Tokenizer, cache_bytes: usize) -> CachedEncoder {
        let splitter = Splitter::new(&tokenizer);
        let space_cuts = SpaceCuts::check(&tokenizer);
        let chunked = space_cuts == SpaceCuts::Exact && chunks_concatenate(&tokenizer);
        CachedEncoder { tokenizer, splitter, cache: PieceCache::new(cache_bytes), space_cuts, chunked }
    }

    /// Whether an over-budget piece is encoded up to a space (see [`SpaceCuts`]).
    pub fn cuts_at_spaces(&self) -> bool {
        self.space_cuts == SpaceCuts::Exact
    }

    /// Whether long pieces are encoded and cached in chunks (see [`CHUNK_BYTES`]).
    pub fn chunks_pieces(&self) -> bool {
        self.chunked
    }

    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.tokenizer
    }

    /// `tokenizers` on the whole text: the reference the cached path must equal.
    pub fn encode_uncached(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        self.tokenizer.encode_fast(text, add_special_tokens).map(|e| e.get_ids().to_vec()).map_err(|e| TokenizeError::Encode(e.to_string()))
    }

    /// Encodes `text` without adding special tokens, reusing cached pieces.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        let mut ids = Vec::with_capacity(text.len() / 3);
        for piece in self.splitter.split(text) {
            match piece {
                Piece::Token(id) => ids.push(id),
                Piece::Text(t) => {
                    for chunk in self.chunks(t) {
                        ids.extend_from_slice(&self.encode_chunk(chunk)?);
                    }
                }
            }
        }
        Ok(ids)
    }

    /// Encodes the longest prefix of `text` that needs at most `budget` bytes of cache-missing
    /// text encoded and ends where the whole encoding has a token boundary: at a piece boundary
    /// (an added token: `tokenizers` never merges across one), a chunk boundary or, inside the
    /// first chunk that does not fit, at the last space within the budget that no pre-token
    /// spans ([`SpaceCuts`]). Cached chunks cost nothing against the budget, so a warm
    /// conversation, or a prompt repeating cached text, is encoded whole; a cold long one stops
    /// within the budget, inside a long message too (nothing of that message is encoded when
    /// the tokenizer cannot be cut at spaces).
    pub fn encode_prefix(&self, text: &str, budget: usize) -> Result<Prefix, TokenizeError> {
        let pieces = self.splitter.split(text);
        let mut ids = Vec::with_capacity(text.len().min(budget.saturating_mul(2)) / 3);
        let mut spent = 0usize;
        for (i, piece) in pieces.iter().enumerate() {
            let t = match *piece {
                Piece::Token(id) => {
                    ids.push(id);
                    continue;
                }
                Piece::Text(t) => t,
            };
            let mut done = 0usize;
            for chunk in self.chunks(t) {
                let cached = self.cache.peek(PieceHash::of(chunk)).is_some();
                if !cached && spent + chunk.len() > budget {
                    let later: usize = pieces[i + 1..].iter().map(|p| if let Piece::Text(t) = p { t.len() } else { 0 }).sum();
                    let mut rest_bytes = t.len() - done + later;
                    if let Some(cut) = self.space_cut(chunk, budget - spent) {
                        // Cached too: the next turn of this conversation cuts here again.
                        ids.extend_from_slice(&self.encode_chunk(&chunk[..cut])?);
                        rest_bytes -= cut;
                    }
                    return Ok(Prefix { ids, rest_bytes });
                }
                spent += if cached { 0 } else { chunk.len() };
                done += chunk.len();
                ids.extend_from_slice(&self.encode_chunk(chunk)?);
            }
        }
        Ok(Prefix { ids, rest_bytes: 0 })
    }

    /// The last point within `text`'s first `limit` bytes where its encoding may be cut (the
    /// ids of `text[..cut]` are the first ids of `text`'s), if the tokenizer allows cuts.
    pub fn space_cut(&self, text: &str, limit: usize) -> Option<usize> {
        if self.space_cuts != SpaceCuts::Exact {
            return None;
        }
        last_space_cut(text, limit)
    }

    /// `text` cut into chunks of at least [`CHUNK_BYTES`] at the first space cut past each
    /// chunk's start; the whole text when chunking is off or nothing can be cut.
    fn chunks<'a>(&self, text: &'a str) -> Vec<&'a str> {
        if !self.chunked || text.len() <= CHUNK_BYTES {
            return vec![text];
        }
        let mut chunks = Vec::with_capacity(text.len() / CHUNK_BYTES + 1);
        let mut start = 0;
        while let Some(cut) = first_space_cut(text, start + CHUNK_BYTES) {
            chunks.push(&text[start..cut]);
            start = cut;
        }
        chunks.push(&text[start..]);
        chunks
    }

    fn encode_chunk(&self, text: &str) -> Result<Arc<[u32]>, TokenizeError> {
        let key = PieceHash::of(text);
        if let Some(ids) = self.cache.get(key, text.len()) {
            return Ok(ids);
        }
        let ids: Arc<[u32]> = Arc::from(self.encode_uncached(text, false)?);
        self.cache.insert(key, text.len(), ids.clone());
        Ok(ids)
    }

    pub fn stats(&self) -> CacheStats {
        self.cache.stats()
    }
}

/// Whether a piece can be encoded only up to a space and still give the whole piece's first
/// ids. It can when a space between two non-spaces always starts a pre-token: BPE merges only
/// within a pre-token, and the pre-tokens before the space do not depend on what follows it.
/// That holds for the pre-tokenizers of current chat models (GPT-2's, Llama 3's and Qwen's
/// byte-level regexes, where a space joins the word after it; Metaspace and whitespace
/// splitting), not for a tokenizer without one (SentencePiece-style BPE over the whole text,
/// whose merges could span a space) nor for an added token containing a space (a cut could
/// split it). Both are checked, and the claim itself is tried on probe texts at every cut,
/// so a tokenizer that breaks it is encoded only at piece boundaries, as before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceCuts {
    Exact,
    /// Why cutting inside a piece is off for this tokenizer.
    Off(&'static str),
}

/// Texts mixing what pre-tokenizers treat differently (words, digits, punctuation, quotes and
/// contractions, CJK, emoji, combining marks, runs of spaces, tabs and newlines).
const SPACE_CUT_PROBES: [&str; 6] = [
    "Hello world, this is the router's test. It isn't 'quoted' or \"double\" quoted?",
    "x = foo(bar) + 12345 * 6.78e-9; y[i] -> {z} // done #tag @user",
    "你好 世界 🚀 rocket 👩\u{200d}💻 coder Ω omega",
    "naïve café e\u{301} x\u{30a} über straße",
    "tabs\tand  double  spaces a  b\n\nnew para\r\n crlf . end",
    "ALL CAPS Words And MixedCase don't we'll I'M YOU'RE",
];

impl SpaceCuts {
    fn check(tokenizer: &tokenizers::Tokenizer) -> SpaceCuts {
        if tokenizer.get_pre_tokenizer().is_none() {
            return SpaceCuts::Off("no pre-tokenizer");
        }
        if tokenizer.get_added_tokens_decoder().values().any(|t| t.content.contains(' ')) {
            return SpaceCuts::Off("an added token contains a space");
        }
        let encode = |t: &str| tokenizer.encode_fast(t, false).map(|e| e.get_ids().to_vec());
        for probe in SPACE_CUT_PROBES {
            let Ok(whole) = encode(probe) else { return SpaceCuts::Off("a probe failed to encode") };
            let mut limit = probe.len();
            while let Some(cut) = last_space_cut(probe, limit) {
                match encode(&probe[..cut]) {
                    Ok(part) if whole.starts_with(&part) => {}
                    _ => return SpaceCuts::Off("a probe's prefix at a space is not its encoding's prefix"),
                }
                limit = cut - 1;
            }
        }
        SpaceCuts::Exact
    }
}

/// Whether, on the probes, the encodings of the two sides of every space cut concatenate to the
/// whole encoding: the pre-tokens after a cut do not depend on the text before it (true of the
/// byte-level regexes, whose matches restart at a pre-token boundary, and of Metaspace).
fn chunks_concatenate(tokenizer: &tokenizers::Tokenizer) -> bool {
    let encode = |t: &str| tokenizer.encode_fast(t, false).map(|e| e.get_ids().to_vec());
    SPACE_CUT_PROBES.iter().all(|probe| {
        let Ok(whole) = encode(probe) else { return false };
        let mut from = 0;
        while let Some(cut) = first_space_cut(probe, from) {
            match (encode(&probe[..cut]), encode(&probe[cut..])) {
                (Ok(head), Ok(tail)) if head.len() + tail.len() == whole.len() && whole.starts_with(&head) && whole.ends_with(&tail) => {}
                _ => return false,
            }
            from = cut + 1;
        }
        true
    })
}

/// The first `c >= from` where `text` has a space between two non-whitespace characters.
fn first_space_cut(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut c = from + bytes.get(from..)?.iter().position(|&b| b == b' ')?;
    loop {
        if is_space_cut(text, c) {
            return Some(c);
        }
        c += 1 + bytes[c + 1..].iter().position(|&b| b == b' ')?;
    }
}

/// Whether the space at byte `c` of `text` lies between two non-whitespace characters.
fn is_space_cut(text: &str, c: usize) -> bool {
    // A space is one byte: `c` and `c + 1` are character boundaries.
    let before = text[..c].chars().next_back();
    let after = text[c + 1..].chars().next();
    before.is_some_and(|ch| !ch.is_whitespace()) && after.is_some_and(|ch| !ch.is_whitespace())
}

/// The last `c <= limit` where `text` has a space between two non-whitespace characters.
fn last_space_cut(text: &str, limit: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let end = limit.min(bytes.len().saturating_sub(1));
    let mut c = bytes.get(..=end)?.iter().rposition(|&b| b == b' ')?;
    loop {
        if is_space_cut(text, c) {
            return Some(c);
        }
        c = bytes[..c].iter().rposition(|&b| b == b' ')?;
    }
}

#[cfg(test)]
mod tests {
    use super::{first_space_cut, last_space_cut};

    #[test]
    fn space_cuts_fall_between_non_spaces_within_the_limit() {
        assert_eq!(last_space_cut("ab cd ef", 100), Some(5));
        assert_eq!(last_space_cut("ab cd ef", 5), Some(5));
        assert_eq!(last_space_cut("ab cd ef", 4), Some(2));
        assert_eq!(last_space_cut("ab cd ef", 1), None);
        // Runs of spaces, spaces next to newlines or at the ends are not cuts.
        assert_eq!(last_space_cut("ab  cd", 100), None);
        assert_eq!(last_space_cut("ab \ncd \tx", 100), None);
        assert_eq!(last_space_cut(" ab ", 100), None);
        assert_eq!(last_space_cut("", 100), None);
        // Multi-byte neighbours.
        assert_eq!(last_space_cut("你好 世界", 100), Some(6));
    }

    #[test]
    fn chunk_cuts_are_the_first_space_between_non_spaces_from_a_point() {
        assert_eq!(first_space_cut("ab cd ef", 0), Some(2));
        assert_eq!(first_space_cut("ab cd ef", 2), Some(2));
        assert_eq!(first_space_cut("ab cd ef", 3), Some(5));
        assert_eq!(first_space_cut("ab cd ef", 6), None);
        assert_eq!(first_space_cut("ab cd ef", 100), None);
        assert_eq!(first_space_cut("ab  cd \nx y", 0), Some(9));
        assert_eq!(first_space_cut("你好 世界", 0), Some(6));
    }
}
