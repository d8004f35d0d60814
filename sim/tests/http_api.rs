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
    let r = client.post(format!("{w1}/v1/messages/count_tokens")).body(r#"{"messages": "nope"}"#).send().await.unwrap();
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

    // Errors in Anthropic's shape.
    let r = post(json!({"messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(r.status().as_u16(), 400, "max_tokens is required");
    let e: Value = r.json().await.unwrap();
    assert_eq!((e["type"].as_str(), e["error"]["type"].as_str()), (Some("error"), Some("invalid_request_error")), "{e}");
    assert!(e["error"]["message"].as_str().is_some_and(|m| m.contains("max_tokens")), "{e}");
    let r = post(json!({"model": "other", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["type"], "not_found_error");
}
