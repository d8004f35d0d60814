//! OpenAI Responses `/v1/responses` -> the chat messages and tools vLLM renders.
//!
//! Assumption: workers serve `/v1/responses` with vLLM 0.33's own endpoint, on a model that is
//! not gpt-oss (Harmony is not reproduced). vLLM then builds chat messages from the request
//! (`entrypoints/openai/responses/utils.py`: `construct_input_messages`,
//! `construct_chat_messages_with_tool_call`, `_construct_message_from_response_item`,
//! `construct_tool_dicts`), after pydantic has parsed `input` (`ResponsesRequest.input_item_parsing`
//! and the openai SDK's item types), and renders them exactly like a chat-completions request
//! (`renderers/online_renderer.py::render_responses` -> `preprocess_chat`). Mirrored here:
//! - `instructions` (non-empty) -> a leading system message. History (`previous`) follows:
//!   the previous request's messages *minus every system message* (instructions do not carry
//!   over), then one assistant message per content part of each `message` item of the
//!   previous response's `output` (its reasoning and function calls are skipped).
//! - `input` a string -> one user message. A list -> one message per item, except that an
//!   item may fold into the assistant message just before it (within this input only):
//!   `function_call` / `custom_tool_call` items append to its `tool_calls`, a `reasoning` item
//!   sets its `reasoning` if unset, an assistant `message` sets its `content` if unset.
//!   Otherwise each starts a new assistant message. An assistant message contributes only its
//!   *first* content part's text. `function_call_output` / `custom_tool_call_output` -> `tool`
//!   messages. A reasoning item contributes its first `content` text, else its first
//!   `summary` text; encrypted reasoning is refused. User/system/developer messages pass
//!   through as chat messages (their `input_text` parts join with `"\n"` as in chat).
//! - A namespaced call is named `<namespace>__<name>`; a custom tool call's arguments are
//!   `{"input": <payload>}`.
//! - Tools: `function` tools -> chat-completions tools (`name`, `description`, `parameters`,
//!   `strict`/`defer_loading` when set); `namespace` tools -> their function tools named
//!   `<namespace>__<name>`; `custom` tools -> a function taking one string `input`; every other
//!   tool type (web search, MCP, ...) is not shown to the model. No tools -> none.
//! - The last input item being an assistant message or reasoning item with status
//!   `in_progress`/`incomplete` continues that message (`continue_final_message`) instead of
//!   adding the generation prompt.
//! - `reasoning.effort` (if the filter forwards `reasoning`) acts as chat's `reasoning_effort`.
//!
//! Items vLLM would reject (unknown types, malformed items) are [`TokenizeError::Input`] or
//! [`TokenizeError::Unsupported`]. The result then goes through the chat normalization
//! ([`crate::openai`]).

use crate::error::{input, TokenizeError};
use serde_json::{json, Map, Value as Json};

fn str_field<'a>(item: &'a Map<String, Json>, key: &str, what: &str) -> Result<&'a str, TokenizeError> {
    item.get(key).and_then(Json::as_str).ok_or_else(|| input(format!("{what} needs a string {key}")))
}

fn opt_str<'a>(item: &'a Map<String, Json>, key: &str, what: &str) -> Result<Option<&'a str>, TokenizeError> {
    match item.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s)),
        Some(_) => Err(input(format!("{what} {key} must be a string"))),
    }
}

const STATUSES: [&str; 3] = ["in_progress", "completed", "incomplete"];

fn check_status(item: &Map<String, Json>, what: &str) -> Result<(), TokenizeError> {
    match item.get("status") {
        None | Some(Json::Null) => Ok(()),
        Some(Json::String(s)) if STATUSES.contains(&s.as_str()) => Ok(()),
        Some(_) => Err(input(format!("{what} status must be one of in_progress, completed, incomplete"))),
    }
}

/// vLLM 0.33 `construct_input_messages`: a Responses request's chat messages.
///
/// `previous`: the conversation it continues (`previous_response_id`): the messages this
/// function built for that request (vLLM's `msg_store`, as returned here) and that response's
/// `output` items (vLLM's `response_store`). With `store: false` vLLM keeps no messages: pass
/// an empty slice for them.
pub fn messages(instructions: Option<&str>, input_value: &Json, previous: Option<(&[Json], &[Json])>) -> Result<Vec<Json>, TokenizeError> {
    let mut out = Vec::new();
    if let Some(text) = instructions.filter(|s| !s.is_empty()) {
        out.push(json!({"role": "system", "content": text}));
    }
    if let Some((prev_messages, prev_output)) = previous {
        out.extend(prev_messages.iter().filter(|m| m.get("role").and_then(Json::as_str) != Some("system")).cloned());
        for item in prev_output {
            if item.get("type").and_then(Json::as_str) != Some("message") {
                continue;
            }
            let parts = item.get("content").and_then(Json::as_array).ok_or_else(|| input("an output message needs a content list"))?;
            for part in parts {
                let text = part.get("text").and_then(Json::as_str).ok_or_else(|| TokenizeError::Unsupported("an output message part without text (refusal)".into()))?;
                out.push(json!({"role": "assistant", "content": text}));
            }
        }
    }
    match input_value {
        Json::String(s) => out.push(json!({"role": "user", "content": s})),
        Json::Array(items) => out.extend(item_messages(items)?),
        _ => return Err(input("input must be a string or a list of items")),
    }
    Ok(out)
}

/// vLLM's `construct_chat_messages_with_tool_call`.
fn item_messages(items: &[Json]) -> Result<Vec<Json>, TokenizeError> {
    let mut out: Vec<Json> = Vec::with_capacity(items.len());
    for item in items {
        let Json::Object(item) = item else {
            return Err(input("input items must be objects"));
        };
        let prev = out.last_mut().and_then(Json::as_object_mut).filter(|m| m.get("role").and_then(Json::as_str) == Some("assistant"));
        if let Some(m) = item_message(item, prev)? {
            out.push(m);
        }
    }
    Ok(out)
}

/// What an item adds to the assistant message before it, or a new message.
enum Fold {
    ToolCall(Json),
    Reasoning(String),
    Content(String),
}

/// vLLM's `_construct_message_from_response_item`: a new message, or `None` when the item
/// folded into `prev` (the previous message, if it is an assistant's).
fn item_message(item: &Map<String, Json>, prev: Option<&mut Map<String, Json>>) -> Result<Option<Json>, TokenizeError> {
    let kind = item.get("type").and_then(Json::as_str);
    let role = item.get("role").and_then(Json::as_str);
    let fold = match kind {
        Some("function_call") => Fold::ToolCall(function_call(item)?),
        Some("custom_tool_call") => Fold::ToolCall(custom_tool_call(item)?),
        Some("reasoning") => Fold::Reasoning(reasoning(item)?),
        Some("function_call_output" | "custom_tool_call_output") => return tool_output(item).map(Some),
        Some("message") | None if role == Some("assistant") => match assistant_text(item, kind.is_some())? {
            Some(text) => Fold::Content(text),
            None => return Ok(Some(Json::Object(item.clone()))),
        },
        Some("message") | None if role.is_some() => return input_message(item).map(Some),
        Some(other) => return Err(TokenizeError::Unsupported(format!("input item type {other:?}"))),
        None => return Err(input("input item without a type or role")),
    };
    let (key, value) = match fold {
        Fold::ToolCall(call) => {
            if let Some(prev) = prev {
                match prev.get_mut("tool_calls") {
                    None | Some(Json::Null) => {
                        prev.insert("tool_calls".into(), json!([call]));
                        return Ok(None);
                    }
                    Some(Json::Array(calls)) => {
                        calls.push(call);
                        return Ok(None);
                    }
                    // vLLM logs a warning and starts a new message.
                    Some(_) => {}
                }
            }
            return Ok(Some(json!({"role": "assistant", "tool_calls": [call]})));
        }
        Fold::Reasoning(r) => ("reasoning", Json::String(r)),
        Fold::Content(c) => ("content", Json::String(c)),
    };
    if let Some(prev) = prev {
        if prev.get(key).is_none_or(Json::is_null) {
            prev.insert(key.into(), value);
            return Ok(None);
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    m.insert(key.into(), value);
    Ok(Some(Json::Object(m)))
}

/// A `function_call` item (openai's `ResponseFunctionToolCall`) as a chat tool call.
fn function_call(item: &Map<String, Json>) -> Result<Json, TokenizeError> {
    let what = "a function_call item";
    let arguments = str_field(item, "arguments", what)?;
    let call_id = str_field(item, "call_id", what)?;
    let name = str_field(item, "name", what)?;
    opt_str(item, "id", what)?;
    check_status(item, what)?;
    let name = match opt_str(item, "namespace", what)?.filter(|n| !n.is_empty()) {
        Some(ns) => format!("{ns}__{name}"),
        None => name.to_string(),
    };
    Ok(json!({"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"}))
}

/// A `custom_tool_call` item: its payload wrapped as the shim function's `input` argument.
fn custom_tool_call(item: &Map<String, Json>) -> Result<Json, TokenizeError> {
    let what = "a custom_tool_call item";
    let call_id = str_field(item, "call_id", what)?;
    let name = str_field(item, "name", what)?;
    let payload = str_field(item, "input", what)?;
    let arguments = serde_json::to_string(&json!({"input": payload})).map_err(|e| TokenizeError::Json(e.to_string()))?;
    Ok(json!({"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"}))
}

/// A `reasoning` item's text: its first content text, else its first summary text.
fn reasoning(item: &Map<String, Json>) -> Result<String, TokenizeError> {
    let what = "a reasoning item";
    let texts = |key: &str, part_type: &str| -> Result<Vec<String>, TokenizeError> {
        match item.get(key) {
            None | Some(Json::Null) if key == "content" => Ok(Vec::new()),
            Some(Json::Array(parts)) => parts
                .iter()
                .map(|p| match (p.get("type").and_then(Json::as_str), p.get("text").and_then(Json::as_str)) {
                    (Some(t), Some(text)) if t == part_type => Ok(text.to_string()),
                    _ => Err(input(format!("{what} {key} parts need type {part_type} and a string text"))),
                })
                .collect(),
            _ => Err(input(format!("{what} needs a {key} list"))),
        }
    };
    let summary = texts("summary", "summary_text")?;
    let content = texts("content", "reasoning_text")?;
    check_status(item, what)?;
    if opt_str(item, "encrypted_content", what)?.is_some_and(|e| !e.is_empty()) {
        return Err(TokenizeError::Unsupported("encrypted reasoning content".into()));
    }
    Ok(content.into_iter().next().or_else(|| summary.into_iter().next()).unwrap_or_default())
}

/// A `function_call_output` / `custom_tool_call_output` item -> a tool message.
fn tool_output(item: &Map<String, Json>) -> Result<Json, TokenizeError> {
    let what = "a tool call output item";
    let call_id = str_field(item, "call_id", what)?;
    let output = match item.get("output") {
        Some(o @ (Json::String(_) | Json::Array(_))) => o.clone(),
        _ => return Err(input(format!("{what} needs an output string or list"))),
    };
    Ok(json!({"role": "tool", "content": output, "tool_call_id": call_id}))
}

/// An assistant message item's text, as vLLM takes it: string content, else the first
/// part's text. `None` (the item passes through as it is) for an input-style assistant
/// message whose first part has no text. `typed`: the item says `"type": "message"`, the
/// only way vLLM parses it as an output message (`output_text` parts).
fn assistant_text(item: &Map<String, Json>, typed: bool) -> Result<Option<String>, TokenizeError> {
    check_status(item, "an assistant message")?;
    match item.get("content") {
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(parts)) => {
            let kind = |p: &Json| p.get("type").and_then(Json::as_str).map(str::to_string);
            let kinds: Vec<Option<String>> = parts.iter().map(kind).collect();
            let output_style = kinds.iter().all(|k| matches!(k.as_deref(), Some("output_text" | "refusal")));
            let input_style = kinds.iter().all(|k| matches!(k.as_deref(), Some("input_text" | "input_image" | "input_file")));
            let Some(first) = parts.first() else {
                // A typed one is an output message whose `content[0]` vLLM reads (a server
                // error); an untyped one passes through.
                return if typed { Err(input("an assistant message needs content")) } else { Ok(None) };
            };
            let text = first.get("text").and_then(Json::as_str).map(str::to_string);
            if output_style && !typed {
                Err(input("an assistant message with output parts needs \"type\": \"message\""))
            } else if output_style {
                // openai's `ResponseOutputMessage`; vLLM reads `content[0].text`.
                match kinds[0].as_deref() {
                    Some("output_text") if text.is_some() => Ok(text),
                    _ => Err(TokenizeError::Unsupported("an assistant message starting with a refusal".into())),
                }
            } else if input_style {
                // An `EasyInputMessageParam`: `content[0].get("text")`, else the item as it is.
                Ok(text)
            } else {
                Err(input("assistant content parts must be all output parts or all input parts"))
            }
        }
        _ => Err(input("an assistant message needs string or list content")),
    }
}

/// A user/system/developer message item (openai's `EasyInputMessageParam` / `Message`) as
/// the chat message vLLM passes on.
fn input_message(item: &Map<String, Json>) -> Result<Json, TokenizeError> {
    let role = item.get("role").and_then(Json::as_str).unwrap_or("");
    if !matches!(role, "user" | "system" | "developer") {
        return Err(input(format!("input message role {role:?}")));
    }
    match item.get("content") {
        Some(Json::String(_)) => {}
        Some(Json::Array(parts)) => {
            for p in parts {
                match p.get("type").and_then(Json::as_str) {
                    Some("input_text") if p.get("text").is_some_and(Json::is_string) => {}
                    Some("input_image" | "input_file" | "input_audio") => {}
                    _ => return Err(input("input message parts must be input_text, input_image or input_file")),
                }
            }
        }
        _ => return Err(input("an input message needs string or list content")),
    }
    check_status(item, "an input message")?;
    Ok(Json::Object(item.clone()))
}

/// vLLM's `should_continue_final_message`: does the input end with a partial assistant
/// message (or reasoning) to continue?
pub fn continues_final_message(input_value: &Json) -> bool {
    let Some(last) = input_value.as_array().and_then(|items| items.last()) else {
        return false;
    };
    let kind = last.get("type").and_then(Json::as_str).unwrap_or("message");
    matches!(kind, "message" | "reasoning") && matches!(last.get("status").and_then(Json::as_str), Some("in_progress" | "incomplete"))
}

/// The function tool vLLM shows the model for a `custom` tool.
fn custom_tool_parameters() -> Json {
    json!({
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The freeform text payload for this tool."}},
        "required": ["input"],
        "additionalProperties": false,
    })
}

/// A function definition as `FunctionDefinition.model_dump()` writes it.
fn function_tool(tool: &Map<String, Json>, name: &str, parameters: Json) -> Result<Json, TokenizeError> {
    let what = "a function tool";
    let description = opt_str(tool, "description", what)?;
    if !(parameters.is_null() || parameters.is_object()) {
        return Err(input("tool parameters must be an object"));
    }
    let mut f = Map::new();
    f.insert("name".into(), json!(name));
    f.insert("description".into(), description.map_or(Json::Null, |d| json!(d)));
    f.insert("parameters".into(), parameters);
    for key in ["strict", "defer_loading"] {
        match tool.get(key) {
            None | Some(Json::Null) => {}
            Some(b @ Json::Bool(_)) => {
                f.insert(key.into(), b.clone());
            }
            Some(_) => return Err(input(format!("tool {key} must be a boolean"))),
        }
    }
    Ok(json!({"type": "function", "function": Json::Object(f)}))
}

/// vLLM's `construct_tool_dicts`: Responses tools -> chat-completions tools (None when absent).
pub fn tools(tools: Option<&Json>) -> Result<Option<Vec<Json>>, TokenizeError> {
    let list = match tools {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::Array(list)) if list.is_empty() => return Ok(None),
        Some(Json::Array(list)) => list,
        Some(_) => return Err(input("tools must be an array")),
    };
    let mut out = Vec::new();
    for tool in list {
        let tool = tool.as_object().ok_or_else(|| input("tools must be objects"))?;
        match tool.get("type").and_then(Json::as_str) {
            Some("function") => {
                let name = str_field(tool, "name", "a function tool")?;
                out.push(function_tool(tool, name, tool.get("parameters").cloned().unwrap_or(Json::Null))?);
            }
            Some("namespace") => {
                let ns = str_field(tool, "name", "a namespace tool")?;
                str_field(tool, "description", "a namespace tool")?;
                let inner = tool.get("tools").and_then(Json::as_array).ok_or_else(|| input("a namespace tool needs a tools list"))?;
                for t in inner {
                    let t = t.as_object().ok_or_else(|| input("namespace tools must be objects"))?;
                    let name = str_field(t, "name", "a namespaced tool")?;
                    match t.get("type").and_then(Json::as_str) {
                        Some("function") => out.push(function_tool(t, &format!("{ns}__{name}"), t.get("parameters").cloned().unwrap_or(Json::Null))?),
                        Some("custom") => {}
                        _ => return Err(input("namespaced tools must be function or custom tools")),
                    }
                }
            }
            Some("custom") => {
                let name = str_field(tool, "name", "a custom tool")?;
                if tool.get("format").and_then(|f| f.get("type")).and_then(Json::as_str) == Some("grammar") {
                    return Err(TokenizeError::Unsupported("custom tools with a grammar format".into()));
                }
                let shim: Map<String, Json> = tool.iter().filter(|(k, _)| *k == "description").map(|(k, v)| (k.clone(), v.clone())).collect();
                out.push(function_tool(&shim, name, custom_tool_parameters())?);
            }
            Some(_) => {} // built-in tools: not rendered for the model
            None => return Err(input("tools need a type")),
        }
    }
    Ok(Some(out))
}

/// A Responses `template_input` (`input`, `instructions`, `tools`, `chat_template_kwargs`,
/// optionally `reasoning`) as the equivalent chat-completions template input: `messages`,
/// `tools`, `add_generation_prompt`, `continue_final_message`, `chat_template_kwargs`,
/// `reasoning_effort`. Rendering that as chat gives what vLLM's Responses endpoint renders;
/// a worker's `/tokenize` takes it as a chat request.
pub fn chat_template_input(obj: &Map<String, Json>, previous: Option<(&[Json], &[Json])>) -> Result<Map<String, Json>, TokenizeError> {
    let request_input = obj.get("input").ok_or_else(|| input("input is required"))?;
    let instructions = opt_str(obj, "instructions", "the request")?;
    let tools = tools(obj.get("tools"))?;
    let messages = messages(instructions, request_input, previous)?;
    let continues = continues_final_message(request_input);
    let mut out = Map::new();
    out.insert("messages".into(), Json::Array(messages));
    if let Some(tools) = tools {
        out.insert("tools".into(), Json::Array(tools));
    }
    out.insert("add_generation_prompt".into(), Json::Bool(!continues));
    out.insert("continue_final_message".into(), Json::Bool(continues));
    if let Some(k) = obj.get("chat_template_kwargs").filter(|k| !k.is_null()) {
        out.insert("chat_template_kwargs".into(), k.clone());
    }
    match obj.get("reasoning") {
        None | Some(Json::Null) => {}
        Some(Json::Object(r)) => {
            if let Some(effort) = opt_str(r, "effort", "reasoning")? {
                out.insert("reasoning_effort".into(), json!(effort));
            }
        }
        Some(_) => return Err(input("reasoning must be an object")),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(input: Json) -> Vec<Json> {
        messages(None, &input, None).unwrap()
    }

    #[test]
    fn string_input_and_instructions() {
        assert_eq!(
            messages(Some("be brief"), &json!("hi"), None).unwrap(),
            vec![json!({"role": "system", "content": "be brief"}), json!({"role": "user", "content": "hi"})]
        );
        assert_eq!(messages(Some(""), &json!("hi"), None).unwrap(), vec![json!({"role": "user", "content": "hi"})]);
        assert!(messages(None, &json!(3), None).is_err());
    }

    #[test]
    fn history_drops_system_and_keeps_only_output_messages() {
        let prev = [json!({"role": "system", "content": "old"}), json!({"role": "user", "content": "q1"})];
        let output = [
            json!({"type": "reasoning", "id": "rs", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]}),
            json!({"type": "message", "role": "assistant", "id": "m", "status": "completed",
                   "content": [{"type": "output_text", "text": "a1", "annotations": []}, {"type": "output_text", "text": "a2", "annotations": []}]}),
            json!({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}),
        ];
        let got = messages(Some("new"), &json!("q2"), Some((&prev, &output))).unwrap();
        assert_eq!(
            got,
            vec![
                json!({"role": "system", "content": "new"}),
                json!({"role": "user", "content": "q1"}),
                json!({"role": "assistant", "content": "a1"}),
                json!({"role": "assistant", "content": "a2"}),
                json!({"role": "user", "content": "q2"}),
            ]
        );
    }

    #[test]
    fn items_fold_into_the_previous_assistant_message() {
        let got = msgs(json!([
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}, {"type": "output_text", "text": "dropped"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "namespace": "ns", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "r1"},
            {"type": "function_call", "call_id": "c3", "name": "h", "arguments": "{}"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "u"}]},
        ]));
        assert_eq!(got.len(), 5, "{got:#?}");
        assert_eq!(got[1]["reasoning"], "s");
        assert_eq!(got[1]["content"], "x");
        assert_eq!(got[1]["tool_calls"][1]["function"]["name"], "ns__g");
        assert_eq!(got[2], json!({"role": "tool", "content": "r1", "tool_call_id": "c1"}));
        assert_eq!(got[3], json!({"role": "assistant", "tool_calls": [{"id": "c3", "function": {"name": "h", "arguments": "{}"}, "type": "function"}], "reasoning": "t"}));
        assert_eq!(got[4], json!({"role": "assistant", "reasoning": "u"}));
    }

    #[test]
    fn a_leading_call_starts_an_assistant_message_and_bad_items_fail() {
        assert_eq!(msgs(json!([{"type": "custom_tool_call", "call_id": "c", "name": "sh", "input": "ls"}]))[0]["tool_calls"][0]["function"]["arguments"], "{\"input\":\"ls\"}");
        for bad in [
            json!([{"type": "web_search_call", "id": "w"}]),
            json!([{"type": "reasoning", "summary": [], "encrypted_content": "e"}]),
            json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]),
            json!([{"role": "tool", "content": "x"}]),
            json!(["text"]),
        ] {
            assert!(messages(None, &bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn tools_become_chat_tools() {
        let t = tools(Some(&json!([
            {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true},
            {"type": "web_search_preview"},
            {"type": "namespace", "name": "ns", "description": "d", "tools": [{"type": "function", "name": "g"}]},
            {"type": "custom", "name": "sh", "description": "shell"},
        ])))
        .unwrap()
        .unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0], json!({"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}, "strict": true}}));
        assert_eq!(t[1]["function"]["name"], "ns__g");
        assert_eq!(t[2]["function"]["parameters"]["required"], json!(["input"]));
        assert_eq!(tools(Some(&json!([]))).unwrap(), None);
        assert_eq!(tools(None).unwrap(), None);
    }

    #[test]
    fn partial_assistant_message_is_continued() {
        let obj = json!({"input": [{"role": "user", "content": "q"}, {"type": "message", "role": "assistant", "status": "incomplete", "content": [{"type": "output_text", "text": "par"}]}]});
        let chat = chat_template_input(obj.as_object().unwrap(), None).unwrap();
        assert_eq!(chat["continue_final_message"], true);
        assert_eq!(chat["add_generation_prompt"], false);
        assert!(!continues_final_message(&json!("x")));
    }
}
