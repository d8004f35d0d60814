//! Test fixtures: the Qwen3 tokenizer directory (fetched by tokenize/fetch-tokenizer.sh into
//! a cached venv) and the Python reference run in that venv.
#![allow(dead_code)]

pub mod gen;

use serde_json::Value as Json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const PY_PACKAGES: &str = "transformers tokenizers jinja2";

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs fetch-tokenizer.sh (idempotent) and returns (tokenizer dir, venv python).
pub fn fixture() -> Result<(PathBuf, PathBuf), String> {
    let script = crate_dir().join("fetch-tokenizer.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("KVROUTE_FIXTURE_PY", PY_PACKAGES)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("fetch-tokenizer.sh failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let cache = std::env::var_os("KVROUTE_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| crate_dir().join("../.cache"));
    Ok((dir, cache.join("venv-fixtures/bin/python")))
}

pub fn skip_py() -> bool {
    if std::env::var("KVROUTE_SKIP_PY").as_deref() == Ok("1") {
        eprintln!("\n!!!!!! KVROUTE_SKIP_PY=1: SKIPPING the transformers comparison !!!!!!\n");
        return true;
    }
    false
}

/// Expected results from tests/hf_reference.py, one per case.
pub fn python_reference(python: &Path, dir: &Path, cases: &[Json]) -> Result<Vec<Json>, String> {
    let script = crate_dir().join("tests/hf_reference.py");
    let mut child = Command::new(python)
        .arg(&script)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let input = serde_json::to_vec(cases).map_err(|e| e.to_string())?;
    child.stdin.take().ok_or("no stdin")?.write_all(&input).map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("python failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("bad python output: {e}"))
}

/// The committed hand-written corpus.
pub fn corpus() -> Vec<Json> {
    let text = std::fs::read_to_string(crate_dir().join("tests/corpus/conversations.json")).expect("corpus file");
    serde_json::from_str(&text).expect("corpus JSON")
}

/// Seeded random cases: `n_chat` OpenAI and `n_messages` Anthropic conversations.
pub fn generated(seed: u64, n_chat: usize, n_messages: usize) -> Vec<Json> {
    let mut rng = gen::rng(seed);
    let mut out = Vec::new();
    for i in 0..n_chat {
        let turns = 1 + i % 6;
        out.push(serde_json::json!({"name": format!("gen_chat_{i}"), "api": "chat", "input": gen::openai(&mut rng, turns, 1 + i % 3)}));
    }
    for i in 0..n_messages {
        let turns = 1 + i % 5;
        out.push(serde_json::json!({"name": format!("gen_messages_{i}"), "api": "messages", "input": gen::anthropic(&mut rng, turns, 1 + i % 3)}));
    }
    out
}
