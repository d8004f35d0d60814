//! The crate's one error type. Every variant is caused by the input or the model files, never
//! by a bug the caller can work around, so callers map any of them to "no exact keys for this
//! request" (fall back to approximate matching) and count the [`TokenizeError::kind`].

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot load tokenizer {path}: {message}")]
    Tokenizer { path: PathBuf, message: String },
    #[error("tokenizer_config.json has no chat_template")]
    NoTemplate,
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("invalid chat input: {0}")]
    Input(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("chat template error: {0}")]
    Template(String),
    #[error("tokenization failed: {0}")]
    Encode(String),
}

impl TokenizeError {
    /// A short, stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            TokenizeError::Io { .. } => "io",
            TokenizeError::Tokenizer { .. } => "tokenizer",
            TokenizeError::NoTemplate => "no_template",
            TokenizeError::Json(_) => "json",
            TokenizeError::Input(_) => "input",
            TokenizeError::Unsupported(_) => "unsupported",
            TokenizeError::Template(_) => "template",
            TokenizeError::Encode(_) => "encode",
        }
    }
}

pub(crate) fn input(msg: impl Into<String>) -> TokenizeError {
    TokenizeError::Input(msg.into())
}
