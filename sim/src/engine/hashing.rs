//! vLLM's `sha256_cbor` block hashing, byte for byte.
//!
//! vLLM hashes each full block as `sha256(cbor2.dumps((parent, tuple(tokens), extra_keys),
//! canonical=True))`, where `parent` is the previous block's 32-byte digest, or for the first
//! block `NONE_HASH = sha256(cbor2.dumps("vllm-none-hash"))` (no PYTHONHASHSEED). Extra keys
//! are `None`, or for the first block of a salted request `(("cache_salt", salt),)`.
//! Only the CBOR subset these values need is implemented: unsigned ints, byte strings, text
//! strings, arrays and null, all with minimal-length heads (canonical form).

use crate::ids::BlockDigest;
use sha2::{Digest, Sha256};

const NONE_HASH_SEED: &str = "vllm-none-hash";

fn head(out: &mut Vec<u8>, major: u8, value: u64) {
    let m = major << 5;
    match value {
        0..=23 => out.push(m | value as u8),
        24..=0xff => out.extend_from_slice(&[m | 24, value as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend_from_slice(&(value as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend_from_slice(&(value as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend_from_slice(&value.to_be_bytes());
        }
    }
}

fn text(out: &mut Vec<u8>, s: &str) {
    head(out, 3, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// `NONE_HASH` for sha256_cbor with the default seed.
pub fn none_hash() -> BlockDigest {
    let mut buf = Vec::new();
    text(&mut buf, NONE_HASH_SEED);
    BlockDigest(Sha256::digest(&buf).into())
}

/// Canonical CBOR of `(parent, tuple(tokens), extra_keys)`.
pub fn block_cbor(parent: &BlockDigest, tokens: &[u32], cache_salt: Option<&str>) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + tokens.len() * 5);
    head(&mut out, 4, 3);
    head(&mut out, 2, 32);
    out.extend_from_slice(&parent.0);
    head(&mut out, 4, tokens.len() as u64);
    for &t in tokens {
        head(&mut out, 0, u64::from(t));
    }
    match cache_salt {
        None => out.push(0xf6),
        Some(salt) => {
            head(&mut out, 4, 1);
            head(&mut out, 4, 2);
            text(&mut out, "cache_salt");
            text(&mut out, salt);
        }
    }
    out
}

/// `hash_block_tokens(sha256_cbor, parent, tokens, extra_keys)`.
pub fn hash_block(parent: Option<&BlockDigest>, tokens: &[u32], cache_salt: Option<&str>) -> BlockDigest {
    let root;
    let parent = match parent {
        Some(p) => p,
        None => {
            root = none_hash();
            &root
        }
    };
    BlockDigest(Sha256::digest(block_cbor(parent, tokens, cache_salt)).into())
}

/// Digests of every full block of `tokens`, chained; salt applies to block 0 only.
pub fn hash_blocks(tokens: &[u32], block_size: usize, cache_salt: Option<&str>) -> Vec<BlockDigest> {
    let mut out: Vec<BlockDigest> = Vec::with_capacity(tokens.len() / block_size);
    extend_hashes(&mut out, tokens, block_size, cache_salt);
    out
}

/// Append digests for the full blocks of `tokens` not yet in `hashes`.
pub fn extend_hashes(hashes: &mut Vec<BlockDigest>, tokens: &[u32], block_size: usize, salt: Option<&str>) {
    let full = tokens.len() / block_size;
    for i in hashes.len()..full {
        let block = &tokens[i * block_size..(i + 1) * block_size];
        let salt = if i == 0 { salt.filter(|s| !s.is_empty()) } else { None };
        let digest = hash_block(hashes.last(), block, salt);
        hashes.push(digest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cbor_heads_are_minimal() {
        let mut v = Vec::new();
        for x in [0u64, 23, 24, 255, 256, 65535, 65536, 1 << 32] {
            head(&mut v, 0, x);
        }
        assert_eq!(
            v,
            [
                0x00, 0x17, 0x18, 0x18, 0x18, 0xff, 0x19, 0x01, 0x00, 0x19, 0xff, 0xff, 0x1a, 0, 1, 0,
                0, 0x1b, 0, 0, 0, 1, 0, 0, 0, 0
            ]
        );
    }

    /// Expected values computed with Python's `cbor2.dumps(x, canonical=True)` + sha256,
    /// the exact calls vLLM's `sha256_cbor` makes.
    #[test]
    fn golden_vectors_match_cbor2() {
        assert_eq!(none_hash().engine_hash().0, 10672167085007826672);
        let t: Vec<u32> = (0..32).collect();
        let h = hash_blocks(&t, 16, None);
        assert_eq!(h[0].engine_hash().0, 2233398808101521225);
        assert_eq!(h[1].engine_hash().0, 17911472383915781900);
        let s = hash_blocks(&t[..16], 16, Some("salty"));
        assert_eq!(s[0].engine_hash().0, 10291590981953698332);
        let big: Vec<u32> = [151643u32, 70000, 5, 300].repeat(4);
        assert_eq!(hash_blocks(&big, 16, None)[0].engine_hash().0, 13720355646100792255);
    }

    #[test]
    fn chain_depends_on_parent_and_salt() {
        let t: Vec<u32> = (0..32).collect();
        let a = hash_blocks(&t, 16, None);
        let b = hash_blocks(&t, 16, Some("s"));
        assert_eq!(a.len(), 2);
        assert_ne!(a[0], b[0]);
        assert_ne!(a[1], b[1], "salt on block 0 changes every later block");
        assert_eq!(hash_block(Some(&a[0]), &t[16..], None), a[1]);
    }
}
