//! Seeded generator of OpenAI Responses requests (`/v1/responses` bodies' template input) and
//! conversations continued by `previous_response_id`: agent loops of user messages,
//! reasoning items, assistant output messages, parallel function calls and their outputs,
//! in the shapes clients send (SDK output items echoed back with ids, statuses and
//! annotations, and hand-written easy messages).

use super::gen::text;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value as Json};

fn tools(rng: &mut StdRng) -> Json {
    let all = [
        json!({"type": "function", "name": "get_weather", "description": "Get the weather, in °C", "strict": true,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"], "additionalProperties": false}}),
        json!({"type": "function", "name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "検索クエリ"}}}}),
        json!({"type": "web_search_preview"}),
        json!({"type": "custom", "name": "shell", "description": "Run a shell command"}),
        json!({"type": "namespace", "name": "fs", "description": "Files", "tools": [{"type": "function", "name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]}),
    ];
    let n = rng.gen_range(1..=all.len());
    Json::Array(all.into_iter().take(n).collect())
}

fn user(rng: &mut StdRng, size: usize) -> Json {
    match rng.gen_range(0..3) {
        0 => json!({"role": "user", "content": text(rng, size)}),
        1 => json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text(rng, size)}, {"type": "input_text", "text": text(rng, 1)}]}),
        _ => json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text(rng, size)}]}),
    }
}

fn reasoning(rng: &mut StdRng, n: usize, as_output: bool) -> Json {
    if as_output || rng.gen_bool(0.7) {
        json!({"type": "reasoning", "id": format!("rs_{n}"), "summary": [], "content": [{"type": "reasoning_text", "text": text(rng, 1)}]})
    } else {
        json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": text(rng, 1)}]})
    }
}

fn answer(rng: &mut StdRng, size: usize, n: usize, as_output: bool) -> Json {
    if as_output || rng.gen_bool(0.7) {
        json!({"type": "message", "role": "assistant", "id": format!("msg_{n}"), "status": "completed",
               "content": [{"type": "output_text", "text": text(rng, size), "annotations": [], "logprobs": []}]})
    } else {
        json!({"role": "assistant", "content": text(rng, size)})
    }
}

fn call(rng: &mut StdRng, n: usize) -> Json {
    let args = json!({"city": text(rng, 1), "days": rng.gen_range(1..9)});
    let args = if rng.gen_bool(0.5) { args.to_string() } else { serde_json::to_string_pretty(&args).unwrap_or_default() };
    json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": format!("call_{n}"), "name": "get_weather", "arguments": args, "status": "completed"})
}

/// What the model produced in one turn: reasoning, text, calls (vLLM's output item order),
/// as a response's `output` (`as_output`: the full item shapes) or echoed back in an input.
fn model_turn(rng: &mut StdRng, size: usize, n: &mut usize, with_tools: bool, as_output: bool) -> (Vec<Json>, Vec<Json>) {
    let mut items = Vec::new();
    *n += 1;
    if rng.gen_bool(0.5) {
        items.push(reasoning(rng, *n, as_output));
    }
    if !with_tools || rng.gen_bool(0.6) {
        items.push(answer(rng, size, *n, as_output));
    }
    let mut outputs = Vec::new();
    if with_tools && rng.gen_bool(0.6) {
        for _ in 0..rng.gen_range(1..3) {
            *n += 1;
            items.push(call(rng, *n));
            outputs.push(json!({"type": "function_call_output", "call_id": format!("call_{n}"), "output": text(rng, 1)}));
        }
    }
    (items, outputs)
}

fn request(rng: &mut StdRng, input: Json, size: usize, with_tools: bool) -> Json {
    let mut req = json!({"input": input});
    if rng.gen_bool(0.6) {
        req["instructions"] = json!(text(rng, size));
    }
    if with_tools {
        req["tools"] = tools(rng);
    }
    if rng.gen_bool(0.15) {
        req["chat_template_kwargs"] = json!({"enable_thinking": false});
    }
    req
}

/// A Responses request whose `input` is a whole agent loop of `turns` user turns.
pub fn responses(rng: &mut StdRng, turns: usize, size: usize) -> Json {
    let with_tools = rng.gen_bool(0.5);
    let mut items = Vec::new();
    let mut n = 0;
    for t in 0..turns {
        items.push(user(rng, size));
        if t + 1 == turns {
            break;
        }
        loop {
            let (turn, outputs) = model_turn(rng, size, &mut n, with_tools, false);
            items.extend(turn);
            if outputs.is_empty() {
                break;
            }
            items.extend(outputs);
        }
    }
    let input = if items.len() == 1 && rng.gen_bool(0.3) { json!(text(rng, size)) } else { Json::Array(items) };
    request(rng, input, size, with_tools)
}

/// A conversation continued by `previous_response_id`: `{"previous": [{"request", "output"}],
/// "request"}`, each turn sending only what is new (a user message, or the outputs of the
/// previous response's function calls).
pub fn responses_chain(rng: &mut StdRng, turns: usize, size: usize) -> Json {
    let with_tools = rng.gen_bool(0.6);
    let mut previous = Vec::new();
    let mut n = 0;
    let mut input = if rng.gen_bool(0.5) { json!(text(rng, size)) } else { json!([user(rng, size)]) };
    for _ in 1..turns {
        let req = request(rng, input, size, with_tools);
        let (output, outputs) = model_turn(rng, size, &mut n, with_tools, true);
        previous.push(json!({"request": req, "output": output}));
        input = if outputs.is_empty() { json!(text(rng, size)) } else { Json::Array(outputs) };
    }
    json!({"previous": previous, "request": request(rng, input, size, with_tools)})
}
