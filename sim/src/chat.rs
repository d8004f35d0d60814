//! Chat rendering and tokenization the way vLLM (and Hugging Face `apply_chat_template`)
//! does it: the model's Jinja chat template from `tokenizer_config.json`, rendered with
//! Jinja2's HF settings (`trim_blocks`, `lstrip_blocks`, Python string methods, a
//! `tojson` that matches `json.dumps(..., ensure_ascii=False)`), then tokenized with the
//! model's `tokenizer.json` without adding special tokens.
//!
//! Messages keep their JSON key order (tool schemas are dumped into the prompt verbatim),
//! so they travel as [`ChatValue`], which deserializes order-preserving.
//!
//! Without a tokenizer directory, [`ChatTokenizer::byte_fallback`] renders a plain ChatML
//! layout and maps each UTF-8 byte to one token id: cheap, deterministic, documented, and
//! reported as such by `/tokenize`. The state service is meant to reuse this module.

mod pyjson;

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Deserializer};
use std::path::{Path, PathBuf};

/// A JSON value (messages, tools, template kwargs) with its key order preserved.
#[derive(Clone, Debug, Default)]
pub struct ChatValue(pub Value);

impl<'de> Deserialize<'de> for ChatValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(ChatValue)
    }
}

impl ChatValue {
    pub fn from_json(text: &str) -> Result<Self, ChatError> {
        serde_json::from_str(text).map_err(|e| ChatError::Json(e.to_string()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot load tokenizer {path}: {message}")]
    Tokenizer { path: PathBuf, message: String },
    #[error("tokenizer_config.json has no chat_template")]
    NoTemplate,
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("invalid messages: {0}")]
    Messages(String),
    #[error("chat template error: {0}")]
    Template(String),
    #[error("tokenization failed: {0}")]
    Encode(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TokenizerKind {
    HuggingFace,
    ByteFallback,
}

const FALLBACK_TEMPLATE: &str = "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

pub struct ChatTokenizer {
    tokenizer: Option<tokenizers::Tokenizer>,
    env: Environment<'static>,
    special: Vec<(&'static str, Value)>,
}

impl std::fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTokenizer").field("kind", &self.kind()).finish()
    }
}

fn raise_exception(msg: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

fn environment(template: String) -> Result<Environment<'static>, ChatError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", pyjson::tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_template_owned("chat", template).map_err(|e| ChatError::Template(e.to_string()))?;
    Ok(env)
}

fn read(path: &Path) -> Result<String, ChatError> {
    std::fs::read_to_string(path).map_err(|source| ChatError::Io { path: path.to_path_buf(), source })
}

/// `chat_template` is a string, or a list of `{name, template}` (use "default").
fn template_from_config(cfg: &serde_json::Value) -> Option<String> {
    match cfg.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}

/// HF passes special tokens to the template; AddedToken objects carry `content`.
fn special_token(cfg: &serde_json::Value, key: &str) -> Value {
    match cfg.get(key) {
        Some(serde_json::Value::String(s)) => Value::from(s.clone()),
        Some(serde_json::Value::Object(o)) => o.get("content").and_then(|c| c.as_str()).map(Value::from).unwrap_or_default(),
        _ => Value::from(()),
    }
}

impl ChatTokenizer {
    /// Load `tokenizer.json` and `tokenizer_config.json` (with `chat_template`) from `dir`.
    pub fn from_dir(dir: &Path) -> Result<Self, ChatError> {
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| ChatError::Tokenizer { path: tok_path.clone(), message: e.to_string() })?;
        let cfg_text = read(&dir.join("tokenizer_config.json"))?;
        let cfg: serde_json::Value = serde_json::from_str(&cfg_text).map_err(|e| ChatError::Json(e.to_string()))?;
        let template = template_from_config(&cfg).ok_or(ChatError::NoTemplate)?;
        let special = ["bos_token", "eos_token", "pad_token", "unk_token"]
            .into_iter()
            .map(|k| (k, special_token(&cfg, k)))
            .collect();
        Ok(ChatTokenizer { tokenizer: Some(tokenizer), env: environment(template)?, special })
    }

    /// ChatML rendering + one token per UTF-8 byte.
    pub fn byte_fallback() -> Self {
        let env = environment(FALLBACK_TEMPLATE.to_string()).unwrap_or_else(|_| Environment::new());
        ChatTokenizer { tokenizer: None, env, special: Vec::new() }
    }

    pub fn kind(&self) -> TokenizerKind {
        if self.tokenizer.is_some() { TokenizerKind::HuggingFace } else { TokenizerKind::ByteFallback }
    }

    /// Render `messages` (a JSON array of `{role, content, ...}`) with the chat template.
    /// `extra` holds `chat_template_kwargs` (e.g. `enable_thinking`).
    pub fn render(
        &self,
        messages: &ChatValue,
        tools: Option<&ChatValue>,
        add_generation_prompt: bool,
        extra: Option<&ChatValue>,
    ) -> Result<String, ChatError> {
        let messages = normalize_messages(&messages.0)?;
        let mut ctx: Vec<(String, Value)> = Vec::new();
        if let Some(extra) = extra.and_then(|e| e.0.try_iter().ok().map(|keys| (e, keys))) {
            for k in extra.1 {
                let v = extra.0 .0.get_item(&k).unwrap_or_default();
                ctx.push((k.to_string(), v));
            }
        }
        ctx.extend(self.special.iter().map(|(k, v)| (k.to_string(), v.clone())));
        ctx.push(("messages".into(), messages));
        ctx.push(("tools".into(), tools.map(|t| t.0.clone()).unwrap_or(Value::from(()))));
        ctx.push(("add_generation_prompt".into(), Value::from(add_generation_prompt)));
        let tmpl = self.env.get_template("chat").map_err(|e| ChatError::Template(e.to_string()))?;
        tmpl.render(Value::from_iter(ctx)).map_err(|e| ChatError::Template(format!("{e:#}")))
    }

    /// Convenience for callers holding JSON text.
    pub fn render_json(&self, messages: &str, tools: Option<&str>, add_generation_prompt: bool) -> Result<String, ChatError> {
        let m = ChatValue::from_json(messages)?;
        let t = tools.map(ChatValue::from_json).transpose()?;
        self.render(&m, t.as_ref(), add_generation_prompt, None)
    }

    /// Render then tokenize without special tokens, as vLLM does for chat requests.
    pub fn encode_chat(
        &self,
        messages: &ChatValue,
        tools: Option<&ChatValue>,
        add_generation_prompt: bool,
        extra: Option<&ChatValue>,
    ) -> Result<Vec<u32>, ChatError> {
        let text = self.render(messages, tools, add_generation_prompt, extra)?;
        self.encode(&text, false)
    }

    /// Tokenize a plain prompt as vLLM's completions endpoint does (special tokens added).
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        self.encode(text, true)
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ChatError> {
        match &self.tokenizer {
            Some(t) => t
                .encode_fast(text, add_special_tokens)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| ChatError::Encode(e.to_string())),
            None => Ok(text.bytes().map(u32::from).collect()),
        }
    }
}

/// vLLM's "string" content format: a list of content parts becomes its text parts joined
/// by newlines; anything else is passed through.
fn normalize_messages(messages: &Value) -> Result<Value, ChatError> {
    let iter = messages.try_iter().map_err(|_| ChatError::Messages("messages must be an array".into()))?;
    let mut out = Vec::new();
    for m in iter {
        let keys = m.try_iter().map_err(|_| ChatError::Messages("each message must be an object".into()))?;
        if m.get_attr("role").map(|r| r.is_undefined() || r.is_none()).unwrap_or(true) {
            return Err(ChatError::Messages("each message needs a role".into()));
        }
        let content = m.get_attr("content").unwrap_or_default();
        if content.kind() != minijinja::value::ValueKind::Seq {
            out.push(m);
            continue;
        }
        let mut texts = Vec::new();
        for part in content.try_iter().map_err(|e| ChatError::Messages(e.to_string()))? {
            if let Some(t) = part.get_attr("text").ok().and_then(|t| t.as_str().map(str::to_string)) {
                texts.push(t);
            }
        }
        let fields: Vec<(String, Value)> = keys
            .map(|k| {
                let v = if k.as_str() == Some("content") { Value::from(texts.join("\n")) } else { m.get_item(&k).unwrap_or_default() };
                (k.to_string(), v)
            })
            .collect();
        out.push(Value::from_iter(fields));
    }
    Ok(Value::from(out))
}

#[cfg(test)]
mod tests;
