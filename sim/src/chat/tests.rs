//! Chat rendering tests. The Hugging Face comparison runs `transformers`'
//! `apply_chat_template(..., tokenize=True, add_generation_prompt=True)` in a cached venv
//! (created by sim/fetch-tokenizer.sh) and demands identical token ids. Set
//! KVROUTE_SKIP_PY=1 to skip it; otherwise a missing venv fails the test.

use super::*;
use std::process::Command;

pub(crate) const CONVERSATIONS: &str = r#"[
 {"messages": [{"role": "user", "content": "Hello!"}]},
 {"messages": [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "What is 2+2?"}]},
 {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"}, {"role": "user", "content": "Tell me a joke."}]},
 {"messages": [{"role": "user", "content": "Grüße aus Köln! 你好，世界 🌍 — ça va? Ünïcödé ½ ∑"}]},
 {"messages": [{"role": "user", "content": "Fix this:\n```rust\nfn main() {\n\tprintln!(\"{}\", 1 + \"a\");\n}\n```\n"}]},
 {"messages": [{"role": "user", "content": "Think first"}, {"role": "assistant", "content": "<think>\nLet me see.\n</think>\n\nThe answer is 4."}, {"role": "user", "content": "And 3+3?"}]},
 {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "What's the weather in Paris?"}],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather, in °C", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1.0}}, "required": ["city"]}}}]},
 {"messages": [{"role": "user", "content": "Weather in Paris?"},
   {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
   {"role": "tool", "content": "{\"temp\": 21}"},
   {"role": "tool", "content": "second result"},
   {"role": "user", "content": "Thanks"}],
  "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]},
 {"messages": [{"role": "user", "content": "call it"},
   {"role": "assistant", "content": "Sure.", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
   {"role": "tool", "content": "<ok/>"}]},
 {"messages": [{"role": "system", "content": "A long system prompt.\n\nWith paragraphs,   spaces\tand tabs."}, {"role": "user", "content": "  leading and trailing spaces  "}, {"role": "assistant", "content": "ok"}, {"role": "system", "content": "second system"}, {"role": "user", "content": "q"}]}
]"#;

const HF_SCRIPT: &str = r#"
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
out = []
for conv in json.load(sys.stdin):
    ids = tok.apply_chat_template(conv["messages"], tools=conv.get("tools"), tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    out.append(list(ids))
print(json.dumps(out))
"#;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs sim/fetch-tokenizer.sh (idempotent) and returns the tokenizer dir.
pub(crate) fn fixture_dir(extra_py: &str) -> Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fetch-tokenizer.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("KVROUTE_FIXTURE_PY", extra_py)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("fetch-tokenizer.sh failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn skip_py() -> bool {
    if std::env::var("KVROUTE_SKIP_PY").as_deref() == Ok("1") {
        eprintln!("\n!!!!!! KVROUTE_SKIP_PY=1: SKIPPING the Hugging Face chat-template comparison !!!!!!\n");
        return true;
    }
    false
}

#[test]
fn chat_tokens_match_hugging_face_apply_chat_template() {
    if skip_py() {
        return;
    }
    let dir = fixture_dir("transformers tokenizers jinja2").expect("tokenizer fixture (set KVROUTE_SKIP_PY=1 to skip)");
    let python = repo_root().join(".cache/venv-fixtures/bin/python");
    let mut child = Command::new(&python)
        .args(["-c", HF_SCRIPT])
        .arg(&dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run venv python");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(CONVERSATIONS.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python failed: {}", String::from_utf8_lossy(&out.stderr));
    let expected: Vec<Vec<u32>> = serde_json::from_slice(&out.stdout).unwrap();

    let tok = ChatTokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.kind(), TokenizerKind::HuggingFace);
    let convs: Vec<serde_json::Value> = serde_json::from_str(CONVERSATIONS).unwrap();
    assert_eq!(convs.len(), expected.len());
    let raw: Vec<ChatValue> = serde_json::from_str(CONVERSATIONS).unwrap();
    for (i, (conv, want)) in raw.iter().zip(&expected).enumerate() {
        let messages = ChatValue(conv.0.get_attr("messages").unwrap());
        let tools = conv.0.get_attr("tools").ok().filter(|t| !t.is_undefined()).map(ChatValue);
        let got = tok.encode_chat(&messages, tools.as_ref(), true, None).unwrap();
        if &got != want {
            let text = tok.render(&messages, tools.as_ref(), true, None).unwrap();
            panic!("conversation {i} differs\nrendered:\n{text}\n got: {got:?}\nwant: {want:?}");
        }
    }
}

#[test]
fn byte_fallback_renders_chatml_bytes() {
    let tok = ChatTokenizer::byte_fallback();
    let text = tok.render_json(r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]"#, None, true).unwrap();
    assert_eq!(text, "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n");
    let ids = tok.encode_text("hé").unwrap();
    assert_eq!(ids, vec![104, 0xc3, 0xa9]);
    assert!(matches!(tok.render_json(r#"{"role":"user"}"#, None, true), Err(ChatError::Messages(_))));
    assert!(matches!(tok.render_json(r#"[{"content":"x"}]"#, None, true), Err(ChatError::Messages(_))));
}

#[test]
fn tojson_matches_python_json_dumps() {
    let tok = ChatTokenizer::byte_fallback();
    let v = ChatValue::from_json(r#"{"b": 1, "a": [1.0, 2.5, "é\n\"", null, true, {}], "c": 1e20}"#).unwrap();
    let mut env = Environment::new();
    env.add_filter("tojson", pyjson::tojson);
    let out = env.render_str("{{ v | tojson }}", minijinja::context! { v => v.0 }).unwrap();
    assert_eq!(out, r#"{"b": 1, "a": [1.0, 2.5, "é\n\"", null, true, {}], "c": 1e+20}"#);
    drop(tok);
}
