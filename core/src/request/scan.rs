//! The filter's hot path: split a body into its top-level fields without parsing their values,
//! and read a token-id array without building one `serde_json::Value` per id.
//!
//! A long token-id prompt is a JSON array of thousands of integers. Parsing it through
//! `serde_json` costs ~20 ns per id (~200 us for 8k tokens natively, more in Wasm), which was
//! most of what the filter adds to a request. Here the body's structure (`{ "key": value, ...
//! }`) is checked byte by byte, values are skipped by matching brackets and strings, and only
//! the fields the router reads are handed to `serde_json` (which validates them). A token
//! array is parsed by a strict digit loop.
//!
//! Both functions return `None` on anything they do not handle (escaped keys, odd numbers,
//! malformed input): the caller then takes the plain `serde_json` path, which produces the
//! error messages. So this module can only make parsing faster, never change its result; the
//! property tests below check that against `serde_json`.

/// Top-level `(key, raw value bytes)` pairs of a JSON object, in order; `None` when the body is
/// not a simple object (caller falls back to serde_json).
pub(super) fn top_level_fields(body: &[u8]) -> Option<Vec<(&str, &[u8])>> {
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
        let value_end = skip_value(body, i)?;
        fields.push((key, body.get(i..value_end)?));
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
    let mut i = skip_ws(span, 0);
    expect(span, i, b'[')?;
    let mut ids = Vec::with_capacity(span.len() / 4);
    loop {
        i = skip_ws(span, i + 1);
        let start = i;
        let mut n: u64 = 0;
        while let Some(d) = span.get(i).filter(|b| b.is_ascii_digit()) {
            n = n * 10 + u64::from(d - b'0');
            if n > u64::from(u32::MAX) {
                return None;
            }
            i += 1;
        }
        // JSON forbids leading zeros; an empty run is not a number.
        if i == start || (span.get(start) == Some(&b'0') && i - start > 1) {
            return None;
        }
        ids.push(n as u32);
        i = skip_ws(span, i);
        match span.get(i)? {
            b',' => {}
            b']' => return (skip_ws(span, i + 1) == span.len()).then_some(ids),
            _ => return None,
        }
    }
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

/// End (exclusive) of the string starting at the quote at `i`.
fn skip_string(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match b.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
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
                match b.get(j)? {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};

    #[test]
    fn splits_fields_and_reads_tokens() {
        let body = br#" { "model" : "m", "prompt":[1, 2 ,30],"nested":{"a":[{"b":"}]\""}]},"n":-1.5e3 } "#;
        let f = top_level_fields(body).unwrap();
        let keys: Vec<&str> = f.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["model", "prompt", "nested", "n"]);
        assert_eq!(token_array(f[1].1), Some(vec![1, 2, 30]));
        assert_eq!(f[2].1, br#"{"a":[{"b":"}]\""}]}"#);
        assert_eq!(f[3].1, b"-1.5e3");
        assert_eq!(top_level_fields(b"{}"), Some(vec![]));
    }

    #[test]
    fn declines_what_it_does_not_handle() {
        for body in [&b"[1]"[..], b"{\"a\\u0041\":1}", b"{\"a\":1", b"{\"a\":1}x", b"{\"a\" 1}", b"{\"a\":}", b""] {
            assert_eq!(top_level_fields(body), None, "{}", String::from_utf8_lossy(body));
        }
        for span in [&b"[]"[..], b"[1,]", b"[01]", b"[1.0]", b"[-1]", b"[4294967296]", b"[1 2]", b"\"x\"", b"[[1]]"] {
            assert_eq!(token_array(span), None, "{}", String::from_utf8_lossy(span));
        }
        assert_eq!(token_array(b"[4294967295, 0]"), Some(vec![u32::MAX, 0]));
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
        fn agrees_with_serde_json(fields in proptest::collection::btree_map("[a-z_\"\\\\]{1,8}", value(), 0..6), pretty in any::<bool>()) {
            let object = Value::Object(fields.into_iter().collect::<Map<_, _>>());
            let body = if pretty { serde_json::to_vec_pretty(&object) } else { serde_json::to_vec(&object) }.unwrap();
            let Value::Object(expected) = serde_json::from_slice::<Value>(&body).unwrap() else { unreachable!() };
            if let Some(split) = top_level_fields(&body) {
                prop_assert_eq!(split.len(), expected.len());
                for (key, raw) in split {
                    let parsed: Value = serde_json::from_slice(raw).unwrap();
                    prop_assert_eq!(Some(&parsed), expected.get(key));
                    if let Some(ids) = token_array(raw) {
                        prop_assert_eq!(serde_json::from_slice::<Vec<u32>>(raw).unwrap(), ids);
                    }
                }
            } else {
                prop_assert!(expected.keys().any(|k| k.contains(['"', '\\'])), "declined a plain object: {}", String::from_utf8_lossy(&body));
            }
        }

        /// Truncated or corrupted bodies are declined or split into spans serde_json rejects;
        /// the scanner never accepts garbage as a token array.
        #[test]
        fn never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Some(fields) = top_level_fields(&bytes) {
                for (_, raw) in fields {
                    if let Some(ids) = token_array(raw) {
                        prop_assert_eq!(serde_json::from_slice::<Vec<u32>>(raw).ok(), Some(ids));
                    }
                }
            }
        }
    }
}
