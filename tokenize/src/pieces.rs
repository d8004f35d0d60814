//! Splitting a prompt at added tokens, exactly where `tokenizers` splits it.
//!
//! `tokenizers` first cuts the input at every non-normalized added token (an Aho-Corasick
//! automaton, leftmost-longest), then normalizes, pre-tokenizes and BPE-encodes each piece
//! between them on its own. So `encode(a + T + b) == encode(a) ++ [id(T)] ++ encode(b)` for
//! every such token `T`, and the pieces between them can be encoded (and cached) separately.
//! Chat templates put control tokens (`<|im_start|>`, `<|im_end|>`, ...) around every message,
//! so a conversation splits into per-message pieces that repeat from turn to turn.
//!
//! Tokens with `lstrip`/`rstrip`/`single_word` absorb or look at their neighbours; when a
//! tokenizer has any such non-normalized token the splitter is disabled (the whole prompt is
//! one piece), which is always correct, only slower.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// One span of a prompt: an added token with its id, or text to encode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    Token(u32),
    Text(&'a str),
}

#[derive(Debug)]
pub struct Splitter {
    automaton: Option<(AhoCorasick, Vec<u32>)>,
}

impl Splitter {
    /// From the tokenizer's added tokens.
    pub fn new(tokenizer: &tokenizers::Tokenizer) -> Splitter {
        let decoder = tokenizer.get_added_tokens_decoder();
        let mut tokens: Vec<(u32, &tokenizers::AddedToken)> = decoder.iter().map(|(id, t)| (*id, t)).filter(|(_, t)| !t.normalized).collect();
        tokens.sort_by_key(|(id, _)| *id);
        if tokens.iter().any(|(_, t)| t.lstrip || t.rstrip || t.single_word || t.content.is_empty()) {
            return Splitter { automaton: None };
        }
        let ids = tokens.iter().map(|(id, _)| *id).collect();
        let automaton = AhoCorasickBuilder::new().match_kind(MatchKind::LeftmostLongest).build(tokens.iter().map(|(_, t)| t.content.as_str())).ok();
        Splitter { automaton: automaton.map(|a| (a, ids)) }
    }

    /// A splitter that never splits.
    pub fn disabled() -> Splitter {
        Splitter { automaton: None }
    }

    pub fn is_enabled(&self) -> bool {
        self.automaton.is_some()
    }

    /// The pieces of `text`, in order; empty text pieces are left out.
    pub fn split<'a>(&self, text: &'a str) -> Vec<Piece<'a>> {
        let mut out = Vec::new();
        let Some((automaton, ids)) = &self.automaton else {
            if !text.is_empty() {
                out.push(Piece::Text(text));
            }
            return out;
        };
        let mut at = 0;
        for m in automaton.find_iter(text) {
            if m.start() > at {
                out.push(Piece::Text(&text[at..m.start()]));
            }
            out.push(Piece::Token(ids[m.pattern().as_usize()]));
            at = m.end();
        }
        if at < text.len() {
            out.push(Piece::Text(&text[at..]));
        }
        out
    }
}
