//! OpenAI chat messages and tools -> what vLLM hands to `apply_chat_template`.
//!
//! vLLM does not render the request's messages as sent. Mirrored here from vLLM 0.33
//! (`renderers/chat_utils/chat_message.py`, `renderers/hf.py`, `FunctionDefinition`):
//! - Each message is rebuilt as `{role, content}` plus, for assistants, `tool_calls` and
//!   `reasoning` (copied to `reasoning_content`), for tools `tool_call_id`, and `name`/`task`
//!   when they are strings; every other key is dropped.
//! - Content in the "string" content format (templates that read `message.content` as a
//!   string, like Qwen3's): text parts (`text`, `input_text`, `output_text`, `refusal`,
//!   `thinking`, plain strings, `tool_reference` names) joined with `"\n"`; `null` becomes `""`.
//!   In the "openai" format (templates that loop over content parts) parts stay a list of
//!   `{"type": "text", "text"}` / `{"type": "<modality>"}`.
//! - Media parts (images, audio, video, embeddings) are counted and contribute no text. vLLM
//!   would insert the model's placeholder tokens (or reject the request for a text-only model),
//!   so a prompt with media is not exact; callers see the count in [`Normalized::media_items`].
//! - Claude Code's `x-anthropic-billing-header` line is dropped from system text.
//! - Assistant `tool_calls[].function.arguments` strings are parsed into objects (invalid or
//!   non-object JSON becomes `{}`), so templates `tojson` them; an empty `tool_calls` is removed.
//! - `developer` messages become `system` (merged into one leading system message) when the
//!   template does not mention the developer role.
//! - Tools are re-serialized as vLLM's pydantic models dump them:
//!   `{"type", "function": {"name", "description", "parameters", ["strict"], ["defer_loading"]}}`,
//!   with `description`/`parameters` present (possibly `null`) and unknown keys dropped.

use crate::error::{input, TokenizeError};
use serde_json::{json, Map, Value as Json};

/// How message content reaches the template (vLLM's `--chat-template-content-format`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum ContentFormat {
    /// Decide from the template text (see [`ContentFormat::detect`]).
    #[default]
    Auto,
    String,
    OpenAi,
}

impl ContentFormat {
    /// `Auto` decided for `template`; other formats as they are.
    pub fn resolve(self, template: &str) -> ContentFormat {
        if self == ContentFormat::Auto {
            ContentFormat::detect(template)
        } else {
            self
        }
    }

    /// vLLM walks the template's AST for a loop over a message's content. This approximates it
    /// textually: a `for` over `...content` / `...['content']` means "openai".
    pub fn detect(template: &str) -> ContentFormat {
        let compact: String = template.chars().filter(|c| !c.is_whitespace()).collect();
        let loops_over_content = compact.split("{%-for").chain(compact.split("{%for")).skip(1).any(|rest| {
            let head = rest.split("%}").next().unwrap_or("").trim_end_matches('-');
            head.ends_with(".content") || head.ends_with("['content']") || head.ends_with("[\"content\"]")
        });
        if loops_over_content {
            ContentFormat::OpenAi
        } else {
            ContentFormat::String
        }
    }
}

/// Messages ready for the template, and how many media items were left out of the text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Normalized {
    pub messages: Vec<Json>,
    pub media_items: usize,
}

const BILLING_HEADER: &str = "x-anthropic-billing-header";
const MEDIA_PARTS: [(&str, &str); 10] = [
    ("image_url", "image"),
    ("input_image", "image"),
    ("image_pil", "image"),
    ("image_embeds", "image"),
    ("audio_url", "audio"),
    ("input_audio", "audio"),
    ("audio_embeds", "audio"),
    ("video_url", "video"),
    ("video_embeds", "video"),
    ("prompt_embeds", "prompt_embeds"),
];

enum Part {
    Text(String),
    Media(&'static str),
}

fn parse_part(part: &Json) -> Result<Option<Part>, TokenizeError> {
    let obj = match part {
        Json::String(s) => return Ok(Some(Part::Text(s.clone()))),
        Json::Object(o) => o,
        _ => return Err(input("content parts must be strings or objects")),
    };
    let text_field = match obj.get("type").and_then(Json::as_str) {
        Some("text" | "input_text" | "output_text") => "text",
        Some("refusal") => "refusal",
        Some("thinking") => "thinking",
        Some("tool_reference") => "name",
        Some(t) => match MEDIA_PARTS.iter().find(|(name, _)| *name == t) {
            Some((_, modality)) => return Ok(Some(Part::Media(modality))),
            None => return Err(TokenizeError::Unsupported(format!("content part type {t:?}"))),
        },
        None if obj.contains_key("image_url") => return Ok(Some(Part::Media("image"))),
        None if obj.contains_key("audio_url") || obj.contains_key("input_audio") => return Ok(Some(Part::Media("audio"))),
        None => return Err(input("content part without a type")),
    };
    Ok(obj.get(text_field).and_then(Json::as_str).map(|s| Part::Text(s.to_string())))
}

/// vLLM's `_strip_claude_code_billing_header`: drop the header line, keep what follows it.
fn strip_billing(parts: Vec<Part>) -> Vec<Part> {
    parts
        .into_iter()
        .filter_map(|p| match p {
            Part::Text(t) if t.starts_with(BILLING_HEADER) => {
                let rest = t.split_once('\n').map(|(_, r)| r).unwrap_or("");
                (!rest.is_empty()).then(|| Part::Text(rest.to_string()))
            }
            p => Some(p),
        })
        .collect()
}

fn content_parts(content: Option<&Json>) -> Result<Vec<Part>, TokenizeError> {
    match content {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::String(s)) => Ok(vec![Part::Text(s.clone())]),
        Some(Json::Array(parts)) => Ok(parts.iter().map(parse_part).collect::<Result<Vec<_>, _>>()?.into_iter().flatten().collect()),
        Some(_) => Err(input("message content must be a string, a list of parts, or null")),
    }
}

fn render_content(parts: Vec<Part>, format: ContentFormat, media: &mut usize) -> Json {
    *media += parts.iter().filter(|p| matches!(p, Part::Media(_))).count();
    if format == ContentFormat::OpenAi {
        let list = parts
            .into_iter()
            .map(|p| match p {
                Part::Text(t) => json!({"type": "text", "text": t}),
                Part::Media(m) => json!({"type": m}),
            })
            .collect();
        return Json::Array(list);
    }
    let texts: Vec<String> = parts.into_iter().filter_map(|p| if let Part::Text(t) = p { Some(t) } else { None }).collect();
    Json::String(texts.join("\n"))
}

fn message(m: &Json, format: ContentFormat, media: &mut usize) -> Result<Json, TokenizeError> {
    let Json::Object(obj) = m else {
        return Err(input("each message must be an object"));
    };
    let role = obj.get("role").and_then(Json::as_str).ok_or_else(|| input("each message needs a string role"))?;
    let mut parts = content_parts(obj.get("content"))?;
    if role == "system" {
        parts = strip_billing(parts);
    }
    let mut out = Map::new();
    out.insert("role".into(), Json::String(role.into()));
    out.insert("content".into(), render_content(parts, format, media));
    match role {
        "assistant" => {
            if let Some(calls) = obj.get("tool_calls").filter(|c| !c.is_null()) {
                out.insert("tool_calls".into(), calls.clone());
            }
            if let Some(r) = obj.get("reasoning").filter(|r| !r.is_null()) {
                out.insert("reasoning".into(), r.clone());
                out.insert("reasoning_content".into(), r.clone());
            }
        }
        "tool" => {
            if let Some(id) = obj.get("tool_call_id") {
                out.insert("tool_call_id".into(), id.clone());
            }
            if let Some(Json::Array(list)) = out.get("content") {
                if list.iter().all(|p| p.get("type").and_then(Json::as_str) == Some("text")) {
                    let texts: Vec<&str> = list.iter().filter_map(|p| p.get("text").and_then(Json::as_str)).collect();
                    out.insert("content".into(), Json::String(texts.join("\n")));
                }
            }
        }
        _ => {}
    }
    for key in ["name", "task"] {
        if let Some(v @ Json::String(_)) = obj.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    if role == "developer" {
        out.insert("tools".into(), obj.get("tools").cloned().unwrap_or(Json::Null));
    }
    Ok(Json::Object(out))
}

/// Python truthiness of a JSON value.
fn truthy(v: &Json) -> bool {
    match v {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Json::String(s) => !s.is_empty(),
        Json::Array(a) => !a.is_empty(),
        Json::Object(o) => !o.is_empty(),
    }
}

/// vLLM's `_postprocess_messages`: tool-call arguments become objects.
fn postprocess_tool_calls(m: &mut Map<String, Json>) -> Result<(), TokenizeError> {
    let Some(Json::Array(calls)) = m.get_mut("tool_calls") else {
        return Ok(());
    };
    if calls.is_empty() {
        m.remove("tool_calls");
        return Ok(());
    }
    for call in calls.iter_mut() {
        let Json::Object(call) = call else {
            return Err(input("assistant tool_calls entries must be objects"));
        };
        let is_function = call.get("type").and_then(Json::as_str).unwrap_or("function") == "function";
        let Some(Json::Object(function)) = call.get_mut("function").filter(|_| is_function) else {
            return Err(input("assistant tool_calls must be of type 'function' with a function object"));
        };
        let parsed = match function.get("arguments") {
            Some(a) if truthy(a) => match a {
                Json::Object(_) => a.clone(),
                Json::String(s) => serde_json::from_str::<Json>(s).ok().filter(Json::is_object).unwrap_or_else(|| json!({})),
                _ => json!({}),
            },
            _ => json!({}),
        };
        function.insert("arguments".into(), parsed);
    }
    Ok(())
}

/// vLLM's developer -> system conversion and system consolidation, for templates that do not
/// know the developer role.
fn developer_to_system(messages: Vec<Json>) -> Vec<Json> {
    let mut systems: Vec<String> = Vec::new();
    let mut rest = Vec::new();
    let mut consolidate = false;
    for (i, mut m) in messages.into_iter().enumerate() {
        if m.get("role").and_then(Json::as_str) == Some("developer") {
            if let Json::Object(o) = &mut m {
                o.insert("role".into(), json!("system"));
                o.shift_remove("tools");
            }
        }
        if m.get("role").and_then(Json::as_str) != Some("system") {
            rest.push(m);
            continue;
        }
        consolidate |= i > 0 || !systems.is_empty();
        let text = match m.get("content") {
            Some(Json::String(s)) => s.clone(),
            Some(Json::Array(parts)) => parts.iter().filter_map(|p| p.as_str().or_else(|| p.get("text").and_then(Json::as_str))).collect::<Vec<_>>().join("\n"),
            _ => String::new(),
        };
        if !text.is_empty() {
            systems.push(text);
        }
        rest.push(m);
    }
    if !consolidate {
        return rest;
    }
    let mut out = vec![json!({"role": "system", "content": systems.join("\n\n")})];
    out.extend(rest.into_iter().filter(|m| m.get("role").and_then(Json::as_str) != Some("system")));
    out
}

/// One message as [`normalize_messages`] normalizes it, except for the developer -> system
/// conversion, which looks at the whole conversation. `format` must be resolved.
pub(crate) fn normalize_message(m: &Json, format: ContentFormat, media: &mut usize) -> Result<Json, TokenizeError> {
    let mut msg = message(m, format, media)?;
    if let Json::Object(o) = &mut msg {
        if o.get("role").and_then(Json::as_str) == Some("assistant") {
            postprocess_tool_calls(o)?;
        }
    }
    Ok(msg)
}

/// Normalizes OpenAI chat `messages` as vLLM does before rendering.
pub fn normalize_messages(messages: &[Json], format: ContentFormat, template: &str) -> Result<Normalized, TokenizeError> {
    let format = format.resolve(template);
    let mut media_items = 0;
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        out.push(normalize_message(m, format, &mut media_items)?);
    }
    let has_developer = out.iter().any(|m| m.get("role").and_then(Json::as_str) == Some("developer"));
    if has_developer && !template.contains("\"developer\"") && !template.contains("'developer'") {
        out = developer_to_system(out);
    }
    Ok(Normalized { messages: out, media_items })
}

/// Tools as vLLM's `ChatCompletionToolsParam.model_dump()` produces them.
pub fn normalize_tools(tools: &[Json]) -> Result<Vec<Json>, TokenizeError> {
    tools.iter().map(normalize_tool).collect()
}

fn normalize_tool(tool: &Json) -> Result<Json, TokenizeError> {
    let obj = tool.as_object().ok_or_else(|| input("tools must be objects"))?;
    if obj.get("type").is_some_and(|t| t.as_str() != Some("function")) {
        return Err(input("tools must be of type 'function'"));
    }
    let f = obj.get("function").and_then(Json::as_object).ok_or_else(|| input("tool needs a function object"))?;
    let name = f.get("name").and_then(Json::as_str).ok_or_else(|| input("tool function needs a string name"))?;
    let description = f.get("description").cloned().unwrap_or(Json::Null);
    if !(description.is_null() || description.is_string()) {
        return Err(input("tool description must be a string"));
    }
    let parameters = f.get("parameters").cloned().unwrap_or(Json::Null);
    if !(parameters.is_null() || parameters.is_object()) {
        return Err(input("tool parameters must be an object"));
    }
    let top_defer = obj.get("defer_loading").filter(|v| !v.is_null());
    let mut func = Map::new();
    func.insert("name".into(), json!(name));
    func.insert("description".into(), description);
    func.insert("parameters".into(), parameters);
    if let Some(s) = f.get("strict").filter(|v| !v.is_null()) {
        func.insert("strict".into(), s.clone());
    }
    if let Some(d) = f.get("defer_loading").filter(|v| !v.is_null()).or(top_defer) {
        func.insert("defer_loading".into(), d.clone());
    }
    let mut out = Map::new();
    out.insert("type".into(), json!("function"));
    out.insert("function".into(), Json::Object(func));
    if let Some(d) = top_defer {
        out.insert("defer_loading".into(), d.clone());
    }
    Ok(Json::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_content_format() {
        assert_eq!(ContentFormat::detect("{% for m in messages %}{{ m.content }}{% endfor %}"), ContentFormat::String);
        assert_eq!(ContentFormat::detect("{%- for part in message['content'] -%}{{ part.text }}{% endfor %}"), ContentFormat::OpenAi);
        assert_eq!(ContentFormat::detect("{% for c in m.content %}{% endfor %}"), ContentFormat::OpenAi);
    }

    #[test]
    fn openai_format_keeps_parts_and_counts_media() {
        let msgs = vec![json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]})];
        let n = normalize_messages(&msgs, ContentFormat::OpenAi, "").unwrap();
        assert_eq!(n.media_items, 1);
        assert_eq!(n.messages[0]["content"], json!([{"type": "text", "text": "a"}, {"type": "image"}]));
        let s = normalize_messages(&msgs, ContentFormat::String, "").unwrap();
        assert_eq!(s.messages[0]["content"], json!("a"));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for bad in [json!(1), json!({"content": "x"}), json!({"role": "user", "content": 5}), json!({"role": "user", "content": [{"type": "weird"}]})] {
            assert!(normalize_messages(&[bad], ContentFormat::String, "").is_err());
        }
        assert!(normalize_tools(&[json!({"type": "function", "function": {"name": 3}})]).is_err());
        assert!(normalize_tools(&[json!("x")]).is_err());
    }

    #[test]
    fn tools_dump_like_pydantic() {
        let t = normalize_tools(&[json!({"function": {"parameters": {"b": 1, "a": 2}, "name": "f", "x": 1}, "defer_loading": true})]).unwrap();
        assert_eq!(serde_json::to_string(&t[0]).unwrap(), r#"{"type":"function","function":{"name":"f","description":null,"parameters":{"b":1,"a":2},"defer_loading":true},"defer_loading":true}"#);
    }
}
