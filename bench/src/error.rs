//! The library's one error type. Leaf errors carry the data needed to act on them (which
//! file, which line, which URL); the binary wraps them in `anyhow` for context.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: bad trace record: {message}")]
    Trace { path: PathBuf, line: usize, message: String },
    #[error("invalid workload: {0}")]
    Workload(String),
    #[error("refusing non-loopback target {0}: the benchmark only sends traffic to this machine")]
    NotLoopback(String),
    #[error("HTTP {url}: {message}")]
    Http { url: String, message: String },
    #[error("cannot parse metrics from {url}: {message}")]
    Metrics { url: String, message: String },
    #[error("stack: {0}")]
    Stack(String),
}

impl BenchError {
    pub(crate) fn http(url: &str, e: impl std::fmt::Display) -> Self {
        BenchError::Http { url: url.to_string(), message: e.to_string() }
    }
}
