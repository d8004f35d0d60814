//! The filter's `template_input` JSON -> [`RenderInput`] for one API.
//!
//! `template_input` (see `kvroute_core::request::Prompt::Chat`) holds `messages` and, when the
//! client sent them, `tools`, `system` (Anthropic), `add_generation_prompt`,
//! `continue_final_message`, `chat_template_kwargs` (and `reasoning_effort`, if a future filter
//! forwards it). Defaults are vLLM's: `add_generation_prompt = true`,
//! `continue_final_message = false`. Template kwargs merge as vLLM merges them: server defaults,
//! then the request's `chat_template_kwargs`, then the request-level fields.
//!
//! A Responses `template_input` (`input`, `instructions`, `tools`, `chat_template_kwargs`) is
//! first turned into the chat input vLLM's Responses endpoint builds ([`responses`]); a
//! `previous_response_id` conversation's history is not in it (see
//! [`responses::chat_template_input`] for callers that have it).

use crate::anthropic::{self, AnthropicRendering};
use crate::chat::RenderInput;
use crate::error::{input, TokenizeError};
use crate::openai::{self, ContentFormat};
use crate::responses;
use kvroute_core::request::Api;
use serde_json::{Map, Value as Json};

/// Per-model rendering choices fixed at load time.
#[derive(Clone, Debug, Default)]
pub struct RenderSettings {
    pub content_format: ContentFormat,
    pub anthropic: AnthropicRendering,
    /// vLLM's `--default-chat-template-kwargs`.
    pub default_kwargs: Map<String, Json>,
    /// Whether the template rejects non-leading system messages (vLLM's probe).
    pub merge_inline_system: bool,
}

/// A request ready to render, and how many media items it had (not part of the text).
#[derive(Clone, Debug)]
pub struct ParsedChat {
    pub render: RenderInput,
    pub media_items: usize,
}

/// kwargs vLLM refuses or overrides from the request itself.
const RESERVED_KWARGS: [&str; 2] = ["chat_template", "tokenize"];
const OVERRIDDEN_KWARGS: [&str; 5] = ["add_generation_prompt", "continue_final_message", "documents", "messages", "tools"];

pub(crate) fn flag(obj: &Map<String, Json>, key: &str, default: bool) -> Result<bool, TokenizeError> {
    match obj.get(key) {
        None | Some(Json::Null) => Ok(default),
        Some(Json::Bool(b)) => Ok(*b),
        Some(_) => Err(input(format!("{key} must be a boolean"))),
    }
}

pub(crate) fn kwargs(obj: &Map<String, Json>, settings: &RenderSettings) -> Result<Map<String, Json>, TokenizeError> {
    let mut out = settings.default_kwargs.clone();
    match obj.get("chat_template_kwargs") {
        None | Some(Json::Null) => {}
        Some(Json::Object(k)) => {
            if let Some(bad) = RESERVED_KWARGS.iter().find(|r| k.contains_key(**r)) {
                return Err(input(format!("chat_template_kwargs must not set {bad}")));
            }
            // vLLM's `merge_kwargs` over the server defaults skips unset values (None, "auto").
            out.extend(k.iter().filter(|(_, v)| !v.is_null() && v.as_str() != Some("auto")).map(|(k, v)| (k.clone(), v.clone())));
        }
        Some(_) => return Err(input("chat_template_kwargs must be an object")),
    }
    let user_sets_thinking = matches!(obj.get("chat_template_kwargs"), Some(Json::Object(k)) if k.contains_key("enable_thinking"));
    for key in OVERRIDDEN_KWARGS {
        out.shift_remove(key);
    }
    if let Some(effort) = obj.get("reasoning_effort").and_then(Json::as_str).filter(|e| *e != "auto") {
        out.insert("reasoning_effort".into(), Json::String(effort.into()));
        if !user_sets_thinking {
            out.insert("enable_thinking".into(), Json::Bool(effort != "none"));
        }
    }
    Ok(out)
}

/// Parses `template_input` sent for `api` into what the chat template needs.
pub fn parse(template_input: &str, api: Api, template: &str, settings: &RenderSettings) -> Result<ParsedChat, TokenizeError> {
    let value: Json = serde_json::from_str(template_input).map_err(|e| TokenizeError::Json(e.to_string()))?;
    let Json::Object(mut obj) = value else {
        return Err(input("template input must be a JSON object"));
    };
    if api == Api::Responses {
        // vLLM builds chat messages from the Responses input, then renders them as chat.
        obj = responses::chat_template_input(&obj, None)?;
    }
    let (messages, tools) = match api {
        Api::ChatCompletions | Api::Responses => {
            let Some(Json::Array(messages)) = obj.shift_remove("messages") else {
                return Err(input("messages must be an array"));
            };
            let tools = match obj.shift_remove("tools") {
                None | Some(Json::Null) => None,
                Some(Json::Array(t)) => Some(t),
                Some(_) => return Err(input("tools must be an array")),
            };
            (messages, tools)
        }
        Api::Messages => match settings.anthropic {
            AnthropicRendering::Vllm => anthropic::convert(&obj, settings.merge_inline_system)?,
            AnthropicRendering::Disabled => return Err(TokenizeError::Unsupported("Anthropic rendering is disabled".into())),
        },
        Api::Completions => return Err(TokenizeError::Unsupported("completions prompts are text, not chat".into())),
    };
    let normalized = openai::normalize_messages(&messages, settings.content_format, template)?;
    let tools = tools.as_deref().map(openai::normalize_tools).transpose()?;
    let render = RenderInput {
        messages: normalized.messages,
        tools,
        add_generation_prompt: flag(&obj, "add_generation_prompt", true)?,
        continue_final_message: flag(&obj, "continue_final_message", false)?,
        kwargs: kwargs(&obj, settings)?,
    };
    Ok(ParsedChat { render, media_items: normalized.media_items })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unset_request_kwargs_keep_the_server_defaults() {
        let settings = RenderSettings { default_kwargs: json!({"enable_thinking": false, "x": 1}).as_object().cloned().unwrap_or_default(), ..Default::default() };
        let obj = json!({"chat_template_kwargs": {"enable_thinking": null, "x": "auto", "y": 2}});
        let k = kwargs(obj.as_object().unwrap_or(&Map::new()), &settings).unwrap();
        assert_eq!(Json::Object(k), json!({"enable_thinking": false, "x": 1, "y": 2}));
    }

    #[test]
    fn parse_renders_a_responses_input_as_chat() {
        let settings = RenderSettings::default();
        let body = json!({"instructions": "sys", "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}],
                          "tools": [{"type": "function", "name": "f"}], "chat_template_kwargs": {"enable_thinking": false}});
        let parsed = parse(&body.to_string(), Api::Responses, "{{ messages }}", &settings).unwrap();
        let r = parsed.render;
        assert_eq!(r.messages, vec![json!({"role": "system", "content": "sys"}), json!({"role": "user", "content": "a\nb"})]);
        assert_eq!(r.tools.unwrap()[0]["function"]["name"], "f");
        assert!(r.add_generation_prompt && !r.continue_final_message);
        assert_eq!(r.kwargs["enable_thinking"], false);
        assert!(parse(r#"{"instructions": "x"}"#, Api::Responses, "", &settings).is_err());
    }
}
