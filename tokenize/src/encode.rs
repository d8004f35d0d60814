//! Prompt text -> token ids, through the piece cache.
//!
//! The prompt is split at added tokens ([`crate::pieces`]); each text piece is looked up by
//! hash and encoded with `tokenizers` (no special tokens added) only on a miss. A warm turn of
//! a conversation therefore encodes only its new messages; the rest costs a hash and a lookup
//! per piece. Equality with whole-prompt encoding is the invariant the tests check.
//!
//! A bounded encoding ([`CachedEncoder::encode_prefix`]) stops at a piece boundary, or inside a
//! piece at a space no pre-token spans ([`SpaceCuts`]), so its ids are always the whole text's
//! first ids.
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

pub struct CachedEncoder {
    tokenizer: tokenizers::Tokenizer,
    splitter: Splitter,
    cache: PieceCache,
    space_cuts: SpaceCuts,
}

impl std::fmt::Debug for CachedEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedEncoder")
            .field("splitting", &self.splitter.is_enabled())
            .field("space_cuts", &self.space_cuts)
            .field("cache", &self.cache)
            .finish()
    }
}

impl CachedEncoder {
    pub fn new(tokenizer: tokenizers::Tokenizer, cache_bytes: usize) -> CachedEncoder {
        let splitter = Splitter::new(&tokenizer);
        let space_cuts = SpaceCuts::check(&tokenizer);
        CachedEncoder { tokenizer, splitter, cache: PieceCache::new(cache_bytes), space_cuts }
    }

    /// Whether an over-budget piece is encoded up to a space (see [`SpaceCuts`]).
    pub fn cuts_at_spaces(&self) -> bool {
        self.space_cuts == SpaceCuts::Exact
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
                Piece::Text(t) => ids.extend_from_slice(&self.encode_piece(t)?),
            }
        }
        Ok(ids)
    }

    /// Encodes the longest prefix of `text` that needs at most `budget` bytes of cache-missing
    /// text encoded and ends where the whole encoding has a token boundary: at a piece boundary
    /// (an added token: `tokenizers` never merges across one) or, inside the first piece that
    /// does not fit, at the last space within the budget that no pre-token spans
    /// ([`SpaceCuts`]). Cached pieces cost nothing against the budget, so a warm conversation
    /// is encoded whole; a cold long one stops within the budget, inside a long message too
    /// (nothing of that message is encoded when the tokenizer cannot be cut at spaces).
    pub fn encode_prefix(&self, text: &str, budget: usize) -> Result<Prefix, TokenizeError> {
        let pieces = self.splitter.split(text);
        let mut ids = Vec::with_capacity(text.len().min(budget.saturating_mul(2)) / 3);
        let mut spent = 0usize;
        for (i, piece) in pieces.iter().enumerate() {
            match *piece {
                Piece::Token(id) => ids.push(id),
                Piece::Text(t) => {
                    let cached = self.cache.peek(PieceHash::of(t)).is_some();
                    if !cached && spent + t.len() > budget {
                        let mut rest_bytes: usize = pieces.iter().skip(i).map(|p| if let Piece::Text(t) = p { t.len() } else { 0 }).sum();
                        if let Some(cut) = self.space_cut(t, budget - spent) {
                            // Cached too: the next turn of this conversation cuts here again.
                            ids.extend_from_slice(&self.encode_piece(&t[..cut])?);
                            rest_bytes -= cut;
                        }
                        return Ok(Prefix { ids, rest_bytes });
                    }
                    spent += if cached { 0 } else { t.len() };
                    ids.extend_from_slice(&self.encode_piece(t)?);
                }
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

    fn encode_piece(&self, text: &str) -> Result<Arc<[u32]>, TokenizeError> {
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

/// The last `c <= limit` where `text` has a space between two non-whitespace characters.
fn last_space_cut(text: &str, limit: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let end = limit.min(bytes.len().saturating_sub(1));
    let mut c = bytes.get(..=end)?.iter().rposition(|&b| b == b' ')?;
    loop {
        // A space is one byte: `c` and `c + 1` are character boundaries.
        let before = text[..c].chars().next_back();
        let after = text[c + 1..].chars().next();
        if before.is_some_and(|ch| !ch.is_whitespace()) && after.is_some_and(|ch| !ch.is_whitespace()) {
            return Some(c);
        }
        c = bytes[..c].iter().rposition(|&b| b == b' ')?;
    }
}

#[cfg(test)]
mod tests {
    use super::last_space_cut;

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
}
