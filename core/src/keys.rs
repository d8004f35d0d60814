//! kvroute block keys.
//!
//! A prompt is cut into blocks of `block_size` tokens (vLLM's `--block-size`); only full blocks
//! get keys. Keys are chained: `key[i] = H(key[i-1], tokens of block i)`, and the chain starts
//! at a root that mixes in the model (or the LoRA adapter the request names) and the cache salt. A key therefore names
//! the whole prefix up to and including its block, so "worker W holds key[i]" implies it holds
//! the prefix `tokens[..(i+1)*block_size]`, and longest-prefix matching is a walk down the
//! request's keys.
//!
//! These keys are kvroute's own. They never try to equal vLLM's block hashes (which depend on
//! vLLM's hash function and seed): the state service recomputes kvroute keys from the token ids
//! that vLLM's `BlockStored` events carry.
//!
//! Text-chunk keys are an approximate fallback for prompts nobody could tokenize: fixed-size
//! byte chunks of the canonical prompt text, chained the same way from a root in a separate
//! namespace so they can never collide with token keys by construction of the root.
//!
//! H is XXH3-64 over little-endian bytes: `parent (u64) || token ids (u32 each)`. Changing any
//! of this changes every key; the golden vectors in the tests pin it.

use xxhash_rust::xxh3::xxh3_64;

/// A kvroute block key: names a whole prefix of tokens (or text chunks) under one root.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BlockKey(pub u64);

/// Namespace tags hashed into the root so token and text-chunk chains never share a root.
const TOKEN_NAMESPACE: &[u8] = b"kvroute/v1/tokens";
const TEXT_NAMESPACE: &[u8] = b"kvroute/v1/text";

/// The start of every key chain of one (model, LoRA, cache salt).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyRoot {
    token: BlockKey,
    text: BlockKey,
}

impl KeyRoot {
    /// `name` is what vLLM roots a request's blocks at: the LoRA adapter's name when the
    /// request names one (its `model` field, as vLLM's API takes it), else the model's.
    /// `cache_salt` is empty when absent.
    pub fn new(name: &str, cache_salt: &str) -> Self {
        KeyRoot { token: root_key(TOKEN_NAMESPACE, name, cache_salt), text: root_key(TEXT_NAMESPACE, name, cache_salt) }
    }

    /// Parent of the first token block.
    pub fn token_root(&self) -> BlockKey {
        self.token
    }

    /// Parent of the first text chunk.
    pub fn text_root(&self) -> BlockKey {
        self.text
    }
}

fn root_key(namespace: &[u8], name: &str, cache_salt: &str) -> BlockKey {
    // Length-prefixed fields: ("ab", "c") and ("a", "bc") must not collide. The empty middle
    // field is where a separate LoRA name once went; it stays so deployed keys do not change.
    let mut buf = Vec::with_capacity(namespace.len() + name.len() + cache_salt.len() + 24);
    buf.extend_from_slice(namespace);
    for field in [name, "", cache_salt] {
        buf.extend_from_slice(&(field.len() as u64).to_le_bytes());
        buf.extend_from_slice(field.as_bytes());
    }
    BlockKey(xxh3_64(&buf))
}

/// The key of one block given its parent's key (or the root).
pub fn chain(parent: BlockKey, block: &[u32]) -> BlockKey {
    let mut buf = Vec::with_capacity(8 + 4 * block.len());
    chain_into(parent, block, &mut buf)
}

fn chain_into(parent: BlockKey, block: &[u32], buf: &mut Vec<u8>) -> BlockKey {
    buf.clear();
    buf.extend_from_slice(&parent.0.to_le_bytes());
    for t in block {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    BlockKey(xxh3_64(buf))
}

/// Keys of every full block of `tokens`, chained from `parent`, appended to `out`.
/// A trailing partial block gets no key. `block_size == 0` yields nothing.
pub fn extend_token_keys(parent: BlockKey, tokens: &[u32], block_size: usize, out: &mut Vec<BlockKey>) {
    if block_size == 0 {
        return;
    }
    let mut buf = Vec::with_capacity(8 + 4 * block_size);
    let mut prev = parent;
    out.reserve(tokens.len() / block_size);
    for block in tokens.chunks_exact(block_size) {
        prev = chain_into(prev, block, &mut buf);
        out.push(prev);
    }
}

/// Keys of every full block of a token-id prompt.
pub fn token_block_keys(root: &KeyRoot, tokens: &[u32], block_size: usize) -> Vec<BlockKey> {
    let mut out = Vec::new();
    extend_token_keys(root.token_root(), tokens, block_size, &mut out);
    out
}

/// Default size of a text chunk in bytes: about 64 tokens of English text, 4 token blocks.
pub const DEFAULT_TEXT_CHUNK_BYTES: usize = 256;

/// Approximate keys: every full `chunk_bytes`-byte chunk of `text`, chained from the text root.
pub fn text_chunk_keys(root: &KeyRoot, text: &str, chunk_bytes: usize) -> Vec<BlockKey> {
    if chunk_bytes == 0 {
        return Vec::new();
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len() / chunk_bytes);
    let mut buf = Vec::with_capacity(8 + chunk_bytes);
    let mut prev = root.text_root();
    for chunk in bytes.chunks_exact(chunk_bytes) {
        buf.clear();
        buf.extend_from_slice(&prev.0.to_le_bytes());
        buf.extend_from_slice(chunk);
        prev = BlockKey(xxh3_64(&buf));
        out.push(prev);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn toks(n: u32) -> Vec<u32> {
        (0..n).map(|i| i * 7 + 3).collect()
    }

    #[test]
    fn only_full_blocks_get_keys() {
        let root = KeyRoot::new("m", "");
        assert_eq!(token_block_keys(&root, &toks(15), 16).len(), 0);
        assert_eq!(token_block_keys(&root, &toks(16), 16).len(), 1);
        assert_eq!(token_block_keys(&root, &toks(47), 16).len(), 2);
        assert!(token_block_keys(&root, &toks(47), 0).is_empty());
    }

    #[test]
    fn root_separates_name_salt_and_namespaces() {
        let a = KeyRoot::new("m", "");
        let roots = [
            a,
            KeyRoot::new("m2", ""),
            KeyRoot::new("m", "salt"),
            KeyRoot::new("", "m"),
        ];
        for (i, x) in roots.iter().enumerate() {
            assert_ne!(x.token_root(), x.text_root());
            for y in &roots[i + 1..] {
                assert_ne!(x.token_root(), y.token_root());
            }
        }
    }

    #[test]
    fn chain_matches_batch_computation() {
        let root = KeyRoot::new("m", "");
        let t = toks(64);
        let keys = token_block_keys(&root, &t, 16);
        let mut prev = root.token_root();
        for (i, block) in t.chunks_exact(16).enumerate() {
            prev = chain(prev, block);
            assert_eq!(prev, keys[i]);
        }
        // Continuing from a parent equals computing the whole prompt at once.
        let mut tail = Vec::new();
        extend_token_keys(keys[1], &t[32..], 16, &mut tail);
        assert_eq!(&tail[..], &keys[2..]);
    }

    /// Pinned values: if these change, every deployed filter and state service disagree.
    #[test]
    fn golden_vectors() {
        let root = KeyRoot::new("Qwen/Qwen3-8B", "");
        assert_eq!(root.token_root(), BlockKey(GOLDEN_TOKEN_ROOT));
        assert_eq!(root.text_root(), BlockKey(GOLDEN_TEXT_ROOT));
        let keys = token_block_keys(&root, &toks(40), 16);
        assert_eq!(keys, vec![BlockKey(GOLDEN_TOKEN_KEYS[0]), BlockKey(GOLDEN_TOKEN_KEYS[1])]);
        let salted = token_block_keys(&KeyRoot::new("sql-adapter", "s"), &toks(16), 16);
        assert_eq!(salted, vec![BlockKey(GOLDEN_SALTED_KEY)]);
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(12);
        let chunks = text_chunk_keys(&root, &text, DEFAULT_TEXT_CHUNK_BYTES);
        assert_eq!(chunks, vec![BlockKey(GOLDEN_TEXT_KEYS[0]), BlockKey(GOLDEN_TEXT_KEYS[1])]);
    }

    // Computed independently from the spec above with Python's `xxhash` package
    // (xxh3_64_intdigest over the same little-endian layout), not by this code.
    const GOLDEN_TOKEN_ROOT: u64 = 17365838797282743307;
    const GOLDEN_TEXT_ROOT: u64 = 18399253172760220471;
    const GOLDEN_TOKEN_KEYS: [u64; 2] = [15866391106132277296, 13072699239280386036];
    const GOLDEN_SALTED_KEY: u64 = 1115736363781292262;
    const GOLDEN_TEXT_KEYS: [u64; 2] = [3082233755495870074, 17542785902828590097];

    proptest! {
        /// Prefix stability: extending a prompt never changes the keys of its existing blocks.
        #[test]
        fn keys_are_prefix_stable(t in proptest::collection::vec(any::<u32>(), 0..200),
                                  extra in proptest::collection::vec(any::<u32>(), 0..100),
                                  bs in 1usize..33) {
            let root = KeyRoot::new("m", "");
            let a = token_block_keys(&root, &t, bs);
            let mut longer = t.clone();
            longer.extend_from_slice(&extra);
            let b = token_block_keys(&root, &longer, bs);
            prop_assert_eq!(&b[..a.len()], &a[..]);
            prop_assert_eq!(b.len(), longer.len() / bs);
        }

        /// Changing one token changes its block's key and every key after it.
        #[test]
        fn a_changed_token_changes_the_rest(t in proptest::collection::vec(any::<u32>(), 32..128),
                                            pos in 0usize..32) {
            let root = KeyRoot::new("m", "");
            let a = token_block_keys(&root, &t, 16);
            let mut u = t.clone();
            u[pos] = u[pos].wrapping_add(1);
            let b = token_block_keys(&root, &u, 16);
            let first = pos / 16;
            prop_assert_eq!(&a[..first], &b[..first]);
            for i in first..a.len() { prop_assert_ne!(a[i], b[i]); }
        }
    }
}
