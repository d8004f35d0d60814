//! What `tokenizer_config.json` contributes: the chat template, the special-token strings
//! Hugging Face passes to it (`special_tokens_map`: bos/eos/unk/sep/pad/cls/mask and
//! `additional_special_tokens`), and `add_bos_token`, which transformers v5 applies on top of
//! `tokenizer.json`'s post-processor when encoding plain text with special tokens.

use crate::error::TokenizeError;
use serde_json::Value as Json;
use std::path::Path;

/// The parts of `tokenizer_config.json` that change token ids.
#[derive(Clone, Debug)]
pub struct TokenizerConfig {
    pub chat_template: String,
    /// `(name, value)` in HF's `SPECIAL_TOKENS_ATTRIBUTES` order, only those that are set.
    pub special_tokens: Vec<(String, Json)>,
    pub bos_token: Option<String>,
    pub add_bos_token: bool,
}

const SPECIAL_ATTRS: [&str; 7] = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

impl TokenizerConfig {
    pub fn from_file(path: &Path) -> Result<Self, TokenizeError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenizeError::Io { path: path.to_path_buf(), source })?;
        Self::from_json(&text)
    }

    pub fn from_json(text: &str) -> Result<Self, TokenizeError> {
        let cfg: Json = serde_json::from_str(text).map_err(|e| TokenizeError::Json(e.to_string()))?;
        let chat_template = template_from_config(&cfg).ok_or(TokenizeError::NoTemplate)?;
        let mut special_tokens = Vec::new();
        for key in SPECIAL_ATTRS {
            if let Some(s) = token_string(cfg.get(key)) {
                special_tokens.push((key.to_string(), Json::String(s)));
            }
        }
        if let Some(Json::Array(extra)) = cfg.get("additional_special_tokens") {
            let list: Vec<Json> = extra.iter().filter_map(|t| token_string(Some(t))).map(Json::String).collect();
            special_tokens.push(("additional_special_tokens".into(), Json::Array(list)));
        }
        let bos_token = token_string(cfg.get("bos_token"));
        let add_bos_token = cfg.get("add_bos_token").and_then(Json::as_bool).unwrap_or(false);
        Ok(TokenizerConfig { chat_template, special_tokens, bos_token, add_bos_token })
    }
}

/// `chat_template` is a string, or a list of `{name, template}` (HF picks "default").
fn template_from_config(cfg: &Json) -> Option<String> {
    match cfg.get("chat_template")? {
        Json::String(s) => Some(s.clone()),
        Json::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}

/// Special tokens are plain strings or serialized `AddedToken` objects carrying `content`.
fn token_string(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_template_list_and_token_objects() {
        let cfg = TokenizerConfig::from_json(
            r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
                "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "unk_token": null,
                "add_bos_token": true, "additional_special_tokens": ["<a>"]}"#,
        )
        .unwrap();
        assert_eq!(cfg.chat_template, "D");
        assert_eq!(cfg.bos_token.as_deref(), Some("<s>"));
        assert!(cfg.add_bos_token);
        let names: Vec<&str> = cfg.special_tokens.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["bos_token", "eos_token", "additional_special_tokens"]);
        assert!(matches!(TokenizerConfig::from_json("{}"), Err(TokenizeError::NoTemplate)));
        assert!(matches!(TokenizerConfig::from_json("[1"), Err(TokenizeError::Json(_))));
    }
}
