//! Prompt text -> token ids, through the piece cache.
//!
//! The prompt is split at added tokens ([`crate::pieces`]); each text piece is looked up by
//! hash and encoded with `tokenizers` (no special tokens added) only on a miss. A warm turn of
//! a conversation therefore encodes only its new messages; the rest costs a hash and a lookup
//! per piece. Equality with whole-prompt encoding is the invariant the tests check.
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
    /// Text bytes of the pieces left unencoded (0 when complete).
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
}

impl std::fmt::Debug for CachedEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedEncoder").field("splitting", &self.splitter.is_enabled()).field("cache", &self.cache).finish()
    }
}

impl CachedEncoder {
    pub fn new(tokenizer: tokenizers::Tokenizer, cache_bytes: usize) -> CachedEncoder {
        let splitter = Splitter::new(&tokenizer);
        CachedEncoder { tokenizer, splitter, cache: PieceCache::new(cache_bytes) }
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

    /// Encodes the longest prefix of `text` that ends at a piece boundary (an added token:
    /// exact, since `tokenizers` never merges across one) and needs at most `budget` bytes of
    /// cache-missing text encoded. Cached pieces cost nothing against the budget, so a warm
    /// conversation is encoded whole; a cold long one stops at the last message boundary
    /// within the budget. A first piece larger than the budget leaves nothing encoded.
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
                        let rest_bytes = pieces.iter().skip(i).map(|p| if let Piece::Text(t) = p { t.len() } else { 0 }).sum();
                        return Ok(Prefix { ids, rest_bytes });
                    }
                    spent += if cached { 0 } else { t.len() };
                    ids.extend_from_slice(&self.encode_piece(t)?);
                }
            }
        }
        Ok(Prefix { ids, rest_bytes: 0 })
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
