//! The event decoder as of 8479738 (reference for `decoder_differential.rs`; verbatim apart
//! from imports).
//!
//! One event: the tagged-map form (vLLM >= ~0.26) and the older positional-array form.
//!
//! Both forms fill the same [`Fields`] and share one constructor, so "which fields are
//! required, what the defaults are" lives in one place ([`Fields::build`]).

use super::msgpack::{Int, Reader};
use kvroute_kv::vllm::DecodeError;
use kvroute_kv::types::{EngineHash, KvEvent, Tier};

const STORED: &str = "BlockStored";
const REMOVED: &str = "BlockRemoved";
const CLEARED: &str = "AllBlocksCleared";

/// Field values as found on the wire; `None` = absent (or nil where nil is the default).
#[derive(Default)]
struct Fields {
    hashes: Option<Vec<EngineHash>>,
    parent: Option<EngineHash>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    medium: Option<Tier>,
    lora_name: Option<String>,
    /// String entries of the first block's `extra_keys`, in order (see `cache_salt`).
    first_extra_strings: Vec<String>,
}

pub(super) fn decode_event(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    match r.peek()? {
        0x80..=0x8f | 0xde | 0xdf => decode_map(r),
        _ => decode_positional(r),
    }
}

fn decode_map(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    let n = r.map_len()?;
    let mut kind: Option<&'static str> = None;
    let mut f = Fields::default();
    for _ in 0..n {
        let key = r.str()?;
        match key {
            "type" => kind = Some(event_kind(r.str()?)?),
            "block_hashes" => f.hashes = Some(hash_list(r)?),
            "parent_block_hash" => f.parent = opt(r, hash)?,
            "token_ids" => f.token_ids = Some(token_list(r)?),
            "block_size" => f.block_size = Some(block_size(r)?),
            "medium" => f.medium = opt(r, medium)?,
            "lora_name" => f.lora_name = opt(r, |r| Ok(r.str()?.to_owned()))?,
            "extra_keys" => f.first_extra_strings = first_extra_strings(r)?,
            _ => r.skip()?,
        }
    }
    f.build(kind.ok_or(DecodeError::MissingType)?)
}

/// `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
/// lora_name, extra_keys, ...]`, `["BlockRemoved", block_hashes, medium, ...]`,
/// `["AllBlocksCleared"]`. Trailing fields may be absent (older versions had fewer).
fn decode_positional(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    let n = r.array_len()?;
    if n == 0 {
        return Err(DecodeError::MissingType);
    }
    let kind = event_kind(r.str()?)?;
    let mut f = Fields::default();
    for i in 1..n {
        match (kind, i) {
            (STORED, 1) | (REMOVED, 1) => f.hashes = Some(hash_list(r)?),
            (STORED, 2) => f.parent = opt(r, hash)?,
            (STORED, 3) => f.token_ids = Some(token_list(r)?),
            (STORED, 4) => f.block_size = Some(block_size(r)?),
            (STORED, 6) | (REMOVED, 2) => f.medium = opt(r, medium)?,
            (STORED, 7) => f.lora_name = opt(r, |r| Ok(r.str()?.to_owned()))?,
            (STORED, 8) => f.first_extra_strings = first_extra_strings(r)?,
            _ => r.skip()?,
        }
    }
    f.build(kind)
}

impl Fields {
    fn build(self, kind: &'static str) -> Result<KvEvent, DecodeError> {
        let missing = |field| DecodeError::MissingField { event: kind, field };
        match kind {
            STORED => {
                let cache_salt = cache_salt(self.first_extra_strings, self.lora_name.as_deref());
                Ok(KvEvent::Stored {
                    hashes: self.hashes.ok_or_else(|| missing("block_hashes"))?,
                    parent: self.parent,
                    token_ids: self.token_ids.ok_or_else(|| missing("token_ids"))?,
                    block_size: self.block_size.ok_or_else(|| missing("block_size"))?,
                    lora_name: self.lora_name,
                    cache_salt,
                    tier: self.medium.unwrap_or_default(),
                })
            }
            REMOVED => Ok(KvEvent::Removed {
                hashes: self.hashes.ok_or_else(|| missing("block_hashes"))?,
                tier: self.medium.unwrap_or_default(),
            }),
            _ => Ok(KvEvent::AllCleared),
        }
    }
}

/// vLLM 0.33 publishes per-block `extra_keys` untagged, in the order LoRA name (when a LoRA
/// is set), `(mm_identifier, offset)` pairs (arrays), the cache salt (first block of a
/// request only), prompt-embeds digests (bin). So the salt is the first string after the
/// LoRA name. (`kv_cache_utils.generate_block_hash_extra_keys` + `to_event_extra_keys`.)
fn cache_salt(strings: Vec<String>, lora_name: Option<&str>) -> Option<String> {
    let mut it = strings.into_iter().peekable();
    if let (Some(lora), Some(first)) = (lora_name, it.peek()) {
        if first == lora {
            it.next();
        }
    }
    it.next()
}

fn event_kind(s: &str) -> Result<&'static str, DecodeError> {
    match s {
        STORED => Ok(STORED),
        REMOVED => Ok(REMOVED),
        CLEARED => Ok(CLEARED),
        other => Err(DecodeError::UnknownEventType(other.chars().take(64).collect())),
    }
}

/// nil -> None, else `read`.
fn opt<'a, T>(
    r: &mut Reader<'a>,
    read: impl FnOnce(&mut Reader<'a>) -> Result<T, DecodeError>,
) -> Result<Option<T>, DecodeError> {
    if r.nil()? {
        return Ok(None);
    }
    read(r).map(Some)
}

fn hash(r: &mut Reader<'_>) -> Result<EngineHash, DecodeError> {
    match r.peek()? {
        0xc4..=0xc6 => {
            let b = r.bin()?;
            let tail = b.len().checked_sub(8).map(|s| &b[s..]).ok_or(DecodeError::ShortHash(b.len()))?;
            Ok(EngineHash(tail.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))))
        }
        _ => Ok(EngineHash(match r.int()? {
            Int::U(u) => u,
            Int::I(i) => i as u64,
        })),
    }
}

fn hash_list(r: &mut Reader<'_>) -> Result<Vec<EngineHash>, DecodeError> {
    let n = r.array_len()?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(hash(r)?);
    }
    Ok(v)
}

fn token_list(r: &mut Reader<'_>) -> Result<Vec<u32>, DecodeError> {
    let n = r.array_len()?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(match r.int()? {
            Int::U(u) => u32::try_from(u).map_err(|_| DecodeError::BadTokenId(i128::from(u)))?,
            Int::I(i) => return Err(DecodeError::BadTokenId(i128::from(i))),
        });
    }
    Ok(v)
}

fn block_size(r: &mut Reader<'_>) -> Result<u32, DecodeError> {
    match r.int()? {
        Int::U(u) => u32::try_from(u).map_err(|_| DecodeError::BadBlockSize(i128::from(u))),
        Int::I(i) => Err(DecodeError::BadBlockSize(i128::from(i))),
    }
}

fn medium(r: &mut Reader<'_>) -> Result<Tier, DecodeError> {
    let s = r.str()?;
    if s.eq_ignore_ascii_case("GPU") {
        Ok(Tier::Gpu)
    } else if s.eq_ignore_ascii_case("CPU") {
        Ok(Tier::Cpu)
    } else if s.eq_ignore_ascii_case("STORAGE") {
        Ok(Tier::Storage)
    } else {
        Err(DecodeError::UnknownMedium(s.chars().take(64).collect()))
    }
}

/// The top-level string entries of the first block's extra keys; everything else skipped.
fn first_extra_strings(r: &mut Reader<'_>) -> Result<Vec<String>, DecodeError> {
    if r.nil()? {
        return Ok(Vec::new());
    }
    let blocks = r.array_len()?;
    let mut out = Vec::new();
    for b in 0..blocks {
        if b > 0 || r.nil()? {
            if b > 0 {
                r.skip()?;
            }
            continue;
        }
        let n = match r.peek()? {
            0x90..=0x9f | 0xdc | 0xdd => r.array_len()?,
            _ => {
                r.skip()?;
                continue;
            }
        };
        for _ in 0..n {
            match r.peek()? {
                0xa0..=0xbf | 0xd9..=0xdb => out.push(r.str()?.to_owned()),
                _ => r.skip()?,
            }
        }
    }
    Ok(out)
}
