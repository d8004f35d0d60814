//! Stage 1: the prompt as keys. Which keys to match, how many tokens, and whether that is
//! exact or approximate.
//!
//! Token-id prompts come with exact keys from the filter. Text and chat prompts are turned into
//! token ids here (see [`crate::tokenization`]) so kvroute matches their blocks exactly, for
//! kvroute and dynamo_kv (whose frontend tokenizes); the other baselines either ignore keys or,
//! like SGLang's and llm-d's approximate routers, match request text. Tokenizing needs only
//! the model's static facts (its base model's tokenizer, block size, a worker to ask); the
//! decision's snapshot of load and health is taken after it, so a slow tokenization never
//! decides on load that is milliseconds old.

use super::Picker;
use crate::metrics::TokenizeFailure;
use crate::tokenization::{wants_tokens, Reach};
use kvroute_core::keys::{token_block_keys, KeyRoot};
use kvroute_core::wire::{DegradedReason, PickRequest, TokenizationPath};
use kvroute_kv::types::BlockKey;
use kvroute_score::Policy;
use std::sync::Arc;
use std::time::Instant;

/// What the prompt stage found.
#[derive(Clone)]
pub(super) enum Keyed {
    /// Exact keys computed here (text or chat prompts tokenized).
    Exact(PromptView),
    /// The request's own keys: token ids the filter keyed, or a policy that does not tokenize.
    AsSent,
    /// No exact keys (the filter's text chunks), and why: out of time, out of encoding slots,
    /// no tokenizer, or a prompt that has no exact ids.
    Degraded(DegradedReason),
}

impl Picker {
    /// The prompt's exact keys when tokenizing can make them exact, within `until`.
    pub(super) async fn prompt(&self, policy: Policy, req: &PickRequest, until: Option<Instant>) -> Keyed {
        // Dynamo tokenizes in its frontend: its KV router matches exact blocks too.
        if !matches!(policy, Policy::Kvroute | Policy::DynamoKv) || !wants_tokens(req) {
            return Keyed::AsSent;
        }
        let keyed = match until {
            None => self.exact_prompt(req).await,
            Some(until) => match tokio::time::timeout_at(until.into(), self.exact_prompt(req)).await {
                Ok(keyed) => keyed,
                Err(_) => {
                    self.tokenization.count_failure(TokenizationPath::TokenizationLocal, TokenizeFailure::Deadline);
                    Err(TokenizeFailure::Deadline)
                }
            },
        };
        match keyed {
            Ok(prompt) => Keyed::Exact(prompt),
            Err(failure) => Keyed::Degraded(degraded_reason(failure)),
        }
    }

    /// Routing needs a prompt's keys only as far as some worker holds them: the encoding
    /// stops within `probe_bytes` of new text, and goes on (to `max_encode_bytes`) only when
    /// every block encoded so far is held somewhere, so the match could reach further.
    async fn exact_prompt(&self, req: &PickRequest) -> Result<PromptView, TokenizeFailure> {
        let target = self.fleet.tokenize_target(&req.model).ok_or(TokenizeFailure::NoEndpoint)?;
        // Rooted at the request's model: the adapter's name for a LoRA request, as vLLM roots it.
        let root = KeyRoot::new(&req.model, &req.cache_salt);
        let block = target.block_size as usize;
        let mut exact = self.tokenization.exact_ids(req, &target, Reach::Probe).await?;
        let mut keys = token_block_keys(&root, &exact.ids, block);
        let more = self.tokenization.budget(Reach::Full) > 0;
        if !exact.complete && more && self.fleet.longest_match(&keys, tokio::time::Instant::now()) as usize >= keys.len() {
            exact = self.tokenization.exact_ids(req, &target, Reach::Full).await?;
            keys = token_block_keys(&root, &exact.ids, block);
        }
        // Not one full block within the encoding budget (a first message longer than
        // `max_encode_bytes` stops before its text): the filter's text-chunk keys still route it
        // by what was learned, a degraded decision, where empty exact keys would route it on
        // load alone and call that exact.
        if keys.is_empty() && !req.text_chunk_keys.is_empty() {
            self.tokenization.count_failure(exact.path, TokenizeFailure::Truncated);
            return Err(TokenizeFailure::Truncated);
        }
        Ok(PromptView::from_ids(keys, exact.prompt_tokens as usize, target.block_size, exact.path))
    }
}

/// The degraded reason a tokenization failure stands for: three causes an operator acts on
/// differently (raise the deadline or the cores, raise the slots, fix the tokenizer), and the
/// prompts that have no exact ids whatever is done.
fn degraded_reason(failure: TokenizeFailure) -> DegradedReason {
    match failure {
        TokenizeFailure::Deadline => DegradedReason::DegradedTokenizeDeadline,
        TokenizeFailure::Busy => DegradedReason::DegradedTokenizeBusy,
        TokenizeFailure::Unavailable
        | TokenizeFailure::Loading
        | TokenizeFailure::NoEndpoint
        | TokenizeFailure::Backoff
        | TokenizeFailure::Timeout
        | TokenizeFailure::Connect
        | TokenizeFailure::Status
        | TokenizeFailure::Body => DegradedReason::DegradedTokenizerUnavailable,
        TokenizeFailure::Media | TokenizeFailure::Input | TokenizeFailure::Template | TokenizeFailure::Encode | TokenizeFailure::Truncated | TokenizeFailure::TooLong => {
            DegradedReason::DegradedPromptNotTokenizable
        }
    }
}

/// A request's prompt as the scorer sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptView {
    /// Chained keys to match: token block keys when exact, text-chunk keys otherwise.
    /// Shared, so recording the pick's credit does not copy them.
    pub keys: Arc<[BlockKey]>,
    /// True for token block keys (matched against the KV index), false for text chunks.
    pub exact: bool,
    /// Prompt tokens: exact, or estimated from bytes.
    pub prompt_tokens: u32,
    /// Tokens one key stands for.
    pub tokens_per_key: u32,
    pub tokenization: TokenizationPath,
    /// Why kvroute cannot score this prompt exactly, if it cannot.
    pub limitation: Option<DegradedReason>,
}

/// About four bytes of text per token: only used where no tokenizer was available.
const BYTES_PER_TOKEN: u32 = 4;

impl PromptView {
    /// `block_size` is the model's; `chunk_bytes` the text-chunk size the filter used.
    /// The view of `req`'s prompt: its keys (at most [`MAX_PICK_KEYS`]) and size, claims
    /// bounded by what the pick carries.
    pub fn new(req: &PickRequest, block_size: u32, chunk_bytes: u32) -> PromptView {
        let is_token_prompt = !req.token_keys.is_empty() || (req.prompt_tokens > 0 && req.prompt_text.is_empty() && req.chat_json.is_empty());
        if is_token_prompt {
            return Self::tokens(req, block_size);
        }
        // Claimed sizes are bounded by what the pick carries: the text itself, or its chunks.
        let carried = req.prompt_text.len() + req.chat_json.len();
        let chunked = (req.text_chunk_keys.len() as u64 + 1) * u64::from(chunk_bytes);
        let bytes = if req.prompt_bytes > 0 { u64::from(req.prompt_bytes).min((carried as u64).max(chunked)) } else { carried as u64 };
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        let keys: Arc<[BlockKey]> = req.text_chunk_keys.iter().take(MAX_PICK_KEYS).map(|k| BlockKey(*k)).collect();
        let tokenization = if keys.is_empty() { TokenizationPath::TokenizationNone } else { TokenizationPath::TokenizationTextChunks };
        PromptView {
            keys,
            exact: false,
            prompt_tokens: bytes / BYTES_PER_TOKEN,
            tokens_per_key: (chunk_bytes / BYTES_PER_TOKEN).max(1),
            tokenization,
            limitation: Some(DegradedReason::DegradedTokenizerUnavailable),
        }
    }

    /// A view of the filter's own keys, with the reason no exact keys were had: text chunks are
    /// degraded for that reason rather than for a missing tokenizer.
    pub fn because(self, reason: DegradedReason) -> PromptView {
        match self.limitation {
            Some(DegradedReason::DegradedTokenizerUnavailable) => PromptView { limitation: Some(reason), ..self },
            _ => self,
        }
    }

    /// Exact keys of token ids the state service computed (`path`: local or worker).
    /// Worker-tokenized prompts are exact but degraded: the local tokenizer was unavailable.
    pub fn from_ids(keys: Vec<BlockKey>, tokens: usize, block_size: u32, path: TokenizationPath) -> PromptView {
        PromptView {
            keys: keys.into(),
            exact: true,
            prompt_tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
            tokens_per_key: block_size,
            tokenization: path,
            limitation: (path != TokenizationPath::TokenizationLocal).then_some(DegradedReason::DegradedTokenizerUnavailable),
        }
    }

    fn tokens(req: &PickRequest, block_size: u32) -> PromptView {
        let mismatch = req.block_size != 0 && req.block_size != block_size;
        let keys: Arc<[BlockKey]> =
            if mismatch { Arc::from([]) } else { req.token_keys.iter().take(MAX_PICK_KEYS).map(|k| BlockKey(*k)).collect() };
        let keyed_tokens = (req.token_keys.len() as u32).saturating_mul(block_size);
        PromptView {
            keys,
            exact: true,
            // A prompt is its full blocks plus less than one more: a larger claim is not
            // believed (it would park phantom waiting tokens on the chosen worker).
            prompt_tokens: req.prompt_tokens.clamp(keyed_tokens, keyed_tokens.saturating_add(block_size)),
            tokens_per_key: block_size,
            tokenization: TokenizationPath::TokenizationExactTokenIds,
            limitation: mismatch.then_some(DegradedReason::DegradedBlockSizeMismatch),
        }
    }
}

/// Most keys one pick is matched on: 65,536 blocks, a million tokens at vLLM's block size 16,
/// longer than any context served; a longer prompt is routed on its first million tokens.
pub const MAX_PICK_KEYS: usize = 65_536;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_bounded_by_what_the_pick_carries() {
        let huge = PickRequest { token_keys: vec![1, 2], block_size: 16, prompt_tokens: u32::MAX, ..Default::default() };
        assert_eq!(PromptView::new(&huge, 16, 256).prompt_tokens, 48, "two blocks and less than one more");
        let many = PickRequest { token_keys: (0..MAX_PICK_KEYS as u64 + 10).collect(), block_size: 16, ..Default::default() };
        assert_eq!(PromptView::new(&many, 16, 256).keys.len(), MAX_PICK_KEYS);
        let claimed = PickRequest { text_chunk_keys: vec![1], prompt_bytes: u32::MAX, ..Default::default() };
        assert_eq!(PromptView::new(&claimed, 16, 256).prompt_tokens, 512 / 4, "two chunks at most");
    }

    #[test]
    fn token_prompts_are_exact() {
        let req = PickRequest { token_keys: vec![1, 2, 3], block_size: 16, prompt_tokens: 50, ..Default::default() };
        let p = PromptView::new(&req, 16, 256);
        assert!(p.exact && p.limitation.is_none());
        assert_eq!((p.keys.len(), p.prompt_tokens, p.tokens_per_key), (3, 50, 16));
        let short = PickRequest { prompt_tokens: 5, ..Default::default() };
        assert!(PromptView::new(&short, 16, 256).exact);
    }

    #[test]
    fn wrong_block_size_drops_the_keys() {
        let req = PickRequest { token_keys: vec![1, 2], block_size: 32, prompt_tokens: 64, ..Default::default() };
        let p = PromptView::new(&req, 16, 256);
        assert!(p.keys.is_empty());
        assert_eq!(p.limitation, Some(DegradedReason::DegradedBlockSizeMismatch));
    }

    #[test]
    fn text_prompts_degrade_to_chunks() {
        let req = PickRequest { prompt_text: "x".repeat(600), text_chunk_keys: vec![7, 8], prompt_bytes: 600, ..Default::default() };
        let p = PromptView::new(&req, 16, 256);
        assert!(!p.exact);
        assert_eq!((p.prompt_tokens, p.tokens_per_key), (150, 64));
        assert_eq!(p.tokenization, TokenizationPath::TokenizationTextChunks);
        assert_eq!(p.limitation, Some(DegradedReason::DegradedTokenizerUnavailable));
        let tiny = PickRequest { chat_json: "[]".into(), ..Default::default() };
        assert_eq!(PromptView::new(&tiny, 16, 256).tokenization, TokenizationPath::TokenizationNone);
    }
}
