//! The load-time self-check of [`super::PrefixRenderer`]: synthetic conversations are rendered
//! turn by turn through the prefix cache and in full; any difference turns the shortcut off
//! for this template. The shapes cover what is known to make templates look across messages:
//! leading and inline system prompts, tools, tool-call loops with grouped tool results, user
//! messages that wrap tool results, reasoning (field and inline `<think>`), empty content and
//! template kwargs. Passing is evidence, not proof; tests/prefix_render.rs adds random
//! conversations for the templates we ship against.

use super::PrefixRenderer;
use crate::chat::ChatTemplate;
use crate::input::{self, RenderSettings};
use kvroute_core::request::Api;
use serde_json::{json, Value as Json};

fn conversations() -> Vec<Json> {
    let sys = json!({"role": "system", "content": "You are terse."});
    let u = |t: &str| json!({"role": "user", "content": t});
    let a = |t: &str| json!({"role": "assistant", "content": t});
    let think = json!({"role": "assistant", "content": "<think>\nhm\n</think>\n\nok"});
    let reasoning = json!({"role": "assistant", "content": "done", "reasoning": "because"});
    let call = json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]});
    let tool = |t: &str| json!({"role": "tool", "tool_call_id": "c", "content": t});
    let wrapped = u("<tool_response>\nr\n</tool_response>");
    let tools = json!([{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]);
    vec![
        json!({"messages": [sys, u("q1"), think, u("q2"), reasoning, u("q3"), a("a3"), u("q4")]}),
        json!({"messages": [u("q1"), call, tool("r1"), tool("r2"), reasoning, u("q2"), call, tool("r3"), think, u("q3")], "tools": tools}),
        json!({"messages": [sys, u("q1"), reasoning, wrapped, think, u("q2"), think, wrapped, reasoning, u("q3")], "tools": tools}),
        json!({"messages": [sys, u("q1"), a("a1"), sys, u("q2"), a(""), u(""), think, u("q3")], "chat_template_kwargs": {"enable_thinking": false}}),
        json!({"messages": [u("q1"), reasoning, u("q2"), call, tool("r"), u("q3"), think], "add_generation_prompt": false}),
    ]
}

/// Every prefix of `conv` as a request, in order, then the whole conversation once more.
fn turns(conv: &Json) -> Vec<String> {
    let messages = conv["messages"].as_array().cloned().unwrap_or_default();
    let mut out: Vec<String> = (1..=messages.len())
        .map(|n| {
            let mut step = conv.clone();
            step["messages"] = Json::Array(messages[..n].to_vec());
            step.to_string()
        })
        .collect();
    out.push(conv.to_string());
    out
}

/// Whether every turn renders identically through `probe` and in full.
pub(super) fn passes(probe: &PrefixRenderer, template: &ChatTemplate, settings: &RenderSettings) -> bool {
    conversations().iter().flat_map(turns).all(|text| {
        let full = input::parse(&text, Api::ChatCompletions, template.source(), settings).and_then(|p| template.render(&p.render));
        match (probe.render(&text, Api::ChatCompletions, template, settings), full) {
            (Some(got), Ok(want)) => got.text == want,
            (Some(_), Err(_)) => false,
            (None, _) => true,
        }
    })
}
