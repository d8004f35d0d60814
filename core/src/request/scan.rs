//! The filter's hot path: split a body into its top-level fields without parsing their values,
//! and read a token-id array without building one `serde_json::Value` per id.
//!
//! A long token-id prompt is a JSON array of thousands of integers. Parsing it through
//! `serde_json` costs ~20 ns per id (~200 us for 8k tokens natively, more in Wasm), which was
//! most of what the filter adds to a request. Here the body's structure (`{ "key": value, ...
//! }`) is checked byte by byte, values are skipped by matching brackets and strings (eight
//! bytes at a time between them), and only the fields the router reads are handed to
//! `serde_json` (which validates them). The token array of the field named by the caller is
//! read while splitting, by a strict digit loop, so its bytes are walked once.
//!
//! Both functions return `None` on anything they do not handle (escaped keys, odd numbers,
//! malformed input): the caller then takes the plain `serde_json` path, which produces the
//! error messages. So this module can only make parsing faster, never change its result; the
//! property tests below check that against `serde_json`.

/// One top-level field: its key, its raw value bytes, and the value read as token ids when it
/// is the field the caller named and a flat array of unsigned 32-bit integers.
#[derive(Debug, PartialEq)]
pub(super) struct Field<'a> {
    pub key: &'a str,
    pub raw: &'a [u8],
    pub tokens: Option<Vec<u32>>,
}

/// Top-level fields of a JSON object, in order; `None` when the body is not a simple object
/// (caller falls back to serde_json). The value of every field named `tokens_of` is also read
/// as a token array on the way (see [`Field::tokens`]).
pub(super) fn top_level_fields<'a>(body: &'a [u8], tokens_of: Option<&str>) -> Option<Vec<Field<'a>>> {
    let mut i = skip_ws(body, 0);
    expect(body, i, b'{')?;
    i = skip_ws(body, i + 1);
    let mut fields = Vec::new();
    if body.get(i) == Some(&b'}') {
        return (skip_ws(body, i + 1) == body.len()).then_some(fields);
    }
    loop {
        expect(body, i, b'"')?;
        let (key, end) = simple_key(body, i)?;
        i = skip_ws(body, end);
        expect(body, i, b':')?;
        i = skip_ws(body, i + 1);
        let read = if tokens_of == Some(key) { token_array_at(body, i) } else { None };
        let (tokens, value_end) = match read {
            Some((ids, end)) => (Some(ids), end),
            None => (None, skip_value(body, i)?),
        };
        fields.push(Field { key, raw: body.get(i..value_end)?, tokens });
        i = skip_ws(body, value_end);
        match body.get(i)? {
            b',' => i = skip_ws(body, i + 1),
            b'}' => return (skip_ws(body, i + 1) == body.len()).then_some(fields),
            _ => return None,
        }
    }
}

/// A flat JSON array of unsigned 32-bit integers; `None` for anything else (including `[]`).
pub(super) fn token_array(span: &[u8]) -> Option<Vec<u32>> {
    let (ids, end) = token_array_at(span, skip_ws(span, 0))?;
    (skip_ws(span, end) == span.len()).then_some(ids)
}

/// The flat token array whose `[` is at `start`, and the index just past its `]`: numbers
/// without a leading zero and at most `u32::MAX`, between `[`/`,` and `,`/`]`, with optional
/// whitespace around each.
fn token_array_at(b: &[u8], start: usize) -> Option<(Vec<u32>, usize)> {
    expect(b, start, b'[')?;
    // A 6-digit id and its comma: room for every id of a typical prompt without regrowing.
    let mut ids = Vec::with_capacity(b.len().saturating_sub(start) / 6 + 1);
    let mut i = start + 1;
    loop {
        i = skip_ws(b, i);
        let (value, len) = digits_at(b, i)?;
        if len > 1 && b.get(i) == Some(&b'0') {
            return None;
        }
        ids.push(value);
        i = skip_ws(b, i + len);
        match b.get(i)? {
            b',' => i += 1,
            b']' => return Some((ids, i + 1)),
            _ => return None,
        }
    }
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// The run of ASCII digits at `i` as a `u32`, and its length; `None` when there is none or it
/// is over `u32::MAX`. A run shorter than 8 within an 8-byte word (a token id has 1 to 6 digits)
/// is found and converted in that word with a few multiplications, not digit by digit.
fn digits_at(b: &[u8], i: usize) -> Option<(u32, usize)> {
    let word = b.get(i..i.checked_add(8)?).and_then(|w| <[u8; 8]>::try_from(w).ok()).map(u64::from_le_bytes);
    if let Some(word) = word {
        match leading_digits(word) {
            0 => return None,
            // The digits moved to the word's top bytes, zero bytes (leading zeros) below them.
            len @ 1..8 => return Some((eight_digits(word << (64 - 8 * len)), len)),
            _ => {}
        }
    }
    // The body's last bytes, or 8 digits or more: one digit at a time.
    let run = b.get(i..)?.iter().take_while(|c| c.is_ascii_digit()).count();
    if run == 0 || run > 10 {
        return None;
    }
    let value = b.get(i..i + run)?.iter().fold(0u64, |v, c| v * 10 + u64::from(c - b'0'));
    Some((u32::try_from(value).ok()?, run))
}

/// How many of the word's bytes, first (lowest) byte first, are ASCII digits before the first
/// that is not (8 when all are). A byte is a digit when its high nibble is 3 and adding 6 keeps
/// it 3; a carry out of a byte of 0xFA or more only disturbs the bytes after a non-digit.
fn leading_digits(word: u64) -> usize {
    let nibbles = (word & 0xF0F0_F0F0_F0F0_F0F0) | ((word.wrapping_add(0x0606_0606_0606_0606) & 0xF0F0_F0F0_F0F0_F0F0) >> 4);
    let off = nibbles ^ 0x3333_3333_3333_3333;
    // The high bit of every byte that is not zero, exactly (no carry between bytes).
    let not_digit = (((off & !HI).wrapping_add(!HI)) | off) & HI;
    (not_digit.trailing_zeros() / 8) as usize
}

/// The number written by 8 ASCII digits or zero bytes, the first (most significant) in the
/// lowest byte: pairs, then quads, then the eight, each step one multiplication.
fn eight_digits(word: u64) -> u32 {
    let pairs = ((word & 0x0F0F_0F0F_0F0F_0F0F).wrapping_mul(10 << 8 | 1)) >> 8;
    let quads = ((pairs & 0x00FF_00FF_00FF_00FF).wrapping_mul(100 << 16 | 1)) >> 16;
    (((quads & 0x0000_FFFF_0000_FFFF).wrapping_mul(10_000 << 32 | 1)) >> 32) as u32
}

/// The key whose opening quote is at `i`, and the index just past its closing quote. Keys
/// with escapes or raw control characters go the serde_json way (`None`).
fn simple_key(b: &[u8], i: usize) -> Option<(&str, usize)> {
    let rest = b.get(i + 1..)?;
    let len = rest.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
    let (key, after) = rest.split_at_checked(len)?;
    if after.first() != Some(&b'"') {
        return None;
    }
    Some((std::str::from_utf8(key).ok()?, i + len + 2))
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

fn expect(b: &[u8], i: usize, byte: u8) -> Option<()> {
    (b.get(i) == Some(&byte)).then_some(())
}

/// Index of the first byte at or after `from` that is one of `needles` (`b.len()` when none
/// is), eight bytes at a time: XOR with the needle makes its bytes zero, and the lowest zero
/// byte of a word is found exactly by the borrow trick (bits above it may be false hits, which
/// the lowest set bit ignores).
fn find_any<const N: usize>(b: &[u8], from: usize, needles: [u8; N]) -> usize {
    let Some(rest) = b.get(from..) else { return b.len() };
    let mut chunks = rest.chunks_exact(8);
    let mut at = from;
    for chunk in &mut chunks {
        let Ok(bytes) = <[u8; 8]>::try_from(chunk) else { break };
        let word = u64::from_le_bytes(bytes);
        let hits = needles.iter().fold(0, |hits, &n| {
            let x = word ^ (LO * u64::from(n));
            hits | (x.wrapping_sub(LO) & !x & HI)
        });
        if hits != 0 {
            return at + (hits.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    chunks.remainder().iter().position(|c| needles.contains(c)).map_or(b.len(), |p| at + p)
}

/// End (exclusive) of the string starting at the quote at `i`.
fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        j = find_any(b, j, [b'"', b'\\']);
        match b.get(j)? {
            b'"' => return Some(j + 1),
            _ => j += 2,
        }
    }
}

/// End (exclusive) of the value starting at `i`. Only boundaries are found here; the caller
/// validates the bytes of every value it uses.
fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                j = find_any(b, j, [b'"', b'{', b'[', b'}', b']']);
                match b.get(j)? {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    _ => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                }
                j += 1;
            }
        }
        _ => {
            // A scalar runs to the next delimiter or the end of the body; an empty one (a
            // delimiter where a value belongs) is not a value.
            let rest = b.get(i..)?;
            let len = rest.iter().position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'));
            let end = i + len.unwrap_or(rest.len());
            (end > i).then_some(end)
        }
    }
}

/// Whether `b` is exactly one JSON value (whitespace around it allowed), as serde_json would
/// accept it: the grammar, string escapes and UTF-8 checked, numbers of any size. Without
/// recursion: each open array or object costs one byte of an explicit stack, so a value nested
/// to any depth is checked in time linear in its bytes (serde_json stops at 128 levels).
pub(super) fn is_json_value(b: &[u8]) -> bool {
    let mut open: Vec<u8> = Vec::new();
    let mut i = skip_ws(b, 0);
    loop {
        // A value starts at `i`; `next` is where it ends (`None`: it opened a container, and
        // `i` is where the container's first value starts).
        let next = match b.get(i) {
            Some(&c @ (b'{' | b'[')) => {
                let j = skip_ws(b, i + 1);
                let close = if c == b'{' { b'}' } else { b']' };
                if b.get(j) == Some(&close) {
                    Some(j + 1)
                } else {
                    open.push(c);
                    i = if c == b'{' {
                        match member(b, j) {
                            Some(v) => v,
                            None => return false,
                        }
                    } else {
                        j
                    };
                    None
                }
            }
            Some(b'"') => match string_end(b, i) {
                Some(end) => Some(end),
                None => return false,
            },
            Some(_) => match scalar_end(b, i) {
                Some(end) => Some(end),
                None => return false,
            },
            None => return false,
        };
        let Some(mut end) = next else { continue };
        // After a value: a comma and the next one, a close, or the end of the input.
        loop {
            end = skip_ws(b, end);
            match (open.last(), b.get(end)) {
                (None, None) => return true,
                (Some(b'{'), Some(b',')) => match member(b, skip_ws(b, end + 1)) {
                    Some(v) => {
                        i = v;
                        break;
                    }
                    None => return false,
                },
                (Some(b'['), Some(b',')) => {
                    i = skip_ws(b, end + 1);
                    break;
                }
                (Some(b'{'), Some(b'}')) | (Some(b'['), Some(b']')) => {
                    open.pop();
                    end += 1;
                }
                _ => return false,
            }
        }
    }
}

/// An object member's `"key":` at `i`; where its value starts.
fn member(b: &[u8], i: usize) -> Option<usize> {
    expect(b, i, b'"')?;
    let j = skip_ws(b, string_end(b, i)?);
    expect(b, j, b':')?;
    Some(skip_ws(b, j + 1))
}

/// End (exclusive) of the valid string whose quote is at `i`: escapes as JSON allows them, no
/// raw control character, UTF-8.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        j = find_any(b, j, [b'"', b'\\']);
        match b.get(j)? {
            b'"' => {
                let text = b.get(i + 1..j)?;
                if text.iter().any(|&c| c < 0x20) {
                    return None;
                }
                std::str::from_utf8(text).ok()?;
                return Some(j + 1);
            }
            _ => match b.get(j + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => j += 2,
                b'u' if b.get(j + 2..j + 6)?.iter().all(u8::is_ascii_hexdigit) => j += 6,
                _ => return None,
            },
        }
    }
}

/// End (exclusive) of the literal (`true`, `false`, `null`) or number at `i`.
fn scalar_end(b: &[u8], i: usize) -> Option<usize> {
    for literal in [&b"true"[..], b"false", b"null"] {
        if b.get(i..i + literal.len()) == Some(literal) {
            return Some(i + literal.len());
        }
    }
    let digits = |from: usize| b.get(from..).map_or(0, |r| r.iter().take_while(|c| c.is_ascii_digit()).count());
    let mut j = i + usize::from(b.get(i) == Some(&b'-'));
    match (b.get(j), digits(j)) {
        (Some(b'0'), _) => j += 1,
        (_, 0) => return None,
        (_, n) => j += n,
    }
    if b.get(j) == Some(&b'.') {
        let n = digits(j + 1);
        if n == 0 {
            return None;
        }
        j += 1 + n;
    }
    if matches!(b.get(j), Some(b'e' | b'E')) {
        j += 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let n = digits(j);
        if n == 0 {
            return None;
        }
        j += n;
    }
    Some(j)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};

    #[test]
    fn splits_fields_and_reads_tokens() {
        let body = br#" { "model" : "m", "prompt":[1, 2 ,30],"nested":{"a":[{"b":"}]\""}]},"n":-1.5e3 } "#;
        let f = top_level_fields(body, Some("prompt")).unwrap();
        let keys: Vec<&str> = f.iter().map(|f| f.key).collect();
        assert_eq!(keys, ["model", "prompt", "nested", "n"]);
        assert_eq!(f[1].raw, b"[1, 2 ,30]");
        assert_eq!(f[1].tokens, Some(vec![1, 2, 30]));
        assert_eq!(token_array(f[1].raw), Some(vec![1, 2, 30]));
        assert_eq!(f[2].raw, br#"{"a":[{"b":"}]\""}]}"#);
        assert_eq!(f[2].tokens, None);
        assert_eq!(f[3].raw, b"-1.5e3");
        assert_eq!(top_level_fields(b"{}", None), Some(vec![]));
        // Not the named field, or not a flat token array: skipped, not read.
        let f = top_level_fields(br#"{"prompt":[1,[2]],"ids":[3]}"#, Some("prompt")).unwrap();
        assert_eq!((f[0].raw, &f[0].tokens, &f[1].tokens), (&b"[1,[2]]"[..], &None, &None));
    }

    #[test]
    fn declines_what_it_does_not_handle() {
        for body in [&b"[1]"[..], b"{\"a\\u0041\":1}", b"{\"a\":1", b"{\"a\":1}x", b"{\"a\" 1}", b"{\"a\":}", b""] {
            assert_eq!(top_level_fields(body, Some("a")), None, "{}", String::from_utf8_lossy(body));
        }
        for span in [&b"[]"[..], b"[1,]", b"[01]", b"[1.0]", b"[-1]", b"[4294967296]", b"[10000000000]", b"[1 2]", b"\"x\"", b"[[1]]", b"[,1]", b"[1", b"[1e3]"] {
            assert_eq!(token_array(span), None, "{}", String::from_utf8_lossy(span));
        }
        assert_eq!(token_array(b"[4294967295, 0]"), Some(vec![u32::MAX, 0]));
    }

    #[test]
    fn json_of_any_depth_is_checked_without_recursion() {
        let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(is_json_value(deep.as_bytes()));
        let objects = format!("{}{}", r#"{"a":"#.repeat(50_000), "}".repeat(50_000)).replace(r#"{"a":}"#, r#"{"a":{}}"#);
        assert!(is_json_value(objects.as_bytes()));
        let unclosed = format!("{}1{}", "[".repeat(1000), "]".repeat(999));
        assert!(!is_json_value(unclosed.as_bytes()));
        for ok in [&b" null "[..], b"-0.5e+10", b"\"\\u00e9\\n\"", b"{\"a\":[1,{\"b\":[]}]}", b"[]", b"{}", "\"é\"".as_bytes()] {
            assert!(is_json_value(ok), "{}", String::from_utf8_lossy(ok));
        }
        for bad in [&b""[..], b"01", b"1.", b"-", b"[1,]", b"{\"a\"}", b"{\"a\":1,}", b"\"\\x\"", b"\"a\x01\"", b"\"\xff\"", b"tru", b"[1]]", b"1 2", b"{1:2}"] {
            assert!(!is_json_value(bad), "{}", String::from_utf8_lossy(bad));
        }
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
            ".{0,12}".prop_map(Value::String),
            proptest::collection::vec(any::<u32>(), 0..40).prop_map(|v| json!(v)),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z\"\\\\]{0,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Whatever the scanner accepts, it splits exactly as serde_json parses.
        #[test]
        fn agrees_with_serde_json(fields in proptest::collection::btree_map("[a-z_\"\\\\]{1,8}", value(), 0..6), pretty in any::<bool>(), named in any::<proptest::sample::Index>()) {
            let object = Value::Object(fields.into_iter().collect::<Map<_, _>>());
            let body = if pretty { serde_json::to_vec_pretty(&object) } else { serde_json::to_vec(&object) }.unwrap();
            let Value::Object(expected) = serde_json::from_slice::<Value>(&body).unwrap() else { unreachable!() };
            let tokens_of = (!expected.is_empty()).then(|| expected.keys().nth(named.index(expected.len()))).flatten().map(String::as_str);
            if let Some(split) = top_level_fields(&body, tokens_of) {
                prop_assert_eq!(split.len(), expected.len());
                for Field { key, raw, tokens } in split {
                    let parsed: Value = serde_json::from_slice(raw).unwrap();
                    prop_assert_eq!(Some(&parsed), expected.get(key));
                    let ids = serde_json::from_slice::<Vec<u32>>(raw).ok().filter(|ids| !ids.is_empty());
                    prop_assert_eq!(token_array(raw), ids.clone());
                    // The named field's token array is read on the way, and only that one.
                    prop_assert_eq!(tokens, if Some(key) == tokens_of { ids } else { None });
                }
            } else {
                prop_assert!(expected.keys().any(|k| k.contains(['"', '\\'])), "declined a plain object: {}", String::from_utf8_lossy(&body));
            }
        }

        /// Truncated or corrupted bodies are declined or split into spans serde_json rejects;
        /// the scanner never accepts garbage as a token array.
        #[test]
        fn never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Some(fields) = top_level_fields(&bytes, Some("a")) {
                for f in fields {
                    if let Some(ids) = f.tokens.clone().or_else(|| token_array(f.raw)) {
                        prop_assert_eq!(serde_json::from_slice::<Vec<u32>>(f.raw).ok(), Some(ids));
                    }
                }
            }
            if let Some(ids) = token_array(&bytes) {
                prop_assert_eq!(serde_json::from_slice::<Vec<u32>>(&bytes).ok(), Some(ids));
            }
        }

        /// Token arrays with any spacing, leading zeros and numbers past `u32::MAX`: read
        /// exactly when serde_json reads them as `Vec<u32>` (the empty array declined).
        #[test]
        fn token_arrays_agree_with_serde_json(items in proptest::collection::vec((0u64..20_000_000_000, any::<bool>(), "[ \t\r\n]{0,2}", "[ \t\r\n]{0,2}"), 0..24), wrap in "[ \n]{0,2}") {
            let numbers: Vec<String> = items
                .iter()
                .map(|(n, zero, before, after)| format!("{before}{}{n}{after}", if *zero { "0" } else { "" }))
                .collect();
            let span = format!("{wrap}[{}]{wrap}", numbers.join(","));
            let expected = serde_json::from_str::<Vec<u32>>(&span).ok().filter(|ids| !ids.is_empty());
            prop_assert_eq!(token_array(span.as_bytes()), expected);
        }

        /// Any JSON value, in any spacing, is JSON to the checker.
        #[test]
        fn every_json_value_is_json(v in value(), pretty in any::<bool>()) {
            let bytes = if pretty { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) }.unwrap();
            prop_assert!(is_json_value(&bytes), "{}", String::from_utf8_lossy(&bytes));
        }

        /// On any bytes (shallow enough for serde_json), the checker agrees with serde_json. JSON
        /// text is UTF-8 (RFC 8259 section 8.1), which serde_json checks only in strings it
        /// reads, not in those `IgnoredAny` skips: the checker rejects `"\x80"`, as it should.
        #[test]
        fn the_checker_agrees_with_serde_json(bytes in proptest::collection::vec(prop_oneof![
            Just(b'{'), Just(b'}'), Just(b'['), Just(b']'), Just(b'"'), Just(b':'), Just(b','), Just(b' '), Just(b'\\'),
            Just(b'0'), Just(b'1'), Just(b'-'), Just(b'.'), Just(b'e'), Just(b'u'), Just(b'n'), Just(b'a'), any::<u8>(),
        ], 0..24)) {
            let serde = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok() && std::str::from_utf8(&bytes).is_ok();
            prop_assert_eq!(is_json_value(&bytes), serde, "{:?}", String::from_utf8_lossy(&bytes));
        }
    }
}
