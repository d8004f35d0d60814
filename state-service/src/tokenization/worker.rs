//! The second tokenization path: ask a worker's vLLM `/tokenize` endpoint.
//!
//! vLLM renders and encodes exactly what it will cache, so its answer is exact by definition;
//! it costs a network round trip on the pick's critical path, hence a short timeout and, after
//! a failure, a pause of that model's worker path (so a down or slow fleet costs one timeout
//! per pause, not one per request).
//!
//! Body shapes (vLLM's `TokenizeCompletionRequest` / `TokenizeChatRequest`):
//! `{"model", "prompt"}` and `{"model", "messages", "add_generation_prompt", "tools"?,
//! "continue_final_message"?, "chat_template_kwargs"?}`. Anthropic `/v1/messages` prompts are
//! first converted the way vLLM's Anthropic endpoint converts them ([`kvroute_tokenize::anthropic`]).
//! Responses `/v1/responses` prompts never take this path: `/tokenize` has no Responses form,
//! and a chat body built from vLLM's Responses messages ([`kvroute_tokenize::responses`]) would
//! be parsed again as chat-completions messages (`input_text` parts, `reasoning` keys and
//! passed-through items meet the chat pydantic types), which is not what the Responses
//! endpoint renders; and a follow-up's `previous_response_id` history is not in the pick. The
//! local path renders them exactly (tests/responses_compat.rs in kvroute-tokenize).

use crate::config::WorkerConfig;
use crate::metrics::TokenizeFailure;
use kvroute_core::wire::{Endpoint, PickRequest};
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

pub struct WorkerTokenizer {
    client: reqwest::Client,
    timeout: Duration,
    retry_after: Duration,
    /// Per model: worker path paused until then.
    paused: Mutex<HashMap<String, Instant>>,
}

/// A worker's HTTP API: `http://{endpoint}`, else its metrics URL without `/metrics`.
pub fn base_url(w: &WorkerConfig) -> Option<String> {
    if !w.endpoint.is_empty() {
        return Some(format!("http://{}", w.endpoint));
    }
    w.metrics_url.as_deref()?.strip_suffix("/metrics").map(str::to_string)
}

/// The worker's vLLM `/tokenize`.
pub fn tokenize_url(w: &WorkerConfig) -> Option<String> {
    base_url(w).map(|base| format!("{base}/tokenize"))
}

/// The `/tokenize` body for a pick's prompt; `None` when it has none.
pub fn request_body(req: &PickRequest) -> Result<Value, TokenizeFailure> {
    if req.chat_json.is_empty() {
        if req.prompt_text.is_empty() {
            return Err(TokenizeFailure::Input);
        }
        return Ok(json!({ "model": req.model, "prompt": req.prompt_text }));
    }
    if req.endpoint == Endpoint::Responses as i32 {
        return Err(TokenizeFailure::Template);
    }
    let Ok(Value::Object(input)) = serde_json::from_str::<Value>(&req.chat_json) else {
        return Err(TokenizeFailure::Input);
    };
    let mut body = Map::new();
    body.insert("model".into(), Value::String(req.model.clone()));
    if req.endpoint == Endpoint::Messages as i32 {
        let (messages, tools) = kvroute_tokenize::anthropic::convert(&input, false).map_err(|_| TokenizeFailure::Template)?;
        body.insert("messages".into(), Value::Array(messages));
        if let Some(tools) = tools.filter(|t| !t.is_empty()) {
            body.insert("tools".into(), Value::Array(tools));
        }
        body.insert("add_generation_prompt".into(), Value::Bool(true));
        return Ok(Value::Object(body));
    }
    let continues = input.get("continue_final_message").and_then(Value::as_bool).unwrap_or(false);
    let agp = input.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(!continues);
    for (field, value) in input {
        if matches!(field.as_str(), "messages" | "tools" | "continue_final_message" | "chat_template_kwargs") {
            body.insert(field, value);
        }
    }
    if !body.contains_key("messages") {
        return Err(TokenizeFailure::Input);
    }
    body.insert("add_generation_prompt".into(), Value::Bool(agp));
    Ok(Value::Object(body))
}

impl WorkerTokenizer {
    pub fn new(timeout: Duration, retry_after: Duration) -> WorkerTokenizer {
        WorkerTokenizer { client: reqwest::Client::new(), timeout, retry_after, paused: Mutex::new(HashMap::new()) }
    }

    /// Whether the worker path of `model` is paused after a recent failure.
    pub fn is_paused(&self, model: &str) -> bool {
        self.paused.lock().get(model).is_some_and(|until| Instant::now() < *until)
    }

    /// Token ids from `url`; a failure pauses `model`'s worker path.
    pub async fn tokenize(&self, model: &str, url: &str, body: &Value) -> Result<Vec<u32>, TokenizeFailure> {
        let result = self.call(url, body).await;
        if let Err(reason) = result {
            let newly = self.paused.lock().insert(model.to_string(), Instant::now() + self.retry_after).is_none_or(|u| u <= Instant::now());
            if newly {
                tracing::warn!(model, url, reason = reason.as_str(), pause_ms = self.retry_after.as_millis() as u64,
                    "worker /tokenize failed: pausing the worker tokenization path");
            }
        }
        result
    }

    async fn call(&self, url: &str, body: &Value) -> Result<Vec<u32>, TokenizeFailure> {
        let sent = self.client.post(url).timeout(self.timeout).json(body).send().await.map_err(classify)?;
        if !sent.status().is_success() {
            return Err(TokenizeFailure::Status);
        }
        let answer: Value = sent.json().await.map_err(classify)?;
        parse_tokens(&answer).ok_or(TokenizeFailure::Body)
    }
}

fn classify(e: reqwest::Error) -> TokenizeFailure {
    if e.is_timeout() {
        TokenizeFailure::Timeout
    } else if e.is_connect() {
        TokenizeFailure::Connect
    } else if e.is_decode() {
        TokenizeFailure::Body
    } else {
        TokenizeFailure::Connect
    }
}

/// vLLM's `TokenizeResponse.tokens`.
fn parse_tokens(answer: &Value) -> Option<Vec<u32>> {
    answer.get("tokens")?.as_array()?.iter().map(|t| t.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_body_carries_what_the_template_reads() {
        let req = PickRequest {
            model: "m".into(),
            endpoint: Endpoint::ChatCompletions as i32,
            chat_json: r#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}],"chat_template_kwargs":{"enable_thinking":false}}"#.into(),
            ..Default::default()
        };
        let body = request_body(&req).unwrap();
        assert_eq!(body["model"], "m");
        assert_eq!(body["add_generation_prompt"], true);
        assert_eq!(body["messages"][0]["content"], "hi");
        assert_eq!(body["chat_template_kwargs"]["enable_thinking"], false);
        assert_eq!(body["tools"][0]["type"], "function");
        let cont = PickRequest { chat_json: r#"{"messages":[],"continue_final_message":true}"#.into(), ..req.clone() };
        assert_eq!(request_body(&cont).unwrap()["add_generation_prompt"], false);
    }

    #[test]
    fn text_anthropic_and_bad_inputs() {
        let text = PickRequest { model: "m".into(), prompt_text: "once".into(), ..Default::default() };
        assert_eq!(request_body(&text).unwrap(), json!({"model": "m", "prompt": "once"}));
        let anthropic = PickRequest {
            model: "m".into(),
            endpoint: Endpoint::Messages as i32,
            chat_json: r#"{"system":"be brief","messages":[{"role":"user","content":"q"}]}"#.into(),
            ..Default::default()
        };
        let body = request_body(&anthropic).unwrap();
        assert_eq!(body["messages"][0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(body["messages"][1]["role"], "user");
        for bad in ["not json", "[]", r#"{"tools":[]}"#] {
            let req = PickRequest { chat_json: bad.into(), ..Default::default() };
            assert_eq!(request_body(&req), Err(TokenizeFailure::Input), "{bad}");
        }
        assert_eq!(request_body(&PickRequest::default()), Err(TokenizeFailure::Input));
    }

    #[test]
    fn responses_prompts_are_not_sent_to_a_worker() {
        let req = PickRequest {
            model: "m".into(),
            endpoint: Endpoint::Responses as i32,
            chat_json: r#"{"input":[{"role":"user","content":[{"type":"input_text","text":"q"}]}],"instructions":"s"}"#.into(),
            ..Default::default()
        };
        assert_eq!(request_body(&req), Err(TokenizeFailure::Template));
        let string_input = PickRequest { chat_json: r#"{"input":"q"}"#.into(), ..req };
        assert_eq!(request_body(&string_input), Err(TokenizeFailure::Template));
    }

    #[test]
    fn urls_and_answers() {
        let mut w = WorkerConfig::new("a", "m");
        assert_eq!(tokenize_url(&w), None);
        w.metrics_url = Some("http://h:8000/metrics".into());
        assert_eq!(tokenize_url(&w).as_deref(), Some("http://h:8000/tokenize"));
        w.endpoint = "10.0.0.1:8001".into();
        assert_eq!(tokenize_url(&w).as_deref(), Some("http://10.0.0.1:8001/tokenize"));
        assert_eq!(parse_tokens(&json!({"count": 2, "tokens": [1, 2]})), Some(vec![1, 2]));
        assert_eq!(parse_tokens(&json!({"tokens": [-1]})), None);
        assert_eq!(parse_tokens(&json!({"error": "x"})), None);
    }
}
