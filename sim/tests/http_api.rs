//! The OpenAI surface over real HTTP: cached tokens on a repeat, worker identification,
//! streaming shape, validation errors, /tokenize, /metrics agreeing with /sim/state,
//! prefix-cache reset.

mod common;

use common::*;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_usage_metrics_and_errors() {
    let cluster = start(2, 400).await;
    let client = reqwest::Client::new();
    let w1 = cluster.layout[1].http.clone();

    // Identification.
    let r = client.get(format!("{w1}/health")).send().await.unwrap();
    assert_eq!(r.headers()["x-sim-worker"], "1");

    // Repeat of a 100-token prompt: 6 full blocks cached the second time.
    let prompt: Vec<u32> = (500..600).collect();
    let a = complete(&client, &w1, prompt.clone(), 4).await;
    let b = complete(&client, &w1, prompt.clone(), 4).await;
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], 96);
    assert_eq!(b["usage"]["completion_tokens"], 4);
    assert_eq!(b["choices"][0]["finish_reason"], "length");

    // Streaming: one chunk per token, usage chunk, [DONE].
    let body = json!({"prompt": "some text prompt", "max_tokens": 5, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let text = client.post(format!("{w1}/v1/completions")).json(&body).send().await.unwrap().text().await.unwrap();
    let chunks: Vec<&str> = text.split("\n\n").filter(|c| !c.is_empty()).collect();
    assert_eq!(chunks.len(), 5 + 2, "{text}");
    assert_eq!(*chunks.last().unwrap(), "data: [DONE]");
    let usage: Value = serde_json::from_str(chunks[5].trim_start_matches("data: ")).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert_eq!(usage["usage"]["prompt_tokens"], 16, "byte fallback: one token per byte");

    // Chat without ignore_eos stops at eos_after (4 in tests).
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let chat: Value = client.post(format!("{w1}/v1/chat/completions")).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(chat["choices"][0]["finish_reason"], "stop");
    assert_eq!(chat["usage"]["completion_tokens"], 4);

    // /tokenize agrees with the chat path.
    let tok: Value = client.post(format!("{w1}/tokenize")).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(tok["count"], chat["usage"]["prompt_tokens"]);
    assert_eq!(tok["sim_tokenizer"], "byte-fallback");

    // Anthropic's messages.count_tokens: what /v1/messages prefills for the same body.
    let msgs = json!({"model": "kvroute/sim-27b-fp8", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let prefilled: Value = client.post(format!("{w1}/v1/messages")).json(&msgs).send().await.unwrap().json().await.unwrap();
    let counted: Value = client.post(format!("{w1}/v1/messages/count_tokens")).json(&json!({"model": "kvroute/sim-27b-fp8", "messages": msgs["messages"]})).send().await.unwrap().json().await.unwrap();
    let whole_prompt = prefilled["usage"]["input_tokens"].as_u64().unwrap() + prefilled["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0);
    assert_eq!(counted["input_tokens"].as_u64(), Some(whole_prompt), "{counted} {prefilled}");
    assert_eq!(counted["context_management"]["original_input_tokens"], counted["input_tokens"]);
    let r = client.post(format!("{w1}/v1/messages/count_tokens")).body(r#"{"model": "kvroute/sim-27b-fp8", "messages": "nope"}"#).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["type"], "error", "Anthropic's error shape");

    // The answer is the decoding of the ids the worker cached: streamed pieces concatenate to
    // the (same prompt, same answer) non-streamed text, and turn two, re-sending it, hits the
    // answer's full blocks too (all but the last generated token were computed).
    let turn1 = vec![json!({"role": "user", "content": "Explain prefix caching, please."})];
    let ask = |messages: &Vec<Value>, stream: bool| json!({"messages": messages, "max_tokens": 40, "ignore_eos": true, "stream": stream});
    let whole: Value = client.post(format!("{w1}/v1/chat/completions")).json(&ask(&turn1, false)).send().await.unwrap().json().await.unwrap();
    let answer = whole["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let sse = client.post(format!("{w1}/v1/chat/completions")).json(&ask(&turn1, true)).send().await.unwrap().text().await.unwrap();
    let deltas: Vec<Value> = sse.split("\n\n").filter_map(|c| serde_json::from_str(c.strip_prefix("data: ")?).ok()).collect();
    let streamed: String = deltas.iter().filter_map(|d| d["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!((streamed.as_str(), deltas.len()), (answer.as_str(), 1 + 40), "{sse}");
    let prompt1 = whole["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut turn2 = turn1.clone();
    turn2.extend([json!({"role": "assistant", "content": answer}), json!({"role": "user", "content": "And routing?"})]);
    let next: Value = client.post(format!("{w1}/v1/chat/completions")).json(&ask(&turn2, false)).send().await.unwrap().json().await.unwrap();
    assert_eq!(next["usage"]["prompt_tokens_details"]["cached_tokens"], (prompt1 + 40 - 1) / 16 * 16, "{next}");

    // Bad input: 4xx with a message, never a 500.
    for (path, body, code) in [
        ("/v1/completions", r#"{"prompt": []}"#, 400),
        ("/v1/completions", r#"{"prompt": [1,2], "max_tokens": -1}"#, 400),
        ("/v1/completions", r#"{"prompt": [1,2], "max_tokens": 999999}"#, 400),
        ("/v1/completions", r#"not json"#, 400),
        ("/v1/completions", r#"{"prompt": "x", "model": "other"}"#, 404),
        ("/v1/chat/completions", r#"{"messages": "nope"}"#, 400),
        ("/v1/chat/completions", r#"{"messages": [{"content": "no role"}]}"#, 400),
        ("/sim/fault", r#"{"drop_fraction": 2}"#, 400),
        ("/tokenize", r#"{}"#, 400),
    ] {
        let r = client.post(format!("{w1}{path}")).body(body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), code, "{path} {body}");
        let e: Value = r.json().await.unwrap();
        assert!(e["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    }

    // Metrics agree with the engine's own state.
    let st = state(&client, &w1).await;
    let m = client.get(format!("{w1}/metrics")).send().await.unwrap().text().await.unwrap();
    let l = format!("{{model_name=\"{}\",engine=\"0\"}}", cluster.layout[1].model);
    let get = |n: &str| kvroute_sim::metrics::sample(&m, &format!("{n}{l}")).unwrap();
    assert_eq!(get("vllm:prefix_cache_hits_total"), st["stats"]["prefix_cache_hits"].as_f64().unwrap());
    assert_eq!(get("vllm:prefix_cache_queries_total"), st["stats"]["prefix_cache_queries"].as_f64().unwrap());
    assert_eq!(get("vllm:generation_tokens_total"), st["stats"]["generation_tokens"].as_f64().unwrap());
    assert_eq!(get("vllm:kv_cache_usage_perc"), st["kv_cache_usage"].as_f64().unwrap());
    assert_eq!(get("vllm:num_requests_running"), 0.0);
    assert_eq!(get("vllm:time_to_first_token_seconds_count"), 8.0, "every generation above (count_tokens generates nothing)");

    // Reset: cache emptied; the other worker untouched.
    let r: Value = client.post(format!("{w1}/reset_prefix_cache")).send().await.unwrap().json().await.unwrap();
    assert_eq!(r["reset"], true);
    assert!(engine_blocks(&state(&client, &w1).await).is_empty());
    let c = complete(&client, &w1, prompt, 1).await;
    assert_eq!(c["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let w0 = state(&client, &cluster.layout[0].http).await;
    assert_eq!(w0["stats"]["requests_finished"], 0);
}

/// `/v1/messages` as vLLM's Anthropic endpoint serves it: the request converts to the same
/// prompt as the equivalent chat request; usage splits cache reads out of `input_tokens`;
/// the stream is Anthropic's event sequence and carries the same text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages() {
    let cluster = start(1, 400).await;
    let client = reqwest::Client::new();
    let w = cluster.layout[0].http.clone();
    let post = |body: Value| {
        let (client, url) = (client.clone(), format!("{w}/v1/messages"));
        async move { client.post(url).json(&body).send().await.unwrap() }
    };
    let system = "You are a careful assistant who answers in one short sentence.";
    let question = "What does a prefix cache store?";
    let ask = |stream: bool| json!({"model": cluster.layout[0].model, "max_tokens": 5, "ignore_eos": true, "stream": stream,
        "system": system, "messages": [{"role": "user", "content": [{"type": "text", "text": question}]}]});

    let chat = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]});
    let tok: Value = client.post(format!("{w}/tokenize")).json(&chat).send().await.unwrap().json().await.unwrap();
    let prompt = tok["count"].as_u64().unwrap();

    let first: Value = post(ask(false)).await.json().await.unwrap();
    assert_eq!((first["type"].as_str(), first["role"].as_str(), first["stop_reason"].as_str()), (Some("message"), Some("assistant"), Some("max_tokens")), "{first}");
    assert_eq!(first["usage"]["input_tokens"].as_u64(), Some(prompt), "same prompt as the chat request: {first}");
    assert_eq!((first["usage"]["output_tokens"].as_u64(), first["usage"]["cache_read_input_tokens"].as_u64()), (Some(5), Some(0)));
    let text = first["content"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());

    let sse = post(ask(true)).await.text().await.unwrap();
    let events: Vec<(String, Value)> = sse
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.strip_prefix("event: ").and_then(|e| e.split_once("\ndata: ")).unwrap_or_else(|| panic!("event shape: {e:?}"));
            (name.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec!["message_start", "content_block_start"];
    want.extend(["content_block_delta"; 5]);
    want.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, want, "{sse}");
    assert!(events.iter().all(|(n, v)| v["type"] == n.as_str()));
    let streamed: String = events.iter().filter_map(|(_, v)| v["delta"]["text"].as_str()).collect();
    assert_eq!(streamed, text, "same prompt, same answer");
    // The repeat found the prompt's full blocks cached: message_start counts the whole prompt
    // (vLLM's first chunk has no cache details), message_delta splits out the cache reads.
    let cached = prompt / 16 * 16;
    assert_eq!(events[0].1["message"]["usage"]["input_tokens"].as_u64(), Some(prompt), "{sse}");
    let done = &events[events.len() - 2].1;
    assert_eq!(done["delta"]["stop_reason"], "max_tokens");
    assert_eq!(done["usage"]["input_tokens"].as_u64(), Some(prompt - cached));
    assert_eq!(done["usage"]["output_tokens"].as_u64(), Some(5));

    // Without ignore_eos the answer ends at the simulated EOS: end_turn.
    let mut natural = ask(false);
    natural["max_tokens"] = json!(50);
    natural["ignore_eos"] = json!(false);
    let r: Value = post(natural).await.json().await.unwrap();
    assert_eq!(r["stop_reason"], "end_turn", "{r}");

    // A body failing the request model's validation: vLLM's validation error, OpenAI-shaped.
    let r = post(json!({"model": cluster.layout[0].model, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(r.status().as_u16(), 400, "max_tokens is required");
    let e: Value = r.json().await.unwrap();
    assert_eq!((e["error"]["type"].as_str(), e["error"]["param"].as_str()), (Some("Bad Request"), Some("body.max_tokens")), "{e}");
    assert!(e["error"]["message"].as_str().is_some_and(|m| m.contains("Field required")), "{e}");
    // What the handler refuses: Anthropic's shape.
    let r = post(json!({"model": "other", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["type"], "not_found_error");
}

/// SSE events `event: <type>\ndata: <json>\n\n` as (type, data).
fn sse_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.strip_prefix("event: ").and_then(|e| e.split_once("\ndata: ")).unwrap_or_else(|| panic!("event shape: {e:?}"));
            (name.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

/// `ResponsesResponse`'s fields in the order vLLM 0.33's pydantic model dumps them
/// (`metrics` is left out when unset).
const RESPONSE_FIELDS: &[&str] = &[
    "id", "created_at", "incomplete_details", "instructions", "metadata", "model", "object", "output", "parallel_tool_calls",
    "temperature", "tool_choice", "tools", "top_p", "background", "max_output_tokens", "max_tool_calls", "previous_response_id",
    "prompt", "prompt_cache_options", "prompt_cache_key", "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier",
    "status", "text", "top_logprobs", "truncation", "usage", "user", "presence_penalty", "frequency_penalty", "kv_transfer_params",
    "ec_transfer_params", "input_messages", "output_messages",
];

/// `/v1/responses` as vLLM 0.33 serves it: the response object and its field order, the
/// streamed event sequence, a three-turn `previous_response_id` conversation whose turns hit
/// the previous turns' cached blocks, GET / cancel / 404 shapes, DELETE (no such route).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_api() {
    let cluster = start(1, 400).await;
    let client = reqwest::Client::new();
    let w = cluster.layout[0].http.clone();
    let model = cluster.layout[0].model.clone();
    let post = |path: &str, body: Value| {
        let (client, url) = (client.clone(), format!("{w}{path}"));
        async move { client.post(url).json(&body).send().await.unwrap() }
    };
    let tokens = |messages: Value| {
        let (client, url) = (client.clone(), format!("{w}/tokenize"));
        async move {
            let r: Value = client.post(url).json(&json!({"messages": messages})).send().await.unwrap().json().await.unwrap();
            r["count"].as_u64().unwrap()
        }
    };
    let system = "You answer in one short paragraph.";
    let q1 = "Explain prefix caching, please.";

    // Plain: the prompt is the chat prompt of [system: instructions, user: input]; status
    // incomplete when max_output_tokens cuts the answer.
    let ask = json!({"model": model, "instructions": system, "input": q1, "max_output_tokens": 40, "ignore_eos": true});
    let r = post("/v1/responses", ask.clone()).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-sim-dp-rank"));
    let text = r.text().await.unwrap();
    assert!(text.starts_with(r#"{"id":"resp_"#), "id first, as pydantic dumps it: {text}");
    let t1: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(keys(&t1), RESPONSE_FIELDS);
    let id1 = t1["id"].as_str().unwrap().to_string();
    assert_eq!(id1.len(), "resp_".len() + 32, "resp_ + uuid4 hex: {id1}");
    assert_eq!((t1["object"].as_str(), t1["status"].as_str(), t1["model"].as_str()), (Some("response"), Some("incomplete"), Some(model.as_str())));
    assert_eq!(t1["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!((t1["instructions"].as_str(), t1["max_output_tokens"].as_u64(), t1["tool_choice"].as_str()), (Some(system), Some(40), Some("none")));
    assert_eq!((t1["temperature"].as_f64(), t1["top_p"].as_f64(), t1["background"].as_bool()), (Some(1.0), Some(1.0), Some(false)));
    let item = &t1["output"][0];
    assert_eq!(keys(item), ["id", "content", "role", "status", "type", "phase"]);
    assert!(item["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!((item["type"].as_str(), item["role"].as_str(), item["status"].as_str()), (Some("message"), Some("assistant"), Some("incomplete")));
    let part = &item["content"][0];
    assert_eq!(keys(part), ["annotations", "text", "type", "logprobs"]);
    assert_eq!(part["type"], "output_text");
    let answer1 = part["text"].as_str().unwrap().to_string();
    assert_eq!(answer1.len(), 40, "byte fallback: one byte a token");
    let p1 = tokens(json!([{"role": "system", "content": system}, {"role": "user", "content": q1}])).await;
    let u = &t1["usage"];
    assert_eq!(keys(u), ["input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details", "total_tokens"]);
    assert_eq!((u["input_tokens"].as_u64(), u["output_tokens"].as_u64(), u["total_tokens"].as_u64()), (Some(p1), Some(40), Some(p1 + 40)));
    assert_eq!(u["input_tokens_details"], json!({"cached_tokens": 0, "cache_write_tokens": p1 / 16 * 16, "input_tokens_per_turn": [], "cached_tokens_per_turn": []}));
    assert_eq!(u["output_tokens_details"], json!({"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []}));

    // GET returns the stored response as it was answered; cancel refuses a finished one.
    let got = client.get(format!("{w}/v1/responses/{id1}")).send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.json::<Value>().await.unwrap(), t1);
    let r = post(&format!("/v1/responses/{id1}/cancel"), json!({})).await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": {"message": "Cannot cancel a synchronous response.", "type": "invalid_request_error", "param": "response_id", "code": 400}})
    );

    // Streamed: the same prompt, so the same answer, now with its blocks cached.
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let r = post("/v1/responses", streamed).await;
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let events = sse_events(&r.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec!["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"];
    want.extend(["response.output_text.delta"; 40]);
    want.extend(["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]);
    assert_eq!(names, want);
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!((data["type"].as_str(), data["sequence_number"].as_u64()), (Some(name.as_str()), Some(i as u64)), "{data}");
    }
    let created = &events[0].1["response"];
    assert_eq!(keys(created), RESPONSE_FIELDS);
    assert!(created["id"].as_str().unwrap().starts_with("resp_") && created["id"] != t1["id"]);
    assert_eq!((created["status"].as_str(), created["output"].as_array().map(Vec::len), &created["usage"]), (Some("in_progress"), Some(0), &Value::Null));
    assert_eq!(keys(&events[2].1), ["item", "output_index", "sequence_number", "type"]);
    assert_eq!((events[2].1["item"]["status"].as_str(), events[2].1["item"]["content"].as_array().map(Vec::len)), (Some("in_progress"), Some(0)));
    assert_eq!(keys(&events[4].1), ["content_index", "delta", "item_id", "logprobs", "output_index", "sequence_number", "type"]);
    let deltas: String = events.iter().filter_map(|(_, d)| d["delta"].as_str()).collect();
    assert_eq!(deltas, answer1, "same prompt, same answer");
    let item_id = events[2].1["item"]["id"].as_str().unwrap();
    assert!(events[3..events.len() - 1].iter().all(|(_, d)| d["item_id"].as_str().or(d["item"]["id"].as_str()) == Some(item_id)));
    assert_eq!(events[44].1["text"].as_str(), Some(answer1.as_str()));
    let done = &events.last().unwrap().1["response"];
    assert_eq!((done["id"].as_str(), done["status"].as_str()), (created["id"].as_str(), Some("incomplete")));
    assert_eq!(done["output"][0]["id"].as_str(), Some(item_id), "the final response reuses the streamed item");
    assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"].as_u64(), Some(p1 / 16 * 16), "the repeat hit the prompt's full blocks");
    let got: Value = client.get(format!("{w}/v1/responses/{}", done["id"].as_str().unwrap())).send().await.unwrap().json().await.unwrap();
    assert_eq!(&got, done, "a streamed response is stored too");

    // Without ignore_eos the answer ends at the simulated EOS: completed.
    let r: Value = post("/v1/responses", json!({"input": "hi", "store": false})).await.json().await.unwrap();
    assert_eq!((r["status"].as_str(), r["incomplete_details"].clone(), r["output"][0]["status"].as_str()), (Some("completed"), Value::Null, Some("completed")));
    assert_eq!(client.get(format!("{w}/v1/responses/{}", r["id"].as_str().unwrap())).send().await.unwrap().status(), 404, "store: false");

    // Three turns by previous_response_id: each prompt is instructions + the stored
    // conversation + its output + the new input, so it starts with the last turn's prompt and
    // answer and hits their blocks (all but the last generated token were computed).
    let q2 = "And how does routing use it?";
    let t2: Value = post("/v1/responses", json!({"instructions": system, "input": q2, "previous_response_id": id1, "max_output_tokens": 30, "ignore_eos": true}))
        .await
        .json()
        .await
        .unwrap();
    let answer2 = t2["output"][0]["content"][0]["text"].as_str().unwrap().to_string();
    let convo2 = json!([{"role": "system", "content": system}, {"role": "user", "content": q1}, {"role": "assistant", "content": answer1},
        {"role": "user", "content": q2}]);
    let p2 = tokens(convo2.clone()).await;
    assert_eq!(t2["previous_response_id"].as_str(), Some(id1.as_str()));
    assert_eq!(t2["usage"]["input_tokens"].as_u64(), Some(p2), "{t2}");
    let cached2 = t2["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached2 >= p1, "turn 2 hits turn 1's prompt: {cached2} >= {p1}");
    assert_eq!(cached2, (p1 + 40 - 1) / 16 * 16);
    let q3 = "Summarize.";
    let t3: Value = post("/v1/responses", json!({"instructions": system, "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": q3}]}],
        "previous_response_id": t2["id"], "max_output_tokens": 8, "ignore_eos": true}))
    .await
    .json()
    .await
    .unwrap();
    let mut convo3 = convo2.as_array().unwrap().clone();
    convo3.extend([json!({"role": "assistant", "content": answer2}), json!({"role": "user", "content": q3})]);
    assert_eq!(t3["usage"]["input_tokens"].as_u64(), Some(tokens(Value::Array(convo3)).await), "{t3}");
    let cached3 = t3["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached3 >= p2, "turn 3 hits turn 2's prompt: {cached3} >= {p2}");

    // 404s in vLLM's shape; DELETE is not routed by vLLM 0.33 (FastAPI: 405).
    let missing = "resp_nope";
    let not_found = json!({"error": {"message": format!("Response with id '{missing}' not found."), "type": "invalid_request_error", "param": "response_id", "code": 404}});
    let r = client.get(format!("{w}/v1/responses/{missing}")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.json::<Value>().await.unwrap()), (404, not_found.clone()));
    let r = post(&format!("/v1/responses/{missing}/cancel"), json!({})).await;
    assert_eq!((r.status().as_u16(), r.json::<Value>().await.unwrap()), (404, not_found.clone()));
    let r = post("/v1/responses", json!({"input": "x", "previous_response_id": missing})).await;
    assert_eq!((r.status().as_u16(), r.json::<Value>().await.unwrap()), (404, not_found));
    let r = client.delete(format!("{w}/v1/responses/{id1}")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["allow"].to_str().unwrap().to_string()), (405, "GET".to_string()));
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"detail": "Method Not Allowed"}));

    // Validation as vLLM's: request validators raise VLLMValidationError (param named).
    for (body, param, code) in [
        (json!({"input": "x", "background": true, "store": false}), "background", 400),
        (json!({"input": "x", "tool_choice": "required"}), "tool_choice", 400),
        (json!({"instructions": "no input"}), "body.input", 400),
        (json!({"input": "x", "model": "other"}), "", 404),
    ] {
        let r = post("/v1/responses", body.clone()).await;
        assert_eq!(r.status().as_u16(), code, "{body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(keys(&e["error"]), ["message", "type", "param", "code"]);
        if code == 400 {
            assert_eq!(e["error"]["param"], param, "{e}");
        }
    }

    // Background: stored as queued at once, then completed; a background stream replays
    // from `starting_after` on GET ?stream=true.
    let r: Value = post("/v1/responses", json!({"input": "Background please.", "background": true, "max_output_tokens": 20, "ignore_eos": true}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!((r["status"].as_str(), r["background"].as_bool(), r["usage"].clone()), (Some("queued"), Some(true), Value::Null));
    let bid = r["id"].as_str().unwrap().to_string();
    let mut last = Value::Null;
    for _ in 0..200 {
        last = client.get(format!("{w}/v1/responses/{bid}")).send().await.unwrap().json().await.unwrap();
        if last["status"] != "queued" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!((last["status"].as_str(), last["usage"]["output_tokens"].as_u64()), (Some("incomplete"), Some(20)), "{last}");
    let r = post("/v1/responses", json!({"input": "Stream in the background.", "background": true, "stream": true, "max_output_tokens": 5, "ignore_eos": true})).await;
    let live = sse_events(&r.text().await.unwrap());
    assert_eq!(live.len(), 4 + 5 + 4);
    let sid = live[0].1["response"]["id"].as_str().unwrap().to_string();
    let replay = client.get(format!("{w}/v1/responses/{sid}?stream=true&starting_after=3")).send().await.unwrap().text().await.unwrap();
    let replay = sse_events(&replay);
    assert_eq!(replay.len(), live.len() - 4);
    assert_eq!(replay.first().unwrap().1["sequence_number"], 4);
    assert_eq!(replay, live[4..], "the same events");
    let r = client.get(format!("{w}/v1/responses/{id1}?stream=true")).send().await.unwrap();
    assert_eq!(r.status(), 400, "only a background stream replays");

    // Cancelling a long background generation stops it; it stays cancelled.
    let r: Value = post("/v1/responses", json!({"input": "Long.", "background": true, "max_output_tokens": 3000, "ignore_eos": true})).await.json().await.unwrap();
    let lid = r["id"].as_str().unwrap().to_string();
    let c = post(&format!("/v1/responses/{lid}/cancel"), json!({})).await;
    assert_eq!(c.status(), 200);
    let c: Value = c.json().await.unwrap();
    assert_eq!((c["id"].as_str(), c["status"].as_str()), (Some(lid.as_str()), Some("cancelled")));
    let mut running = 1;
    for _ in 0..100 {
        running = state(&client, &w).await["num_requests_running"].as_u64().unwrap();
        if running == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(running, 0, "the engine request was aborted");
    let got: Value = client.get(format!("{w}/v1/responses/{lid}")).send().await.unwrap().json().await.unwrap();
    assert_eq!(got["status"], "cancelled");

    // A restart forgets every stored response, as a real server's restart does.
    let r = post("/sim/fault", json!({"restart": true})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(client.get(format!("{w}/v1/responses/{id1}")).send().await.unwrap().status(), 404);
}

/// `--responses-store false` is vLLM's default (no `VLLM_ENABLE_RESPONSES_API_STORE`): `store`
/// is ignored silently, so nothing can be fetched or continued, and background is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_without_store() {
    use kvroute_sim::cluster::{Cluster, ClusterConfig};
    let cfg = ClusterConfig { http_port: 0, zmq_port: 0, responses_store: false, ..ClusterConfig::default() };
    let cluster = Cluster::start(cfg, std::sync::Arc::new(kvroute_sim::chat::ChatTokenizer::byte_fallback())).await.unwrap();
    let client = reqwest::Client::new();
    let w = cluster.layout[0].http.clone();
    let r: Value = client.post(format!("{w}/v1/responses")).json(&json!({"input": "hi", "max_output_tokens": 2})).send().await.unwrap().json().await.unwrap();
    assert_eq!(r["status"], "incomplete", "{r}");
    let id = r["id"].as_str().unwrap();
    assert_eq!(client.get(format!("{w}/v1/responses/{id}")).send().await.unwrap().status(), 404);
    let r = client.post(format!("{w}/v1/responses")).json(&json!({"input": "x", "previous_response_id": id})).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = client.post(format!("{w}/v1/responses")).json(&json!({"input": "x", "background": true})).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!((e["error"]["type"].as_str(), e["error"]["param"].as_str()), (Some("invalid_request_error"), Some("background")));
    assert!(e["error"]["message"].as_str().unwrap().contains("VLLM_ENABLE_RESPONSES_API_STORE=1"), "{e}");
}

/// `/detokenize` and `/tokenize` in vLLM's shapes: a round trip, token strings, special
/// tokens, validation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_detokenize() {
    let cluster = start(1, 400).await;
    let client = reqwest::Client::new();
    let w = cluster.layout[0].http.clone();
    let post = |path: &str, body: Value| {
        let (client, url) = (client.clone(), format!("{w}{path}"));
        async move { client.post(url).json(&body).send().await.unwrap() }
    };
    let text = "Hello, prefix cache — héllo";
    let tok: Value = post("/tokenize", json!({"prompt": text, "return_token_strs": true})).await.json().await.unwrap();
    assert_eq!(keys(&tok), ["count", "max_model_len", "tokens", "token_strs", "sim_tokenizer"]);
    assert_eq!(tok["count"].as_u64(), Some(text.len() as u64));
    assert_eq!(tok["token_strs"].as_array().map(Vec::len), Some(text.len()));
    let r = post("/detokenize", json!({"model": cluster.layout[0].model, "tokens": tok["tokens"]})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"prompt": text}), "round trip");
    // The chat prompt's special markers survive detokenization.
    let chat: Value = post("/tokenize", json!({"messages": [{"role": "user", "content": "hi"}]})).await.json().await.unwrap();
    assert_eq!(chat["token_strs"], Value::Null);
    let d: Value = post("/detokenize", json!({"tokens": chat["tokens"]})).await.json().await.unwrap();
    assert_eq!(d["prompt"], "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    for (path, body, code) in [
        ("/detokenize", json!({"tokens": [-1]}), 400),
        ("/detokenize", json!({"prompt": "x"}), 400),
        ("/detokenize", json!({"tokens": [1], "model": "other"}), 404),
        ("/tokenize", json!({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true, "continue_final_message": true}), 400),
    ] {
        let r = post(path, body.clone()).await;
        assert_eq!(r.status().as_u16(), code, "{path} {body}");
        assert!(r.json::<Value>().await.unwrap()["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
}
