//! The prompt of each API's body: a completion's `prompt` (text, token ids, a batch), chat and
//! Anthropic `messages` with `system` and `tools`, Responses API `input` and `instructions`.

use super::{invalid, scan, Api, ParseError, Prompt, RawPrompt};
use serde_json::{Map, Value};
use std::fmt::Write as _;

/// A completions batch beyond its first prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Batch {
    pub(super) prompts: u32,
    /// At least the tokens of the prompts after the first (text: one per byte).
    pub(super) extra_tokens: u32,
}

impl Default for Batch {
    fn default() -> Self {
        Batch { prompts: 1, extra_tokens: 0 }
    }
}

impl Batch {
    fn of(items: &[Value], tokens: impl Fn(&Value) -> usize) -> Batch {
        let extra = items.iter().skip(1).map(tokens).fold(0u32, |sum, n| sum.saturating_add(u32::try_from(n).unwrap_or(u32::MAX)));
        Batch { prompts: u32::try_from(items.len()).unwrap_or(u32::MAX), extra_tokens: extra }
    }
}

pub(super) fn completion_prompt(raw: Option<RawPrompt>) -> Result<(Prompt, Batch), ParseError> {
    let RawPrompt { raw, tokens } = raw.ok_or(ParseError::Missing("prompt"))?;
    // The common case for exact routing: a flat array of token ids.
    if let Some(ids) = tokens.or_else(|| scan::token_array(raw)) {
        return Ok((Prompt::Tokens(ids), Batch::default()));
    }
    let prompt: Value = serde_json::from_slice(raw).map_err(|e| ParseError::NotJson(e.to_string()))?;
    let shape = || invalid("prompt", "must be a string, token ids, or a list of either");
    match &prompt {
        Value::String(s) => Ok((Prompt::Text(s.clone()), Batch::default())),
        Value::Array(items) => match items.first() {
            None => Err(invalid("prompt", "must not be empty")),
            Some(Value::String(s)) => {
                let texts = |v: &Value| v.as_str().map_or(0, str::len);
                if items.iter().any(|v| !v.is_string()) {
                    return Err(shape());
                }
                Ok((Prompt::Text(s.clone()), Batch::of(items, texts)))
            }
            Some(Value::Number(_)) => Ok((Prompt::Tokens(token_ids(items)?), Batch::default())),
            Some(Value::Array(first)) => {
                for item in items.iter().skip(1) {
                    token_ids(item.as_array().ok_or_else(shape)?)?;
                }
                let lists = |v: &Value| v.as_array().map_or(0, Vec::len);
                Ok((Prompt::Tokens(token_ids(first)?), Batch::of(items, lists)))
            }
            Some(_) => Err(shape()),
        },
        _ => Err(shape()),
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, ParseError> {
    items
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or(invalid("prompt", "token ids must be non-negative 32-bit integers"))
}

/// Fields a chat template may read besides `messages`.
const TEMPLATE_FIELDS: [&str; 5] = ["tools", "system", "add_generation_prompt", "continue_final_message", "chat_template_kwargs"];

pub(super) fn chat_prompt(api: Api, obj: &Map<String, Value>) -> Result<Prompt, ParseError> {
    let messages = match obj.get("messages") {
        Some(Value::Array(m)) => m,
        Some(_) => return Err(invalid("messages", "must be an array")),
        None => return Err(ParseError::Missing("messages")),
    };
    let mut canonical = String::new();
    if api == Api::Messages {
        if let Some(system) = obj.get("system") {
            canonical.push_str("system\n");
            push_content(&mut canonical, system);
            canonical.push_str("\n\n");
        }
    }
    for message in messages {
        let Value::Object(m) = message else {
            return Err(invalid("messages", "entries must be objects"));
        };
        let Some(Value::String(role)) = m.get("role") else {
            return Err(invalid("messages", "entries need a string `role`"));
        };
        canonical.push_str(role);
        canonical.push('\n');
        if let Some(content) = m.get("content") {
            push_content(&mut canonical, content);
        }
        if let Some(calls) = m.get("tool_calls") {
            let _ = write!(canonical, "{calls}");
        }
        canonical.push_str("\n\n");
    }
    let mut input = Map::new();
    input.insert("messages".into(), Value::Array(messages.clone()));
    for field in TEMPLATE_FIELDS {
        if let Some(v) = obj.get(field).filter(|v| !v.is_null()) {
            input.insert(field.into(), v.clone());
        }
    }
    Ok(Prompt::Chat { template_input: Value::Object(input).to_string(), canonical })
}

/// Fields of a Responses request the state service needs to build its messages.
const RESPONSES_FIELDS: [&str; 4] = ["input", "instructions", "tools", "chat_template_kwargs"];

pub(super) fn responses_prompt(obj: &Map<String, Value>) -> Result<Prompt, ParseError> {
    let input = obj.get("input").ok_or(ParseError::Missing("input"))?;
    let mut canonical = String::new();
    match obj.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            canonical.push_str("system\n");
            canonical.push_str(s);
            canonical.push_str("\n\n");
        }
        Some(_) => return Err(invalid("instructions", "must be a string")),
    }
    match input {
        Value::String(s) => {
            canonical.push_str("user\n");
            canonical.push_str(s);
            canonical.push_str("\n\n");
        }
        Value::Array(items) => {
            for item in items {
                let Value::Object(item) = item else {
                    return Err(invalid("input", "items must be objects"));
                };
                // A message item has a role; tool calls and their outputs have a type.
                let label = item.get("role").or_else(|| item.get("type")).and_then(Value::as_str).unwrap_or("item");
                canonical.push_str(label);
                canonical.push('\n');
                for field in ["content", "arguments", "output"] {
                    if let Some(v) = item.get(field) {
                        push_content(&mut canonical, v);
                    }
                }
                canonical.push_str("\n\n");
            }
        }
        _ => return Err(invalid("input", "must be a string or an array of items")),
    }
    let mut template = Map::new();
    for field in RESPONSES_FIELDS {
        if let Some(v) = obj.get(field).filter(|v| !v.is_null()) {
            template.insert(field.into(), v.clone());
        }
    }
    Ok(Prompt::Chat { template_input: Value::Object(template).to_string(), canonical })
}

/// Appends the text of OpenAI content (string or parts) or Anthropic blocks.
fn push_content(out: &mut String, content: &Value) {
    match content {
        Value::String(s) => out.push_str(s),
        Value::Array(parts) => {
            for part in parts {
                match part {
                    Value::String(s) => out.push_str(s),
                    Value::Object(p) => match p.get("type").and_then(Value::as_str) {
                        Some("text" | "input_text" | "output_text") => {
                            if let Some(t) = p.get("text").and_then(Value::as_str) {
                                out.push_str(t);
                            }
                        }
                        Some("tool_use") => {
                            let _ = write!(out, "{}", p.get("input").unwrap_or(&Value::Null));
                        }
                        Some("tool_result") => {
                            if let Some(c) = p.get("content") {
                                push_content(out, c);
                            }
                        }
                        // Images and other media: a stable marker, their bytes are not text.
                        Some(other) => {
                            let _ = write!(out, "<{other}>");
                        }
                        None => {}
                    },
                    _ => {}
                }
            }
        }
        Value::Null => {}
        other => {
            let _ = write!(out, "{other}");
        }
    }
}
