//! Token ids equal transformers' `apply_chat_template(..., tokenize=True)` (after the Python
//! mirror of vLLM's request normalization, tests/hf_reference.py) for the committed corpus and
//! a seeded set of generated conversations, through both the cached and the uncached path.
//! A missing venv fails the test unless KVROUTE_SKIP_PY=1.

mod common;

use kvroute_tokenize::{Api, ModelTokenizer};
use serde_json::Value as Json;

fn api(case: &Json) -> Option<Api> {
    match case["api"].as_str() {
        Some("chat") => Some(Api::ChatCompletions),
        Some("messages") => Some(Api::Messages),
        _ => None,
    }
}

fn rust_ids(tok: &ModelTokenizer, case: &Json) -> Result<(Vec<u32>, String), String> {
    match api(case) {
        None => {
            let text = case["text"].as_str().ok_or("text case without text")?;
            Ok((tok.encode_text(text).map_err(|e| e.to_string())?, text.to_string()))
        }
        Some(api) => {
            let input = case["input"].to_string();
            let rendered = tok.render_chat(&input, api).map_err(|e| e.to_string())?;
            let cached = tok.encode_chat(&input, api).map_err(|e| e.to_string())?;
            let whole = tok.encode_chat_uncached(&input, api).map_err(|e| e.to_string())?;
            assert_eq!(cached, whole, "cached != uncached for {}", case["name"]);
            Ok((cached, rendered.text))
        }
    }
}

#[test]
fn token_ids_match_transformers() {
    if common::skip_py() {
        return;
    }
    let (dir, python) = common::fixture().expect("tokenizer fixture and venv (set KVROUTE_SKIP_PY=1 to skip)");
    let mut cases = common::corpus();
    cases.extend(common::generated(20240611, 30, 20));
    assert!(cases.len() >= 50, "corpus too small: {}", cases.len());
    let expected = common::python_reference(&python, &dir, &cases).expect("python reference");
    assert_eq!(expected.len(), cases.len());
    let tok = ModelTokenizer::from_dir(&dir).expect("load tokenizer");
    let mut failures = Vec::new();
    for (case, want) in cases.iter().zip(&expected) {
        let name = case["name"].as_str().unwrap_or("?");
        match (rust_ids(&tok, case), want.get("ids")) {
            (Ok((ids, _)), Some(w)) if serde_json::to_value(&ids).ok().as_ref() == Some(w) => {}
            (Err(_), None) => {}
            (got, _) => {
                let (ids, text) = got.map(|(i, t)| (format!("{i:?}"), t)).unwrap_or_else(|e| (format!("error: {e}"), String::new()));
                failures.push(format!(
                    "== {name}\nrust text:\n{text}\npython text:\n{}\nrust ids: {ids}\npython: {}\n",
                    want.get("text").and_then(Json::as_str).unwrap_or(""),
                    want.get("ids").map(|v| v.to_string()).or_else(|| want.get("error").map(|v| v.to_string())).unwrap_or_default()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
