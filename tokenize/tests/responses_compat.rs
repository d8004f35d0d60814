//! Responses API token ids equal what vLLM 0.33's `/v1/responses` renders: its own message
//! construction, tool conversion and request parsing, run from the vLLM wheel by
//! tests/responses_reference.py, then transformers' `apply_chat_template`. The committed
//! corpus (tests/corpus/responses.json: string input, multi-part input_text, assistant
//! output_text, function_call + function_call_output, reasoning, instructions, tools, partial
//! messages, items vLLM rejects, previous_response_id conversations) plus seeded generated
//! requests and conversations. A request without history goes through the production path
//! (`render_chat` / `encode_chat` with `Api::Responses`, cached and uncached); one continuing
//! a stored conversation through `responses::chat_template_input` with the history, as the
//! simulator renders it. A missing venv, tokenizer or wheel fails the test unless
//! KVROUTE_SKIP_PY=1.

mod common;

use kvroute_tokenize::{responses, Api, ModelTokenizer};
use serde_json::{Map, Value as Json};

fn object(v: &Json) -> Result<&Map<String, Json>, String> {
    v.as_object().ok_or_else(|| "request must be an object".to_string())
}

/// The case's ids, rendered text and chat messages (for the failure report).
fn rust_ids(tok: &ModelTokenizer, case: &Json) -> Result<(Vec<u32>, String, Json), String> {
    let request = &case["request"];
    let previous = case["previous"].as_array().cloned().unwrap_or_default();
    if previous.is_empty() {
        let input = request.to_string();
        let rendered = tok.render_chat(&input, Api::Responses).map_err(|e| e.to_string())?;
        let cached = tok.encode_chat(&input, Api::Responses).map_err(|e| e.to_string())?;
        let whole = tok.encode_chat_uncached(&input, Api::Responses).map_err(|e| e.to_string())?;
        assert_eq!(cached, whole, "cached != uncached for {}", case["name"]);
        let chat = responses::chat_template_input(object(request)?, None).map_err(|e| e.to_string())?;
        return Ok((cached, rendered.text, chat["messages"].clone()));
    }
    // What a store keeps per response: the messages built for its request, and its output.
    let mut history: Option<(Vec<Json>, Vec<Json>)> = None;
    for turn in &previous {
        let prev = history.as_ref().map(|(m, o)| (m.as_slice(), o.as_slice()));
        let chat = responses::chat_template_input(object(&turn["request"])?, prev).map_err(|e| e.to_string())?;
        let messages = chat["messages"].as_array().cloned().unwrap_or_default();
        history = Some((messages, turn["output"].as_array().cloned().unwrap_or_default()));
    }
    let prev = history.as_ref().map(|(m, o)| (m.as_slice(), o.as_slice()));
    let chat = Json::Object(responses::chat_template_input(object(request)?, prev).map_err(|e| e.to_string())?);
    let input = chat.to_string();
    let rendered = tok.render_chat(&input, Api::ChatCompletions).map_err(|e| e.to_string())?;
    let ids = tok.encode_chat(&input, Api::ChatCompletions).map_err(|e| e.to_string())?;
    Ok((ids, rendered.text, chat["messages"].clone()))
}

fn cases() -> Vec<Json> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus/responses.json")).expect("corpus file");
    let mut cases: Vec<Json> = serde_json::from_str(&text).expect("corpus JSON");
    let mut rng = common::gen::rng(20260515);
    for i in 0..40 {
        let request = common::gen_responses::responses(&mut rng, 1 + i % 5, 1 + i % 3);
        cases.push(serde_json::json!({"name": format!("gen_responses_{i}"), "request": request}));
    }
    for i in 0..20 {
        let mut chain = common::gen_responses::responses_chain(&mut rng, 2 + i % 4, 1 + i % 2);
        chain["name"] = Json::String(format!("gen_chain_{i}"));
        cases.push(chain);
    }
    cases
}

#[test]
fn responses_token_ids_match_vllm_and_transformers() {
    if common::skip_py() {
        return;
    }
    let (dir, python) = common::fixture().expect("tokenizer fixture and venv (set KVROUTE_SKIP_PY=1 to skip)");
    let wheel = common::vllm_wheel().expect("the vLLM 0.33.0 wheel (set KVROUTE_SKIP_PY=1 to skip)");
    let cases = cases();
    let expected = common::responses_reference(&python, &dir, &wheel, &cases).expect("python reference");
    assert_eq!(expected.len(), cases.len());
    let tok = ModelTokenizer::from_dir(&dir).expect("load tokenizer");
    let (mut failures, mut rejected) = (Vec::new(), 0);
    for (case, want) in cases.iter().zip(&expected) {
        let name = case["name"].as_str().unwrap_or("?");
        match (rust_ids(&tok, case), want.get("ids")) {
            (Ok((ids, _, _)), Some(w)) if serde_json::to_value(&ids).ok().as_ref() == Some(w) => {}
            (Err(_), None) => rejected += 1,
            (got, _) => {
                let (ids, text, messages) = match got {
                    Ok((i, t, m)) => (format!("{i:?}"), t, m.to_string()),
                    Err(e) => (format!("error: {e}"), String::new(), String::new()),
                };
                failures.push(format!(
                    "== {name}\nrust messages: {messages}\nvllm messages: {}\nrust text:\n{text}\npython text:\n{}\nrust ids: {ids}\npython: {}\n",
                    want.get("messages").map(Json::to_string).unwrap_or_default(),
                    want.get("text").and_then(Json::as_str).unwrap_or(""),
                    want.get("ids").map(|v| v.to_string()).or_else(|| want.get("error").map(|v| v.to_string())).unwrap_or_default()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
    assert!(rejected < cases.len() / 4, "{rejected} of {} cases rejected by both sides", cases.len());
    eprintln!("responses: {} cases equal ({rejected} rejected by both vLLM and kvroute)", cases.len());
}
