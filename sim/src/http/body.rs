//! Request bodies as JSON, nested as deep as vLLM admits them.
//!
//! vLLM reads a body with Python's `json.loads` (FastAPI's `await request.json()`), then
//! pydantic, which ignores fields it does not know. Python's decoder nests containers up to the
//! interpreter's recursion limit (about 1000), so a body carrying an ignored field nested a
//! few hundred levels deep is served. serde_json refuses a 128th level when it builds values.
//! Here:
//!
//! - a body nesting deeper than [`MAX_DEPTH`] is refused before anything parses it: a
//!   cheap, non-recursive byte scan ([`nesting_depth`]) measures it, and the 400 is the
//!   invalid-JSON one in Python's words (`maximum recursion depth exceeded`);
//! - up to that, the fields the simulator does not read are skipped however deep they nest:
//!   serde_json skips an ignored value with a loop and a heap stack, never recursion, whether
//!   into a typed body ([`parse_json`]) or as a raw slice ([`parse_object`],
//!   [`template_input`]);
//! - the fields it reads are built as values within serde_json's own limit ([`SERDE_DEPTH`]
//!   levels from the top of the body), as before: deeper is still a 400. The chat tokenizer
//!   (`kvroute-tokenize`) parses with that limit anyway, and values that deep are cloned,
//!   echoed and dropped by recursive code (a debug build's clone of a 1000-level value needs
//!   over 1 MiB of stack; a tokio worker has 2 MiB). So no tree deeper than serde_json's
//!   limit is ever built, and no handler can overflow a worker's stack.
//!
//! Ordinary invalid JSON keeps serde's message (`invalid request body: ...`).

use super::error::ApiError;
use serde::de::{self, DeserializeOwned, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::HashMap;

/// The deepest nesting of arrays and objects a body may have (the body's own object is level
/// 1): Python's default recursion limit, which bounds `json.loads`.
pub const MAX_DEPTH: usize = 1000;

/// The deepest nesting serde_json builds values for (it refuses the 128th level): the bound on
/// the fields the simulator reads, and on what the tokenizer crate parses.
pub const SERDE_DEPTH: usize = 127;

/// The top-level fields the tokenizer reads from a chat, `/tokenize` or messages body
/// (`kvroute-tokenize` `input.rs`, `anthropic.rs`).
const TEMPLATE_FIELDS: &[&str] =
    &["messages", "system", "tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs", "reasoning_effort"];

/// The deepest nesting of `[`/`{` in `bytes`, strings (and their escapes) skipped. Linear and
/// non-recursive; on malformed JSON only an estimate (the parser then reports the error).
pub fn nesting_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

fn invalid(e: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(format!("invalid request body: {e}"))
}

/// The body's nesting depth, or the 400 for a body Python's decoder would give up on.
fn checked_depth(body: &[u8]) -> Result<usize, ApiError> {
    match nesting_depth(body) {
        d if d > MAX_DEPTH => Err(invalid(format!("maximum recursion depth exceeded (JSON nested deeper than {MAX_DEPTH} levels)"))),
        d => Ok(d),
    }
}

/// Parse a JSON body into a typed request, turning serde's message into a 400. Fields `T`
/// does not name are skipped at any depth up to [`MAX_DEPTH`].
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    checked_depth(body)?;
    serde_json::from_slice(body).map_err(invalid)
}

/// A body's top-level fields as raw JSON slices, in order (a repeated key keeps its first
/// place and its last value, as `json.loads` and serde_json's map do). Builds no value tree.
struct RawFields<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for RawFields<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = RawFields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out: Vec<(String, &'de RawValue)> = Vec::new();
                let mut seen: HashMap<String, usize> = HashMap::new();
                while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                    match seen.get(&k) {
                        Some(&i) => out[i].1 = v,
                        None => {
                            seen.insert(k.clone(), out.len());
                            out.push((k, v));
                        }
                    }
                }
                Ok(RawFields(out))
            }
        }
        d.deserialize_map(Fields)
    }
}

/// The top-level fields of a body nesting past [`SERDE_DEPTH`]: each field's raw JSON, or
/// `None` for one too deep for serde_json that is not in `reads` (vLLM ignores it too). A
/// field in `reads` that deep is a 400, as it always was.
fn shallow_fields<'a>(body: &'a [u8], reads: &[&str]) -> Result<Vec<(String, Option<&'a RawValue>)>, ApiError> {
    let RawFields(fields) = serde_json::from_slice(body).map_err(invalid)?;
    fields
        .into_iter()
        .map(|(k, raw)| match 1 + nesting_depth(raw.get().as_bytes()) {
            d if d <= SERDE_DEPTH => Ok((k, Some(raw))),
            _ if reads.contains(&k.as_str()) => {
                Err(invalid(format!("recursion limit exceeded in `{k}` (the simulator parses at most {SERDE_DEPTH} levels of a field it reads)")))
            }
            _ => Ok((k, None)),
        })
        .collect()
}

/// A body as a JSON object, for a handler that reads the fields named in `reads` (and counts
/// the others, as pydantic's errors do). A field it does not read that nests past
/// [`SERDE_DEPTH`] is `null` there, so that no deep tree is built.
pub fn parse_object(body: &[u8], reads: &[&str]) -> Result<Map<String, Value>, ApiError> {
    if checked_depth(body)? <= SERDE_DEPTH {
        return serde_json::from_slice(body).map_err(invalid);
    }
    let mut out = Map::new();
    for (k, raw) in shallow_fields(body, reads)? {
        let v = raw.map(|r| serde_json::from_str(r.get())).transpose().map_err(invalid)?;
        out.insert(k, v.unwrap_or(Value::Null));
    }
    Ok(out)
}

/// A chat (`/v1/chat/completions`, `/tokenize`) or messages body as the tokenizer's template
/// input: the body itself when serde_json's limit parses it; otherwise its fields again,
/// byte for byte, those the tokenizer does not read and could not parse left out.
pub fn template_input(body: &[u8]) -> Result<Cow<'_, str>, ApiError> {
    let text = std::str::from_utf8(body).map_err(invalid)?;
    if checked_depth(body)? <= SERDE_DEPTH {
        return Ok(Cow::Borrowed(text));
    }
    let mut out = String::with_capacity(body.len());
    for (k, raw) in shallow_fields(body, TEMPLATE_FIELDS)? {
        let Some(raw) = raw else { continue };
        out.push(if out.is_empty() { '{' } else { ',' });
        out += &Value::String(k).to_string();
        out.push(':');
        out += raw.get();
    }
    if out.is_empty() {
        out.push('{');
    }
    out.push('}');
    Ok(Cow::Owned(out))
}

/// The names of the fields a `#[derive(Deserialize)]` struct reads (serde's `FIELDS`), for
/// [`parse_object`]'s `reads`.
pub fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    #[derive(Debug)]
    struct Fields(&'static [&'static str]);
    impl std::fmt::Display for Fields {
        fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "{:?}", self.0)
        }
    }
    impl std::error::Error for Fields {}
    impl de::Error for Fields {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Fields(&[])
        }
    }
    /// Answers a struct's request for its fields by handing them back as the error.
    struct Probe;
    impl<'de> de::Deserializer<'de> for Probe {
        type Error = Fields;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Fields> {
            Err(Fields(&[]))
        }
        fn deserialize_struct<V: Visitor<'de>>(self, _: &'static str, fields: &'static [&'static str], _: V) -> Result<V::Value, Fields> {
            Err(Fields(fields))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    match T::deserialize(Probe) {
        Err(Fields(fields)) => fields,
        Ok(_) => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn the_scan_skips_strings_and_escapes() {
        assert_eq!(nesting_depth(b"1"), 0);
        assert_eq!(nesting_depth(br#"{"a": [1, {"b": []}]}"#), 4);
        assert_eq!(nesting_depth(br#"{"a": "[[[{{", "b": "\"[[", "c": "\\", "d": [1]}"#), 2);
        assert_eq!(nesting_depth(nested(5000).as_bytes()), 5000);
    }

    #[test]
    fn serde_depth_is_serde_jsons_limit() {
        // The tokenizer parses with `serde_json::from_str`: it takes SERDE_DEPTH, no more.
        assert!(serde_json::from_str::<Value>(&nested(SERDE_DEPTH)).is_ok());
        let e = serde_json::from_str::<Value>(&nested(SERDE_DEPTH + 1)).unwrap_err();
        assert!(e.to_string().contains("recursion limit exceeded"), "{e}");
    }

    #[derive(Deserialize, Debug)]
    struct Model {
        model: String,
        #[allow(dead_code)]
        max_tokens: Option<Value>,
    }

    /// On a thread with a small stack: deep bodies must not need a big one.
    fn small_stack(f: impl FnOnce() + Send + 'static) {
        std::thread::Builder::new().stack_size(128 << 10).spawn(f).unwrap().join().unwrap();
    }

    #[test]
    fn ignored_fields_nest_up_to_max_depth() {
        small_stack(|| {
            let body = |depth: usize| format!(r#"{{"model": "m", "x": {}, "y": 2}}"#, nested(depth - 1));
            assert_eq!(parse_json::<Model>(body(MAX_DEPTH).as_bytes()).unwrap().model, "m");
            let v = parse_object(body(MAX_DEPTH).as_bytes(), &["model"]).unwrap();
            assert_eq!(Value::Object(v), serde_json::json!({"model": "m", "x": null, "y": 2}));
            for e in [
                parse_json::<Model>(body(MAX_DEPTH + 1).as_bytes()).unwrap_err(),
                parse_object(body(MAX_DEPTH + 1).as_bytes(), &[]).unwrap_err(),
                template_input(body(MAX_DEPTH + 1).as_bytes()).unwrap_err(),
            ] {
                assert!(e.to_string().starts_with("invalid request body: maximum recursion depth exceeded"), "{e}");
            }
        });
    }

    #[test]
    fn read_fields_keep_serdes_limit() {
        let body = |depth: usize| format!(r#"{{"model": "m", "max_tokens": {}}}"#, nested(depth - 1));
        assert!(parse_json::<Model>(body(SERDE_DEPTH).as_bytes()).is_ok());
        assert!(parse_json::<Model>(body(SERDE_DEPTH + 1).as_bytes()).unwrap_err().to_string().contains("recursion limit exceeded"));
        assert!(parse_object(body(SERDE_DEPTH).as_bytes(), &["max_tokens"]).is_ok());
        let e = parse_object(body(SERDE_DEPTH + 1).as_bytes(), &["max_tokens"]).unwrap_err().to_string();
        assert!(e.contains("recursion limit exceeded in `max_tokens`"), "{e}");
    }

    #[test]
    fn ordinary_errors_keep_serdes_message() {
        let e = parse_json::<Value>(b"{\"a\": ").unwrap_err().to_string();
        assert_eq!(e, "invalid request body: EOF while parsing a value at line 1 column 6");
        let e = parse_object(b"{} x", &[]).unwrap_err().to_string();
        assert_eq!(e, "invalid request body: trailing characters at line 1 column 4");
        let e = parse_object(format!("[{}]", nested(200)).as_bytes(), &[]).unwrap_err().to_string();
        assert_eq!(e, parse_object(b"[1]", &[]).unwrap_err().to_string());
    }

    #[test]
    fn the_template_input_leaves_out_only_deep_fields_the_tokenizer_ignores() {
        let shallow = br#"{"messages": [], "metadata": [[1]]}"#;
        assert!(matches!(template_input(shallow).unwrap(), Cow::Borrowed(_)));
        let body = format!(
            r#"{{"messages": [{{"role": "user", "content": "h\u00e9"}}], "a": {}, "b" : {}, "c": {}, "b": 4}}"#,
            nested(150),
            nested(3),
            nested(SERDE_DEPTH - 1)
        );
        let input = template_input(body.as_bytes()).unwrap();
        let c = nested(SERDE_DEPTH - 1);
        assert_eq!(input, format!(r#"{{"messages":[{{"role": "user", "content": "h\u00e9"}}],"b":4,"c":{c}}}"#));
        let deep_tools = format!(r#"{{"messages": [], "a": {}, "tools": {}}}"#, nested(150), nested(SERDE_DEPTH));
        assert!(template_input(deep_tools.as_bytes()).unwrap_err().to_string().contains("recursion limit exceeded in `tools`"));
        assert_eq!(template_input(format!(r#"{{"a": {}}}"#, nested(200)).as_bytes()).unwrap(), "{}");
    }

    #[test]
    fn a_structs_fields() {
        assert_eq!(fields_of::<Model>(), ["model", "max_tokens"]);
        assert_eq!(fields_of::<Value>(), [] as [&str; 0]);
    }
}
