//! Seeded generator of chat requests (OpenAI and Anthropic bodies' template input), shared by
//! the tests and the benchmark. Covers system prompts, multi-turn, tools with tool calls and
//! results, reasoning, multi-part content, unicode (accents, CJK, emoji), code and odd
//! whitespace. Deterministic for a seed.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value as Json};

const SNIPPETS: &[&str] = &[
    "The quick brown fox jumps over the lazy dog.",
    "Could you explain how prefix caching works in vLLM?",
    "Grüße aus Köln — ça va? Ünïcödé ½ ∑ ≠ ∞.",
    "你好，世界！这是一个测试。日本語のテキストも少し。",
    "Emoji time 🚀🔥👩‍💻 and flags 🇩🇪🇯🇵 — done ✅",
    "```rust\nfn main() {\n\tlet v: Vec<u32> = (0..10).collect();\n\tprintln!(\"{:?}\", v);\n}\n```",
    "```python\ndef f(x):\n    return {\"a\": x, 'b': [1, 2.5, None]}\n```",
    "  leading spaces, trailing spaces   ",
    "Line one\r\nLine two\r\n\r\nLine four",
    "Numbers: 3.14159, 1e-7, 42, -0, 1,000,000.",
    "Tabs\tand\tmore\t\ttabs",
    "<b>html-ish</b> & entities &amp; \"quotes\" 'single'",
    "What's the weather like in Paris tomorrow? I'm planning a trip.",
    "\n\nA paragraph after blank lines.\n\n",
    "Special-looking text: <think> not really </think> and <tool_call> inline",
];

pub fn text(rng: &mut StdRng, snippets: usize) -> String {
    let mut out = String::new();
    for i in 0..snippets.max(1) {
        if i > 0 {
            out.push_str(["\n", " ", "\n\n", ""].choose(rng).copied().unwrap_or(" "));
        }
        out.push_str(SNIPPETS.choose(rng).copied().unwrap_or("x"));
    }
    out
}

fn tools(rng: &mut StdRng) -> Vec<Json> {
    let all = vec![
        json!({"type": "function", "function": {"name": "get_weather", "description": "Get the weather, in °C",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1.0, "maximum": 1e20}}, "required": ["city"]}}}),
        json!({"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "検索クエリ"}}}}}),
        json!({"type": "function", "function": {"name": "run_code", "description": "Run code", "strict": true,
            "parameters": {"properties": {"code": {"type": "string"}, "timeout": {"type": "number", "default": 0.5}}, "type": "object"}}}),
    ];
    let n = rng.gen_range(1..=all.len());
    all.into_iter().take(n).collect()
}

fn arguments(rng: &mut StdRng) -> Json {
    let obj = json!({"city": text(rng, 1), "days": rng.gen_range(1..9), "ratio": 0.25, "tags": ["a", "ü"]});
    match rng.gen_range(0..3) {
        0 => obj,
        1 => Json::String(obj.to_string()),
        _ => Json::String(serde_json::to_string_pretty(&obj).unwrap_or_default()),
    }
}

fn user_content(rng: &mut StdRng, size: usize) -> Json {
    if rng.gen_bool(0.2) {
        json!([{"type": "text", "text": text(rng, size)}, {"type": "text", "text": text(rng, 1)}])
    } else {
        Json::String(text(rng, size))
    }
}

/// An OpenAI chat template input with `turns` user turns of about `size` snippets each.
pub fn openai(rng: &mut StdRng, turns: usize, size: usize) -> Json {
    let mut messages = Vec::new();
    if rng.gen_bool(0.7) {
        messages.push(json!({"role": "system", "content": text(rng, size)}));
    }
    let with_tools = rng.gen_bool(0.4);
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": user_content(rng, size)}));
        if t + 1 == turns {
            break;
        }
        if with_tools && rng.gen_bool(0.5) {
            let call = json!({"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments(rng)}});
            let content = if rng.gen_bool(0.5) { json!("") } else { json!(text(rng, 1)) };
            messages.push(json!({"role": "assistant", "content": content, "tool_calls": [call]}));
            for _ in 0..rng.gen_range(1..3) {
                messages.push(json!({"role": "tool", "tool_call_id": "c1", "content": text(rng, 1)}));
            }
            if rng.gen_bool(0.5) {
                continue;
            }
        }
        let answer = match rng.gen_range(0..3) {
            0 => json!({"role": "assistant", "content": format!("<think>\n{}\n</think>\n\n{}", text(rng, 1), text(rng, size))}),
            1 => json!({"role": "assistant", "content": text(rng, size), "reasoning": text(rng, 1)}),
            _ => json!({"role": "assistant", "content": text(rng, size)}),
        };
        messages.push(answer);
    }
    let mut input = json!({"messages": messages});
    if with_tools {
        input["tools"] = Json::Array(tools(rng));
    }
    if rng.gen_bool(0.15) {
        input["chat_template_kwargs"] = json!({"enable_thinking": false});
    }
    input
}

/// An Anthropic `/v1/messages` template input.
pub fn anthropic(rng: &mut StdRng, turns: usize, size: usize) -> Json {
    let mut messages = Vec::new();
    for t in 0..turns {
        let mut blocks = vec![json!({"type": "text", "text": text(rng, size)})];
        if t > 0 && rng.gen_bool(0.4) {
            blocks.insert(0, json!({"type": "tool_result", "tool_use_id": "tu1", "content": [{"type": "text", "text": text(rng, 1)}, {"type": "text", "text": "second"}]}));
        }
        messages.push(json!({"role": "user", "content": blocks}));
        if t + 1 == turns {
            break;
        }
        let mut reply = vec![json!({"type": "text", "text": text(rng, size)})];
        if rng.gen_bool(0.3) {
            reply.insert(0, json!({"type": "thinking", "thinking": text(rng, 1), "signature": "sig"}));
        }
        if rng.gen_bool(0.4) {
            reply.push(json!({"type": "tool_use", "id": "tu1", "name": "get_weather", "input": {"city": text(rng, 1), "n": 2}}));
        }
        messages.push(json!({"role": "assistant", "content": reply}));
    }
    let system = if rng.gen_bool(0.5) { json!(text(rng, size)) } else { json!([{"type": "text", "text": text(rng, 1)}, {"type": "text", "text": text(rng, 1)}]) };
    let mut input = json!({"system": system, "messages": messages});
    if rng.gen_bool(0.4) {
        input["tools"] = json!([{"name": "get_weather", "description": "Weather ☀", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    }
    input
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}
