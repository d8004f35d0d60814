//! The simulator's prompt tokenization: what vLLM computes for a request, so the simulated
//! prefix cache sees the same token ids (and block hashes) a real worker would.
//!
//! With a tokenizer directory this is `kvroute-tokenize`'s [`ModelTokenizer`], shared with the
//! state service: vLLM's message normalization, the model's chat template rendered as Hugging
//! Face renders it, `tokenizer.json` encoding. The request body itself is the template input
//! (the crate reads `messages`, `tools`, `add_generation_prompt`, `continue_final_message`,
//! `chat_template_kwargs`, `reasoning_effort` and ignores the rest, as vLLM does).
//!
//! Without one, [`ChatTokenizer::byte_fallback`] normalizes the same way, renders a plain
//! ChatML layout and maps each UTF-8 byte to one token id: cheap, deterministic, and reported
//! as such by `/tokenize`. It lives here rather than in the shared crate because it is a
//! simulator convenience: the router must never mistake it for a model's tokenization.
//!
//! Data flow: request body -> [`ChatTokenizer`] -> prompt ids for the engine, and sampled ids
//! -> [`ChatTokenizer::decode`] -> response text. This module knows nothing of how answers are
//! made up: `answer.rs` builds on it (filler words chosen per tokenizer), not the other way.

use kvroute_tokenize::chat::ChatTemplate;
use kvroute_tokenize::input::{self, RenderSettings};
use kvroute_tokenize::{Api, ModelTokenizer};
use std::path::Path;

pub use kvroute_tokenize::TokenizeError as ChatError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TokenizerKind {
    HuggingFace,
    ByteFallback,
}

const FALLBACK_TEMPLATE: &str = "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

pub enum ChatTokenizer {
    /// A model's tokenizer.
    Model(Box<ModelTokenizer>),
    /// ChatML rendering, one token per UTF-8 byte. Boxed like the model so that neither
    /// variant makes the enum large (a compiled template is a few hundred bytes).
    ByteFallback(Option<Box<ChatTemplate>>),
}

impl std::fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTokenizer").field("kind", &self.kind()).finish()
    }
}

impl ChatTokenizer {
    /// Loads `tokenizer.json` and `tokenizer_config.json` (with `chat_template`) from `dir`.
    pub fn from_dir(dir: &Path) -> Result<Self, ChatError> {
        Ok(ChatTokenizer::Model(Box::new(ModelTokenizer::from_dir(dir)?)))
    }

    pub fn byte_fallback() -> Self {
        ChatTokenizer::ByteFallback(ChatTemplate::new(FALLBACK_TEMPLATE, &[]).ok().map(Box::new))
    }

    pub fn kind(&self) -> TokenizerKind {
        match self {
            ChatTokenizer::Model(_) => TokenizerKind::HuggingFace,
            ChatTokenizer::ByteFallback(_) => TokenizerKind::ByteFallback,
        }
    }

    /// The prompt text of a chat request body: `/v1/chat/completions` or `/tokenize`
    /// (`Api::ChatCompletions`), or `/v1/messages` (`Api::Messages`, converted to chat
    /// messages as vLLM's Anthropic endpoint converts them).
    pub fn render_chat(&self, body: &str, api: Api) -> Result<String, ChatError> {
        match self {
            ChatTokenizer::Model(t) => t.render_chat(body, api).map(|r| r.text),
            ChatTokenizer::ByteFallback(template) => {
                let template = template.as_ref().ok_or_else(|| ChatError::Template("fallback template did not compile".into()))?;
                let parsed = input::parse(body, api, FALLBACK_TEMPLATE, &RenderSettings::default())?;
                template.render(&parsed.render)
            }
        }
    }

    /// Renders then encodes without special tokens, as vLLM does for chat requests.
    pub fn encode_chat(&self, body: &str, api: Api) -> Result<Vec<u32>, ChatError> {
        match self {
            ChatTokenizer::Model(t) => t.encode_chat(body, api),
            ChatTokenizer::ByteFallback(_) => Ok(bytes(&self.render_chat(body, api)?)),
        }
    }

    /// A plain prompt, encoded as vLLM's completions endpoint does (special tokens added).
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        match self {
            ChatTokenizer::Model(t) => t.encode_text(text),
            ChatTokenizer::ByteFallback(_) => Ok(bytes(text)),
        }
    }

    /// A plain prompt encoded without special tokens (`/tokenize` with
    /// `add_special_tokens: false`).
    pub fn encode_text_plain(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        match self {
            ChatTokenizer::Model(t) => t.encoder().encode(text),
            ChatTokenizer::ByteFallback(_) => Ok(bytes(text)),
        }
    }

    /// The text of `ids` with special tokens kept, as vLLM's `/detokenize` decodes
    /// (`tokenizer.decode(ids)`); ids outside the vocabulary decode to nothing.
    pub fn decode_all(&self, ids: &[u32]) -> Result<String, ChatError> {
        match self {
            ChatTokenizer::Model(t) => t.encoder().tokenizer().decode(ids, false).map_err(|e| ChatError::Encode(format!("decode: {e}"))),
            ChatTokenizer::ByteFallback(_) => Ok(String::from_utf8_lossy(&ids.iter().filter_map(|b| u8::try_from(*b).ok()).collect::<Vec<u8>>()).into_owned()),
        }
    }

    /// The vocabulary's token strings for `ids` (`convert_ids_to_tokens`); unknown ids give "".
    pub fn token_strs(&self, ids: &[u32]) -> Vec<String> {
        match self {
            ChatTokenizer::Model(t) => ids.iter().map(|id| t.encoder().tokenizer().id_to_token(*id).unwrap_or_default()).collect(),
            ChatTokenizer::ByteFallback(_) => ids.iter().map(|b| char::from(*b as u8).to_string()).collect(),
        }
    }

    /// The text of `ids` as vLLM returns it (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ChatError> {
        match self {
            ChatTokenizer::Model(t) => decode_model(t, ids),
            ChatTokenizer::ByteFallback(_) => Ok(String::from_utf8_lossy(&ids.iter().map(|b| *b as u8).collect::<Vec<u8>>()).into_owned()),
        }
    }
}

/// `tokenizers`' decoding of `ids`, special tokens skipped (as vLLM detokenizes by default).
fn decode_model(tokenizer: &ModelTokenizer, ids: &[u32]) -> Result<String, ChatError> {
    tokenizer.encoder().tokenizer().decode(ids, true).map_err(|e| ChatError::Encode(format!("decode: {e}")))
}

fn bytes(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_fallback_renders_chatml_bytes() {
        let tok = ChatTokenizer::byte_fallback();
        let body = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#;
        assert_eq!(tok.render_chat(body, Api::ChatCompletions).unwrap(), "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(tok.encode_chat(body, Api::ChatCompletions).unwrap().len(), "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n".len());
        assert_eq!(tok.encode_text("hé").unwrap(), vec![104, 0xc3, 0xa9]);
        assert!(matches!(tok.render_chat(r#"{"messages":{"role":"user"}}"#, Api::ChatCompletions), Err(ChatError::Input(_))));
        assert!(matches!(tok.render_chat(r#"{"messages":[{"content":"x"}]}"#, Api::ChatCompletions), Err(ChatError::Input(_))));
        assert!(matches!(tok.render_chat(r#"{"messages":[]}"#, Api::ChatCompletions), Err(ChatError::Input(_))));
        // Anthropic: the top-level system becomes the first message, as vLLM converts it.
        let messages = r#"{"model":"m","max_tokens":5,"system":"S","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#;
        let chatml = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(tok.render_chat(messages, Api::Messages).unwrap(), chatml);
    }
}
