//! Test fixtures: the Qwen3 tokenizer directory (fetched by tokenize/fetch-tokenizer.sh into
//! a cached venv), the vLLM 0.33.0 wheel (fetched by tests/conformance/setup.sh) and the
//! Python references run in that venv.
#![allow(dead_code)]

pub mod gen;
pub mod gen_responses;

use serde_json::Value as Json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Also in scripts/setup.sh, which installs them before the tests run (parallel tests must
/// not race on a pip install). `openai`: the SDK types vLLM parses Responses input with.
const PY_PACKAGES: &str = "transformers tokenizers jinja2 openai";

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
    run_python(python, "tests/hf_reference.py", &[dir], cases)
}

/// Expected results from tests/responses_reference.py (vLLM's own Responses code, read from
/// `wheel`), one per case.
pub fn responses_reference(python: &Path, dir: &Path, wheel: &Path, cases: &[Json]) -> Result<Vec<Json>, String> {
    run_python(python, "tests/responses_reference.py", &[dir, wheel], cases)
}

fn run_python(python: &Path, script: &str, args: &[&Path], cases: &[Json]) -> Result<Vec<Json>, String> {
    let script = crate_dir().join(script);
    let mut child = Command::new(python)
        .arg(&script)
        .args(args)
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

/// The vLLM 0.33.0 wheel in the cache, fetched by tests/conformance/setup.sh (idempotent)
/// when it is not there yet.
pub fn vllm_wheel() -> Result<PathBuf, String> {
    let cache = std::env::var_os("KVROUTE_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| crate_dir().join("../.cache"));
    let find = || -> Option<PathBuf> {
        let dir = std::fs::read_dir(cache.join("vllm-wheel")).ok()?;
        dir.filter_map(|e| e.ok().map(|e| e.path())).find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("vllm-0.33.0-") && n.ends_with(".whl")))
    };
    if let Some(wheel) = find() {
        return Ok(wheel);
    }
    let setup = crate_dir().join("../tests/conformance/setup.sh");
    let out = Command::new("bash").arg(&setup).output().map_err(|e| format!("cannot run {}: {e}", setup.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed: {}", setup.display(), String::from_utf8_lossy(&out.stderr)));
    }
    find().ok_or_else(|| format!("no vllm-0.33.0 wheel in {} after {}", cache.join("vllm-wheel").display(), setup.display()))
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
