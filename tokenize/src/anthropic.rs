//! Anthropic `/v1/messages` -> the OpenAI-style chat messages the worker renders.
//!
//! Assumption: workers serve `/v1/messages` with vLLM's own Anthropic endpoint, which converts
//! the request to a chat-completions request and renders that. This mirrors vLLM 0.33's
//! `AnthropicServingMessages.to_chat_completion_request` (`entrypoints/anthropic/serving.py`):
//! - `system` (a string, or text blocks concatenated with no separator; blocks starting with
//!   `x-anthropic-billing-header` dropped) becomes one leading system message. When the chat
//!   template rejects non-leading system messages (probed once per template, as vLLM does),
//!   inline `role: system` messages are merged into it too.
//! - Content blocks: non-empty `text` -> text parts (a single text part becomes string content),
//!   `image` -> an image part (counted, no text), `thinking` -> the message's `reasoning`,
//!   `tool_use` -> `tool_calls` (arguments = JSON of `input`), `redacted_thinking` and
//!   `tool_reference` ignored. A user's `tool_result` becomes a `tool` message placed *before*
//!   that user message (text items joined with `"\n"`; images become a following user message),
//!   and a user message left without content is dropped.
//! - Tools become `{"type": "function", "function": {name, description, parameters:
//!   input_schema, strict, defer_loading}}`.
//!
//! The result then goes through the same vLLM normalization as any chat request (`openai`).
//! Not reproduced: `thinking: {type: disabled}` (vLLM then sets `enable_thinking=false`, which
//! only changes the generation prompt), `tool_addition`/`tool_removal` blocks and
//! `tool_result` inside assistant turns (both [`TokenizeError::Unsupported`]).

use crate::error::{input, TokenizeError};
use serde_json::{json, Map, Value as Json};

/// How `/v1/messages` requests are rendered (config).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum AnthropicRendering {
    /// Workers run vLLM's `/v1/messages` endpoint: mirror its conversion.
    #[default]
    Vllm,
    /// No exact tokens for Anthropic requests ([`TokenizeError::Unsupported`]); the router
    /// falls back to approximate keys.
    Disabled,
}

const BILLING_HEADER: &str = "x-anthropic-billing-header";

fn text_of(block: &Json) -> Option<&str> {
    (block.get("type").and_then(Json::as_str) == Some("text")).then(|| block.get("text").and_then(Json::as_str)).flatten().filter(|t| !t.is_empty())
}

/// Text of a system message (or `None`), billing headers dropped.
fn system_text(content: &Json) -> Option<String> {
    match content {
        Json::String(s) if s.starts_with(BILLING_HEADER) => None,
        Json::String(s) => Some(s.clone()),
        Json::Array(blocks) => {
            let parts: Vec<&str> = blocks.iter().filter_map(text_of).filter(|t| !t.starts_with(BILLING_HEADER)).collect();
            (!parts.is_empty()).then(|| parts.concat())
        }
        _ => None,
    }
}

/// Converts an Anthropic template input (`system`, `messages`, `tools`) into OpenAI messages
/// and tools.
pub fn convert(body: &Map<String, Json>, merge_inline_system: bool) -> Result<(Vec<Json>, Option<Vec<Json>>), TokenizeError> {
    let messages = body.get("messages").and_then(Json::as_array).ok_or_else(|| input("messages must be an array"))?;
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut system_parts: Vec<String> = Vec::new();
    match body.get("system") {
        Some(Json::String(s)) if !s.is_empty() => system_parts.push(s.clone()),
        Some(Json::Array(blocks)) => system_parts.extend(blocks.iter().filter_map(text_of).filter(|t| !t.starts_with(BILLING_HEADER)).map(str::to_string)),
        _ => {}
    }
    if merge_inline_system {
        let inline = messages.iter().filter(|m| m.get("role").and_then(Json::as_str) == Some("system"));
        system_parts.extend(inline.filter_map(|m| m.get("content").and_then(system_text)));
    }
    if !system_parts.is_empty() {
        out.push(json!({"role": "system", "content": system_parts.concat()}));
    }
    for msg in messages {
        convert_message(msg, merge_inline_system, &mut out)?;
    }
    let tools = match body.get("tools") {
        None | Some(Json::Null) => None,
        Some(Json::Array(list)) => Some(list.iter().map(convert_tool).collect::<Result<Vec<_>, _>>()?),
        Some(_) => return Err(input("tools must be an array")),
    };
    Ok((out, tools))
}

fn convert_message(msg: &Json, merge_inline_system: bool, out: &mut Vec<Json>) -> Result<(), TokenizeError> {
    let role = msg.get("role").and_then(Json::as_str).ok_or_else(|| input("each message needs a string role"))?;
    let content = msg.get("content").ok_or_else(|| input("each message needs content"))?;
    if role == "system" {
        if !merge_inline_system {
            if let Some(text) = system_text(content) {
                out.push(json!({"role": "system", "content": text}));
            }
        }
        return Ok(());
    }
    let mut m = Map::new();
    m.insert("role".into(), json!(role));
    match content {
        Json::String(s) => {
            m.insert("content".into(), json!(s));
        }
        Json::Array(blocks) => convert_blocks(blocks, role, &mut m, out)?,
        _ => return Err(input("message content must be a string or a list of blocks")),
    }
    if role != "user" || m.contains_key("content") {
        out.push(Json::Object(m));
    }
    Ok(())
}

fn convert_blocks(blocks: &[Json], role: &str, m: &mut Map<String, Json>, out: &mut Vec<Json>) -> Result<(), TokenizeError> {
    let mut parts: Vec<Json> = Vec::new();
    let mut calls: Vec<Json> = Vec::new();
    let mut reasoning: Vec<&str> = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Json::as_str) {
            Some("text") => {
                if let Some(t) = text_of(block) {
                    parts.push(json!({"type": "text", "text": t}));
                }
            }
            Some("image") => {
                if block.get("source").is_some_and(|s| !s.is_null()) {
                    parts.push(json!({"type": "image_url", "image_url": {"url": ""}}));
                }
            }
            Some("thinking") => reasoning.extend(block.get("thinking").and_then(Json::as_str)),
            Some("redacted_thinking" | "tool_reference") => {}
            Some("tool_use") => calls.push(tool_call(block)?),
            Some("tool_result") if role == "user" => tool_result(block, out)?,
            Some("tool_result") => return Err(TokenizeError::Unsupported("tool_result outside a user message".into())),
            Some(other) => return Err(TokenizeError::Unsupported(format!("content block type {other:?}"))),
            None => return Err(input("content block without a type")),
        }
    }
    if !reasoning.is_empty() {
        m.insert("reasoning".into(), json!(reasoning.concat()));
    }
    if !calls.is_empty() {
        m.insert("tool_calls".into(), Json::Array(calls));
    }
    if parts.len() == 1 && parts[0].get("type").and_then(Json::as_str) == Some("text") {
        m.insert("content".into(), parts[0]["text"].clone());
    } else if !parts.is_empty() {
        m.insert("content".into(), Json::Array(parts));
    }
    Ok(())
}

/// vLLM serializes `input` with `json.dumps` and parses it back before rendering; only the
/// parsed object matters. A missing id would be time-based in vLLM; Qwen3 never renders ids.
fn tool_call(block: &Json) -> Result<Json, TokenizeError> {
    let input_obj = match block.get("input") {
        None | Some(Json::Null) => json!({}),
        Some(v @ Json::Object(_)) => v.clone(),
        Some(_) => return Err(input("tool_use input must be an object")),
    };
    let id = block.get("id").and_then(Json::as_str).filter(|s| !s.is_empty()).unwrap_or("call_0");
    let name = block.get("name").and_then(Json::as_str).unwrap_or("");
    let arguments = serde_json::to_string(&input_obj).map_err(|e| TokenizeError::Json(e.to_string()))?;
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}))
}

fn tool_result(block: &Json, out: &mut Vec<Json>) -> Result<(), TokenizeError> {
    let id = block.get("tool_use_id").and_then(Json::as_str).unwrap_or("");
    let mut images = 0usize;
    let mut refs: Vec<Json> = Vec::new();
    let text = match block.get("content") {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Array(items)) => {
            let mut texts: Vec<&str> = Vec::new();
            for item in items.iter().filter(|i| i.is_object()) {
                match item.get("type").and_then(Json::as_str) {
                    Some("text") => texts.push(item.get("text").and_then(Json::as_str).unwrap_or("")),
                    Some("image") => images += 1,
                    Some("tool_reference") => {
                        if let Some(n) = item.get("tool_name").or_else(|| item.get("name")).and_then(Json::as_str).filter(|n| !n.is_empty()) {
                            refs.push(json!({"type": "tool_reference", "name": n}));
                        }
                    }
                    _ => {}
                }
            }
            texts.join("\n")
        }
        _ => String::new(),
    };
    out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    if images > 0 {
        let parts: Vec<Json> = (0..images).map(|_| json!({"type": "image_url", "image_url": {"url": ""}})).collect();
        out.push(json!({"role": "user", "content": parts}));
    }
    if !refs.is_empty() {
        out.push(json!({"role": "tool", "tool_call_id": id, "content": refs}));
    }
    Ok(())
}

fn convert_tool(tool: &Json) -> Result<Json, TokenizeError> {
    let name = tool.get("name").and_then(Json::as_str).ok_or_else(|| input("tool needs a string name"))?;
    let get = |k: &str| tool.get(k).cloned().unwrap_or(Json::Null);
    Ok(json!({"type": "function", "function": {
        "name": name, "description": get("description"), "parameters": get("input_schema"),
        "strict": get("strict"), "defer_loading": get("defer_loading"),
    }}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Json) -> Map<String, Json> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn tool_results_precede_their_user_message() {
        let (msgs, _) = convert(
            &body(json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}, {"type": "text", "text": "next"}]}]})),
            false,
        )
        .unwrap();
        assert_eq!(msgs, vec![json!({"role": "tool", "tool_call_id": "t", "content": "r"}), json!({"role": "user", "content": "next"})]);
    }

    #[test]
    fn inline_system_merges_only_when_asked() {
        let b = body(json!({"system": "a", "messages": [{"role": "user", "content": "u"}, {"role": "system", "content": "b"}]}));
        assert_eq!(convert(&b, true).unwrap().0, vec![json!({"role": "system", "content": "ab"}), json!({"role": "user", "content": "u"})]);
        assert_eq!(convert(&b, false).unwrap().0.len(), 3);
    }

    #[test]
    fn unsupported_blocks_are_errors() {
        let b = body(json!({"messages": [{"role": "user", "content": [{"type": "tool_addition", "tool": {}}]}]}));
        assert!(matches!(convert(&b, false), Err(TokenizeError::Unsupported(_))));
        assert!(convert(&body(json!({"messages": 1})), false).is_err());
    }
}
