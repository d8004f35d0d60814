//! Client request bodies, as the filter parses them inside Envoy for every LLM request:
//! `kvroute_core::request::parse` for each API on arbitrary bytes, then what the filter and
//! the state service compute from a parsed request (canonical text, block keys, text-chunk
//! keys, the chat template input).
//!
//! Oracles beyond "no panic":
//! - the fast top-level scanner (`request/scan.rs`) never changes a result: the same body with
//!   an escaped key injected first (which makes the scanner decline, so serde_json parses the
//!   whole body) must parse to the same request, or fail with the same error kind;
//! - key counts are `len / block` and the first key is `chain(root, first block)`;
//! - a chat prompt's `template_input` is a JSON object holding a `messages` array (for the
//!   Responses API, its `input`: a string or an array of items).
#![no_main]

use kvroute_core::keys::{chain, extend_token_keys, text_chunk_keys, token_block_keys, KeyRoot, DEFAULT_TEXT_CHUNK_BYTES};
use kvroute_core::request::{parse, Api, ParseError, Prompt, PromptRequest};
use libfuzzer_sys::fuzz_target;

const APIS: [Api; 4] = [Api::Completions, Api::ChatCompletions, Api::Messages, Api::Responses];

fuzz_target!(|data: &[u8]| {
    // The request path is untrusted too (it picks the API).
    let _ = Api::from_path(&String::from_utf8_lossy(data));
    let forced = force_serde_path(data);
    for api in APIS {
        let result = parse(api, data);
        if let Some(forced) = &forced {
            compare(api, data, &result, &parse(api, forced));
        }
        match result {
            Ok(req) => use_request(api, &req),
            Err(e) => {
                let _ = (e.kind(), e.to_string());
            }
        }
    }
});

/// `data` with `"\u0078":0` inserted as the first field: the scanner declines escaped keys, so
/// this body takes the serde_json path, and `x` is a field `parse` never reads. `None` when
/// `data` does not open an object (both bodies would take the serde_json path anyway).
fn force_serde_path(data: &[u8]) -> Option<Vec<u8>> {
    let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let open = data.iter().position(|b| !ws(b))?;
    if data[open] != b'{' {
        return None;
    }
    let after = &data[open + 1..];
    let empty = after.iter().find(|b| !ws(b)) == Some(&b'}');
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&data[..=open]);
    out.extend_from_slice(br#""\u0078":0"#);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(after);
    Some(out)
}

fn compare(api: Api, data: &[u8], fast: &Result<PromptRequest, ParseError>, slow: &Result<PromptRequest, ParseError>) {
    // serde_json's nesting limit counts the enclosing object on the whole-body path and not
    // when the scanner hands over one field: a value nested exactly at the limit parses on
    // one path only. That is the one known, harmless difference.
    let deep = |r: &Result<PromptRequest, ParseError>| matches!(r, Err(ParseError::NotJson(m)) if m.contains("recursion limit"));
    if deep(fast) || deep(slow) {
        return;
    }
    let same = match (fast, slow) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => a.kind() == b.kind(),
        _ => false,
    };
    assert!(same, "{api:?}: the scanner changed the result\nbody: {:?}\nscanner path: {fast:?}\nserde path: {slow:?}", String::from_utf8_lossy(data));
}

fn use_request(api: Api, req: &PromptRequest) {
    let root = KeyRoot::new(&req.model, &req.cache_salt);
    let text = req.canonical_text();
    for chunk in [DEFAULT_TEXT_CHUNK_BYTES, 7, 1] {
        let keys = text_chunk_keys(&root, text, chunk);
        assert_eq!(keys.len(), text.len() / chunk);
    }
    assert!(text_chunk_keys(&root, text, 0).is_empty());
    match &req.prompt {
        Prompt::Tokens(ids) => {
            for block in [16usize, 3, 1] {
                let keys = token_block_keys(&root, ids, block);
                assert_eq!(keys.len(), ids.len() / block);
                if let (Some(first), Some(ids)) = (keys.first(), ids.get(..block)) {
                    assert_eq!(*first, chain(root.token_root(), ids));
                }
                // Extending a chain block by block equals cutting it at once.
                if keys.len() >= 2 {
                    let mut out = Vec::new();
                    extend_token_keys(keys[0], &ids[block..], block, &mut out);
                    assert_eq!(out, keys[1..]);
                }
            }
            assert!(token_block_keys(&root, ids, 0).is_empty());
        }
        Prompt::Text(_) => {}
        Prompt::Chat { template_input, canonical } => {
            assert_eq!(text, canonical.as_str());
            let v: serde_json::Value = serde_json::from_str(template_input).expect("template_input is JSON");
            if api == Api::Responses {
                let input = v.get("input");
                assert!(input.is_some_and(|i| i.is_string() || i.is_array()), "Responses template_input without input: {template_input}");
            } else {
                assert!(v.get("messages").is_some_and(serde_json::Value::is_array), "template_input without messages: {template_input}");
            }
        }
    }
}
