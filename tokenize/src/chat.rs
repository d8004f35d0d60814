//! Chat-template rendering the way Hugging Face's `apply_chat_template` does it (which is what
//! vLLM calls): the model's Jinja template rendered with Jinja2's HF settings (`trim_blocks`,
//! `lstrip_blocks`, loop controls, Python string methods, `raise_exception`, a `tojson` that
//! equals `json.dumps(..., ensure_ascii=False)`), with `messages`, `tools`, `documents`,
//! `add_generation_prompt`, the special-token strings and the caller's template kwargs in
//! context, plus HF's message preprocessing (None-valued keys dropped, reasoning aliased
//! under `thinking`/`reasoning_content`) and its `continue_final_message` truncation.
//!
//! Data flow: [`RenderInput`] (built by `input` from a request) -> [`ChatTemplate::render`] ->
//! prompt text, wrapped as [`RenderedChat`] by the callers. This module is a leaf of the
//! crate (it uses only `error`): `input`, `prefix` and `model` build on it.
//! Input arrives as order-preserving `serde_json` values (tool schemas are dumped verbatim).

mod pyjson;

use crate::error::TokenizeError;
use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde_json::{Map, Value as Json};

/// Everything a chat template sees besides the special tokens.
#[derive(Clone, Debug, Default)]
pub struct RenderInput {
    /// Messages after API-specific normalization (see `openai`/`anthropic`).
    pub messages: Vec<Json>,
    pub tools: Option<Vec<Json>>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// `chat_template_kwargs`; they override the special tokens, as in HF.
    pub kwargs: Map<String, Json>,
}

/// A rendered chat prompt: what [`ChatTemplate::render`] made of a request, plus what the
/// text leaves out. It lives here, with the renderer, because both rendering paths (the full
/// one in `model` and the incremental one in `prefix`) produce it; they depend on this
/// module, never the other way round.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderedChat {
    pub text: String,
    /// Images/audio/video left out of the text: with any, the ids are not exact.
    pub media_items: usize,
}

/// A compiled chat template with the tokenizer's special-token strings.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    special: Vec<(String, Value)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bytes", &self.source.len()).finish()
    }
}

fn raise_exception(msg: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

/// HF's `strftime_now` reads the wall clock, which makes the prompt (and so its tokens)
/// depend on when it is rendered; a router cannot reproduce that, so it is an error.
fn strftime_now(_format: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, "strftime_now: prompts that embed the current time are not reproducible"))
}

fn environment(template: &str) -> Result<Environment<'static>, TokenizeError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", pyjson::tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_template_owned("chat", template.to_string()).map_err(|e| TokenizeError::Template(e.to_string()))?;
    Ok(env)
}

/// JSON -> template value, keeping key order. Integers beyond 64 bits become floats (Python
/// would keep them exact; such numbers do not occur in real tool schemas).
pub(crate) fn to_value(v: &Json) -> Value {
    match v {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(to_value).collect::<Vec<_>>()),
        Json::Object(map) => Value::from_iter(map.iter().map(|(k, v)| (k.as_str(), to_value(v)))),
    }
}

/// Names a message's reasoning travels under; HF fills the first and last from any of them.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// HF's `_normalize_chat_messages` (None-valued keys dropped) + `_alias_reasoning_fields`
/// (`{"thinking": r, **message, "reasoning_content": r}` with Python dict update semantics).
fn hf_message(m: &Json) -> Result<Value, TokenizeError> {
    let Json::Object(obj) = m else {
        return Err(crate::error::input("each message must be an object"));
    };
    let present = |k: &&String| obj.get(k.as_str()).is_some_and(|v| !v.is_null());
    let reasoning = REASONING_FIELDS.iter().find_map(|f| obj.get(*f).filter(|v| !v.is_null()));
    let Some(r) = reasoning else {
        return Ok(Value::from_iter(obj.iter().filter(|(k, _)| present(k)).map(|(k, v)| (k.as_str(), to_value(v)))));
    };
    let mut fields: Vec<(&str, Value)> = vec![("thinking", to_value(r))];
    for (k, v) in obj.iter().filter(|(k, _)| present(k)) {
        set_field(&mut fields, k, to_value(v));
    }
    set_field(&mut fields, "reasoning_content", to_value(r));
    Ok(Value::from_iter(fields))
}

fn set_field<'a>(fields: &mut Vec<(&'a str, Value)>, key: &'a str, value: Value) {
    match fields.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = value,
        None => fields.push((key, value)),
    }
}

/// HF appends this to the final message and cuts the rendered prompt at it.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

impl ChatTemplate {
    /// `special` are the `special_tokens_map` entries passed to every render.
    pub fn new(template: &str, special: &[(String, Json)]) -> Result<Self, TokenizeError> {
        let special = special.iter().map(|(k, v)| (k.clone(), to_value(v))).collect();
        Ok(ChatTemplate { env: environment(template)?, source: template.to_string(), special })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `input` into the prompt text.
    pub fn render(&self, input: &RenderInput) -> Result<String, TokenizeError> {
        if input.messages.is_empty() {
            return Err(crate::error::input("messages must not be empty"));
        }
        if input.continue_final_message && input.add_generation_prompt {
            return Err(crate::error::input("continue_final_message and add_generation_prompt are exclusive"));
        }
        let mut messages = input.messages.iter().map(hf_message).collect::<Result<Vec<_>, _>>()?;
        let final_text = if input.continue_final_message { Some(self.tag_final_message(&mut messages, input)?) } else { None };
        let mut ctx: Vec<(String, Value)> = Vec::with_capacity(8 + input.kwargs.len());
        ctx.push(("messages".into(), Value::from(messages)));
        ctx.push(("tools".into(), input.tools.as_ref().map(|t| Value::from(t.iter().map(to_value).collect::<Vec<_>>())).unwrap_or_default()));
        ctx.push(("documents".into(), Value::from(())));
        ctx.push(("add_generation_prompt".into(), Value::from(input.add_generation_prompt)));
        ctx.extend(self.special.iter().cloned());
        ctx.extend(input.kwargs.iter().map(|(k, v)| (k.clone(), to_value(v))));
        let tmpl = self.env.get_template("chat").map_err(|e| TokenizeError::Template(e.to_string()))?;
        let rendered = tmpl.render(Value::from_iter(ctx)).map_err(|e| TokenizeError::Template(format!("{e:#}")))?;
        match final_text {
            Some(text) => cut_at_tag(rendered, &text),
            None => Ok(rendered),
        }
    }

    /// Appends [`CONTINUE_TAG`] to the final message's content (its last text part if a list)
    /// and returns the original text.
    fn tag_final_message(&self, messages: &mut [Value], input: &RenderInput) -> Result<String, TokenizeError> {
        let last = input.messages.last().and_then(Json::as_object).ok_or_else(|| crate::error::input("no final message"))?;
        let mut obj = last.clone();
        let text = match obj.get_mut("content") {
            Some(Json::String(s)) => {
                let t = s.clone();
                s.push_str(CONTINUE_TAG);
                t
            }
            Some(Json::Array(parts)) => {
                let part = parts.iter_mut().rev().find_map(|p| p.get_mut("text")).and_then(|t| match t {
                    Json::String(s) => Some(s),
                    _ => None,
                });
                let s = part.ok_or_else(|| crate::error::input("continue_final_message: no text in the final message"))?;
                let t = s.clone();
                s.push_str(CONTINUE_TAG);
                t
            }
            _ => return Err(crate::error::input("continue_final_message: final message has no content")),
        };
        if let Some(slot) = messages.last_mut() {
            *slot = hf_message(&Json::Object(obj))?;
        }
        Ok(text)
    }
}

fn cut_at_tag(rendered: String, final_text: &str) -> Result<String, TokenizeError> {
    let tag = CONTINUE_TAG.trim();
    if !rendered.contains(final_text.trim()) || !rendered.contains(tag) {
        return Err(TokenizeError::Template("continue_final_message: the template dropped the final message".into()));
    }
    let at = rendered.rfind(tag).unwrap_or(rendered.len());
    if rendered[at..].starts_with(CONTINUE_TAG) {
        Ok(rendered[..at].to_string())
    } else {
        Ok(rendered[..at].trim_end().to_string())
    }
}

