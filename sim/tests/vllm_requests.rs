//! Request semantics that the workers' token counters depend on, as vLLM 0.33 has them:
//! a client that disconnects aborts its engine request (every generation endpoint, streamed
//! or not; a background Responses request is not aborted); a missing model is the served
//! one; the output-limit fields and their precedence; `n` choices and prompt lists, each its
//! own engine request, counted in the worker's metrics; bodies nested as deep as Python's
//! JSON decoder takes them.
//!
//! Disconnects are real: a raw loopback socket sends the request and is dropped. Waiting for
//! an effect polls `/sim/state` (bounded), never a fixed sleep.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "kvroute/sim-27b-fp8";

/// Polls `/sim/state` until `done` holds (at most ~10 s); returns that state.
async fn until(client: &reqwest::Client, http: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..1000 {
        let st = state(client, http).await;
        if done(&st) {
            return st;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}: {}", state(client, http).await);
}

fn stat(st: &Value, k: &str) -> u64 {
    st["stats"][k].as_u64().unwrap_or_else(|| panic!("stats.{k}: {st}"))
}

fn idle(st: &Value) -> bool {
    st["num_requests_running"] == 0 && st["num_requests_waiting"] == 0
}

/// Opens a connection and sends `body` to `path` as one HTTP/1.1 request.
async fn send_raw(http: &str, path: &str, body: &Value) -> TcpStream {
    let addr = http.trim_start_matches("http://");
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let body = body.to_string();
    let head = format!("POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(body.as_bytes()).await.unwrap();
    sock
}

/// The four generation endpoints with a body asking for a long answer (`max` tokens).
fn long_requests(max: u64, stream: bool) -> Vec<(&'static str, Value)> {
    let messages = json!([{"role": "user", "content": "Tell me a long story."}]);
    vec![
        ("/v1/chat/completions", json!({"messages": messages, "max_tokens": max, "ignore_eos": true, "stream": stream})),
        ("/v1/completions", json!({"prompt": "Once upon a time", "max_tokens": max, "ignore_eos": true, "stream": stream})),
        ("/v1/responses", json!({"input": "Tell me a long story.", "max_output_tokens": max, "ignore_eos": true, "stream": stream, "store": false})),
        ("/v1/messages", json!({"model": MODEL, "messages": messages, "max_tokens": max, "ignore_eos": true, "stream": stream})),
    ]
}

/// For every endpoint, streamed or not: once the request is generating, the client goes
/// away; the worker aborts the request (counted), frees its blocks and stops generating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_aborts_its_request_on_every_endpoint() {
    // 3.7 ms a decode step: 5000 tokens would take ~18 s, far longer than an abort.
    let cluster = start_dp(1, 1, 400, 0.1).await;
    let client = reqwest::Client::new();
    let w = cluster.layout[0].http.clone();
    let free = state(&client, &w).await["num_free_blocks"].as_u64().unwrap();
    let mut aborted = 0;
    for stream in [false, true] {
        for (path, body) in long_requests(5000, stream) {
            let before = stat(&state(&client, &w).await, "generation_tokens");
            let mut sock = send_raw(&w, path, &body).await;
            if stream {
                // The headers and the first event(s) arrive once the first token is out.
                let mut buf = [0u8; 4096];
                assert!(sock.read(&mut buf).await.unwrap() > 0, "{path}: the stream started");
            }
            until(&client, &w, &format!("{path} generating"), |st| stat(st, "generation_tokens") >= before + 2).await;
            drop(sock);
            aborted += 1;
            let st = until(&client, &w, &format!("{path} (stream: {stream}) aborted"), |st| idle(st) && stat(st, "requests_aborted") == aborted).await;
            assert_eq!(st["num_free_blocks"].as_u64(), Some(free), "{path}: its blocks are free");
            assert_eq!(stat(&st, "requests_finished"), 0, "{path}: never finished");
            let generated = stat(&st, "generation_tokens") - before;
            assert!((2..5000).contains(&generated), "{path}: {generated} tokens");
            // Nothing more is generated or counted after the abort.
            let again = state(&client, &w).await;
            assert_eq!(stat(&again, "generation_tokens"), stat(&st, "generation_tokens"), "{path}");
        }
    }
    // The metrics are the engine's counters.
    let m = client.get(format!("{w}/metrics")).send().await.unwrap().text().await.unwrap();
    let l = format!("{{model_name=\"{MODEL}\",engine=\"0\"}}");
    let st = state(&client, &w).await;
    assert_eq!(kvroute_sim::metrics::sample(&m, &format!("kvroute_sim_requests_aborted_total{l}")), Some(8.0));
    assert_eq!(kvroute_sim::metrics::sample(&m, &format!("vllm:generation_tokens_total{l}")), Some(stat(&st, "generation_tokens") as f64));
    assert_eq!(kvroute_sim::metrics::sample(&m, &format!("vllm:prompt_tokens_total{l}")), Some(stat(&st, "prompt_tokens") as f64));
}

/// A request still queued when its client leaves is dropped from the queue at once: it is
/// never scheduled, so its prompt is never computed or counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_whose_client_leaves_is_never_scheduled() {
    use kvroute_sim::engine::EngineConfig;
    let cluster = start_engine(EngineConfig { max_num_seqs: 1, num_gpu_blocks: 400, time_scale: 0.1, ..EngineConfig::default() }).await;
    let client = reqwest::Client::new();
    let w = cluster.layout[0].http.clone();
    let running = send_raw(&w, "/v1/completions", &json!({"prompt": [1, 2, 3], "max_tokens": 5000, "ignore_eos": true})).await;
    // Running and past its first token, so its prompt is counted before anything is compared.
    until(&client, &w, "the first request generating", |st| st["num_requests_running"] == 1 && stat(st, "generation_tokens") > 0).await;
    let queued = send_raw(&w, "/v1/completions", &json!({"prompt": (0..500).collect::<Vec<u32>>(), "max_tokens": 5, "ignore_eos": true})).await;
    until(&client, &w, "the second request queued", |st| st["num_requests_waiting"] == 1).await;
    drop(queued);
    let st = until(&client, &w, "the queued request aborted", |st| st["num_requests_waiting"] == 0).await;
    assert_eq!((st["num_requests_running"].as_u64(), stat(&st, "requests_aborted")), (Some(1), 1));
    assert_eq!(stat(&st, "prompt_tokens"), 3, "only the running request's prompt was counted");
    assert_eq!(stat(&st, "prompt_tokens_first_scheduled"), 3, "the queued one was never scheduled");
    drop(running);
    until(&client, &w, "the running request aborted", |st| idle(st) && stat(st, "requests_aborted") == 2).await;
}

/// A background Responses request runs detached (vLLM's `asyncio.create_task`): a streaming
/// client that goes away leaves it generating to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_outlives_its_client() {
    let cluster = start_dp(1, 1, 400, 0.1).await;
    let client = reqwest::Client::new();
    let w = cluster.layout[0].http.clone();
    let body = json!({"input": "Background.", "background": true, "stream": true, "max_output_tokens": 50, "ignore_eos": true});
    let mut sock = send_raw(&w, "/v1/responses", &body).await;
    let mut buf = [0u8; 4096];
    assert!(sock.read(&mut buf).await.unwrap() > 0);
    drop(sock);
    let st = until(&client, &w, "the background generation", |st| stat(st, "requests_finished") == 1).await;
    assert_eq!((stat(&st, "requests_aborted"), stat(&st, "generation_tokens")), (0, 50));
}

async fn post(client: &reqwest::Client, http: &str, path: &str, body: Value) -> (u16, Value) {
    let r = client.post(format!("{http}{path}")).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// No model (absent, null, "") is the served model, and the reply names it; another name is
/// vLLM's 404. Anthropic's request requires one: a validation 400, OpenAI-shaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_model_is_the_served_model() {
    let cluster = start(1, 400).await;
    let client = reqwest::Client::new();
    let w = cluster.layout[0].http.clone();
    let bodies = [
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})),
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": 2})),
        ("/v1/responses", json!({"input": "hi", "max_output_tokens": 2, "store": false})),
    ];
    for (path, body) in bodies {
        for model in [None, Some(Value::Null), Some(json!(""))] {
            let mut body = body.clone();
            if let Some(m) = &model {
                body["model"] = m.clone();
            }
            let (status, r) = post(&client, &w, path, body).await;
            assert_eq!((status, r["model"].as_str()), (200, Some(MODEL)), "{path} model {model:?}: {r}");
        }
        let mut body = body.clone();
        body["model"] = json!("other");
        let (status, r) = post(&client, &w, path, body).await;
        assert_eq!(status, 404, "{path}");
        assert_eq!(
            r["error"],
            json!({"message": format!("The model `other` does not exist. Valid aliases: {MODEL}."), "type": "NotFoundError", "param": "model", "code": 404})
        );
    }
    let ask = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    for (model, says) in [(None, "Field required"), (Some(json!("")), "Model is required")] {
        let mut body = ask.clone();
        if let Some(m) = model {
            body["model"] = m;
        }
        let (status, r) = post(&client, &w, "/v1/messages", body).await;
        assert_eq!((status, r["error"]["type"].as_str(), r["error"]["param"].as_str()), (400, Some("Bad Request"), Some("body.model")), "{r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(says), "{r}");
    }
}

/// Which field limits the output, per endpoint, and the clamp to the context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_limits_follow_vllm() {
    use kvroute_sim::engine::EngineConfig;
    // A small context (64 tokens) so the clamp and its errors are cheap to reach.
    let cluster = start_engine(EngineConfig { max_model_len: 64, num_gpu_blocks: 400, eos_after: 4, time_scale: 0.01, ..EngineConfig::default() }).await;
    let client = reqwest::Client::new();
    let w = cluster.layout[0].http.clone();
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let tokens = |r: &Value| r["usage"]["completion_tokens"].as_u64().or(r["usage"]["output_tokens"].as_u64()).unwrap();
    let prompt_of = |r: &Value| r["usage"]["prompt_tokens"].as_u64().or(r["usage"]["input_tokens"].as_u64()).unwrap();
    let cases = [
        // Chat: max_completion_tokens wins when not null, else max_tokens.
        ("/v1/chat/completions", json!({"messages": msgs, "max_completion_tokens": 3, "max_tokens": 7, "ignore_eos": true}), Some(3)),
        ("/v1/chat/completions", json!({"messages": msgs, "max_completion_tokens": null, "max_tokens": 7, "ignore_eos": true}), Some(7)),
        // Completions: 16 by default, an explicit null too.
        ("/v1/completions", json!({"prompt": [1, 2, 3], "ignore_eos": true}), Some(16)),
        ("/v1/completions", json!({"prompt": [1, 2, 3], "max_tokens": null, "ignore_eos": true}), Some(16)),
        // Responses: max_output_tokens; a max_tokens field is not one of its fields.
        ("/v1/responses", json!({"input": "hi", "max_output_tokens": 5, "max_tokens": 2, "ignore_eos": true, "store": false}), Some(5)),
        // Messages: max_tokens.
        ("/v1/messages", json!({"model": MODEL, "messages": msgs, "max_tokens": 6, "ignore_eos": true}), Some(6)),
        // No limit (chat, responses): the rest of the context.
        ("/v1/chat/completions", json!({"messages": msgs, "ignore_eos": true}), None),
        ("/v1/responses", json!({"input": "hi", "ignore_eos": true, "store": false}), None),
        // A limit past the context's end is clamped silently.
        ("/v1/completions", json!({"prompt": [1, 2, 3], "max_tokens": 64, "ignore_eos": true}), None),
        ("/v1/chat/completions", json!({"messages": msgs, "max_completion_tokens": 60, "ignore_eos": true}), None),
    ];
    for (path, body, want) in cases {
        let (status, r) = post(&client, &w, path, body.clone()).await;
        assert_eq!(status, 200, "{path} {body}: {r}");
        let want = want.unwrap_or(64 - prompt_of(&r));
        assert_eq!(tokens(&r), want, "{path} {body}");
    }
    // Without ignore_eos the answer's natural length (eos_after = 4) is below the limit.
    let (_, r) = post(&client, &w, "/v1/chat/completions", json!({"messages": msgs, "max_tokens": 10})).await;
    assert_eq!((tokens(&r), r["choices"][0]["finish_reason"].as_str()), (4, Some("stop")));
    let (_, r) = post(&client, &w, "/v1/chat/completions", json!({"messages": msgs, "max_tokens": 2})).await;
    assert_eq!((tokens(&r), r["choices"][0]["finish_reason"].as_str()), (2, Some("length")));

    // Refusals, in vLLM's words.
    let long: Vec<u32> = (0..70).collect();
    let full: Vec<u32> = (0..64).collect();
    for (path, body, message) in [
        ("/v1/chat/completions", json!({"messages": msgs, "max_completion_tokens": 65}), "max_completion_tokens=65 cannot be greater than max_model_len=64. Please request fewer output tokens. (parameter=max_completion_tokens, value=65)"),
        ("/v1/chat/completions", json!({"messages": msgs, "max_tokens": 65}), "max_tokens=65 cannot be greater than max_model_len=64."),
        ("/v1/responses", json!({"input": "hi", "max_output_tokens": 65}), "max_output_tokens=65 cannot be greater than max_model_len=64."),
        ("/v1/completions", json!({"prompt": long}), "your prompt contains 70 input tokens, which exceeds this limit even without any output tokens."),
        ("/v1/completions", json!({"prompt": full}), "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"),
        ("/v1/completions", json!({"prompt": [1], "max_tokens": 0}), "max_tokens must be at least 1, got 0."),
        ("/v1/chat/completions", json!({"messages": msgs, "max_tokens": -1}), "max_tokens must be at least 1, got -1."),
    ] {
        let (status, r) = post(&client, &w, path, body.clone()).await;
        assert_eq!((status, r["error"]["type"].as_str()), (400, Some("BadRequestError")), "{path} {body}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(message), "{path} {body}: {r}");
    }
    let (status, r) = post(&client, &w, "/v1/messages", json!({"model": MODEL, "messages": msgs, "max_tokens": 0})).await;
    assert_eq!((status, r["error"]["param"].as_str()), (400, Some("body.max_tokens")), "{r}");
    let (status, r) = post(&client, &w, "/v1/messages", json!({"model": MODEL, "messages": msgs, "max_tokens": 65})).await;
    assert_eq!((status, r["type"].as_str()), (400, Some("error")), "refused by the handler: Anthropic's shape: {r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("max_completion_tokens=65 cannot be greater"), "{r}");
}

/// `n` choices: one engine request each (the prompt prefilled once, then found cached), each
/// its own answer; usage counts the prompt once and sums the choices; the worker counts
/// every engine request. Completions with a prompt list run prompts x n requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_and_prompt_lists_are_separate_engine_requests() {
    let cluster = start(1, 400).await;
    let client = reqwest::Client::new();
    let w = cluster.layout[0].http.clone();
    let question = json!([{"role": "user", "content": "Explain prefix caching in three sentences, please."}]);

    let (status, r) = post(&client, &w, "/v1/chat/completions", json!({"messages": question, "n": 3, "max_tokens": 6, "ignore_eos": true})).await;
    assert_eq!(status, 200, "{r}");
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.iter().map(|c| c["index"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2]);
    let texts: Vec<&str> = choices.iter().map(|c| c["message"]["content"].as_str().unwrap()).collect();
    assert!(texts[0] != texts[1] && texts[1] != texts[2], "each choice samples its own answer: {texts:?}");
    let prompt = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!((r["usage"]["completion_tokens"].as_u64(), r["usage"]["total_tokens"].as_u64()), (Some(18), Some(prompt + 18)));
    let st = state(&client, &w).await;
    assert_eq!((stat(&st, "requests_finished"), stat(&st, "generation_tokens"), stat(&st, "prompt_tokens")), (3, 18, 3 * prompt), "every child counts");
    assert_eq!(stat(&st, "prompt_tokens_first_scheduled"), 3 * prompt);
    assert_eq!(stat(&st, "cached_tokens_first_scheduled_gpu"), 2 * (prompt / 16 * 16), "prefilled once, the others hit its full blocks");

    // The same n, streamed: n role chunks, then tokens tagged with their choice, usage once.
    let body = json!({"messages": question, "n": 3, "max_tokens": 6, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let sse = client.post(format!("{w}/v1/chat/completions")).json(&body).send().await.unwrap().text().await.unwrap();
    let chunks: Vec<Value> = sse.split("\n\n").filter_map(|c| serde_json::from_str(c.strip_prefix("data: ")?).ok()).collect();
    assert!(sse.ends_with("data: [DONE]\n\n"));
    let roles: Vec<u64> = chunks[..3].iter().map(|c| c["choices"][0]["index"].as_u64().unwrap()).collect();
    assert_eq!(roles, [0, 1, 2]);
    assert!(chunks[..3].iter().all(|c| c["choices"][0]["delta"]["role"] == "assistant"));
    for i in 0..3u64 {
        let mine: String = chunks[3..].iter().filter(|c| c["choices"][0]["index"] == i).filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(mine, texts[i as usize], "choice {i}: same prompt, same sample, same answer");
    }
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!((usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()), (Some(prompt), Some(18)));

    // Completions: two prompts x n = 2, choice i is prompt i / 2's sample i % 2; usage counts
    // each prompt once.
    let (status, r) = post(&client, &w, "/v1/completions", json!({"prompt": [[1, 2, 3, 4], [5, 6, 7]], "n": 2, "max_tokens": 5, "ignore_eos": true})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"].as_array().map(Vec::len), Some(4));
    assert_eq!((r["usage"]["prompt_tokens"].as_u64(), r["usage"]["completion_tokens"].as_u64()), (Some(4 + 3), Some(20)));
    let single: Value = post(&client, &w, "/v1/completions", json!({"prompt": [5, 6, 7], "max_tokens": 5, "ignore_eos": true})).await.1;
    assert_eq!(r["choices"][2]["text"], single["choices"][0]["text"], "prompt 1's sample 0 is what n = 1 answers");
    // Streamed, a list of text prompts: each choice's chunks carry its index; usage sums.
    let body = json!({"prompt": ["one", "two", "three"], "max_tokens": 2, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let sse = client.post(format!("{w}/v1/completions")).json(&body).send().await.unwrap().text().await.unwrap();
    let chunks: Vec<Value> = sse.split("\n\n").filter_map(|c| serde_json::from_str(c.strip_prefix("data: ")?).ok()).collect();
    let mut per_choice = [0; 3];
    for c in &chunks[..chunks.len() - 1] {
        per_choice[c["choices"][0]["index"].as_u64().unwrap() as usize] += 1;
    }
    assert_eq!(per_choice, [2, 2, 2], "{sse}");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!((usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()), (Some(3 + 3 + 5), Some(6)), "byte prompts");

    // Validation: n in 1..=16384, n > 1 needs a temperature above 0; at most 1024 prompts.
    for (path, body, message) in [
        ("/v1/chat/completions", json!({"messages": question, "n": 0}), "n must be at least 1, got 0."),
        ("/v1/completions", json!({"prompt": "x", "n": 16385}), "n must be at most 16384, got 16385."),
        ("/v1/chat/completions", json!({"messages": question, "n": 2, "temperature": 0}), "n must be 1 when using greedy sampling, got 2."),
        ("/v1/completions", json!({"prompt": vec!["x"; 1025]}), "prompt list length 1025 exceeds the maximum allowed count of 1024."),
        ("/v1/completions", json!({"prompt": "x", "n": null}), "1 validation error:\n  {'type': 'int_type', 'loc': 'body.n'"),
    ] {
        let (status, r) = post(&client, &w, path, body).await;
        assert_eq!(status, 400, "{path}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().starts_with(message), "{path}: {r}");
    }
    let (status, _) = post(&client, &w, "/v1/chat/completions", json!({"messages": question, "n": 1, "temperature": 0, "max_tokens": 1})).await;
    assert_eq!(status, 200, "greedy with n = 1 is fine");
    // Responses has no n: one output.
    let (_, r) = post(&client, &w, "/v1/responses", json!({"input": "hi", "n": 3, "max_output_tokens": 4, "ignore_eos": true, "store": false})).await;
    assert_eq!((r["output"].as_array().map(Vec::len), r["usage"]["output_tokens"].as_u64()), (Some(1), Some(4)));
}

/// `[[...1...]]`, `depth` levels.
fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// Posts `body` as it is (a deeply nested body is built as text, not as a `Value`).
async fn post_text(client: &reqwest::Client, http: &str, path: &str, body: String) -> (u16, Value) {
    let r = client.post(format!("{http}{path}")).header("content-type", "application/json").body(body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// An ignored field nested 150 levels deep (past serde_json's 128) is ignored, as Python's
/// `json.loads` and pydantic ignore it: every endpoint that takes a body serves the request,
/// and the engine does (and counts) the same work as without the field. Past 1000 levels
/// (Python's recursion limit) the body is a 400, and the worker goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_fields_nest_as_deep_as_python_parses() {
    let cluster = start(1, 400).await;
    let client = reqwest::Client::new();
    let w = cluster.layout[0].http.clone();
    let msgs = r#"[{"role": "user", "content": "hi"}]"#;
    let bodies = [
        ("/v1/chat/completions", format!(r#"{{"model": "{MODEL}", "messages": {msgs}, "max_tokens": 3, "ignore_eos": true"#)),
        ("/v1/completions", r#"{"prompt": "hi", "max_tokens": 3, "ignore_eos": true"#.to_string()),
        ("/v1/responses", r#"{"input": "hi", "max_output_tokens": 3, "ignore_eos": true, "store": false"#.to_string()),
        ("/v1/messages", format!(r#"{{"model": "{MODEL}", "messages": {msgs}, "max_tokens": 3, "ignore_eos": true"#)),
        ("/v1/messages/count_tokens", format!(r#"{{"model": "{MODEL}", "messages": {msgs}"#)),
        ("/tokenize", format!(r#"{{"messages": {msgs}"#)),
        ("/detokenize", r#"{"tokens": [104, 105]"#.to_string()),
    ];
    // What a reply says of the work: prompt and output tokens, or the counted or decoded text.
    let work = |r: &Value| {
        let u = &r["usage"];
        let prompt = u.get("prompt_tokens").or(u.get("input_tokens")).cloned();
        let output = u.get("completion_tokens").or(u.get("output_tokens")).cloned();
        (prompt, output, [&r["count"], &r["tokens"], &r["input_tokens"], &r["prompt"]].map(Value::clone))
    };
    for (path, head) in &bodies {
        let (status, plain) = post_text(&client, &w, path, format!("{head}}}")).await;
        assert_eq!(status, 200, "{path}: {plain}");
        let before = state(&client, &w).await;
        for depth in [150, 999] {
            let (status, r) = post_text(&client, &w, path, format!(r#"{head}, "x_extra": {}}}"#, nested(depth))).await;
            assert_eq!(status, 200, "{path}, ignored field {depth} deep: {r}");
            assert_eq!(work(&r), work(&plain), "{path}, ignored field {depth} deep: the same work");
        }
        if *path == "/v1/chat/completions" {
            // Both requests ran on the engine: prompts prefilled, 3 tokens each, counted.
            let after = state(&client, &w).await;
            assert_eq!(stat(&after, "generation_tokens") - stat(&before, "generation_tokens"), 6, "{after}");
            assert_eq!(stat(&after, "requests_finished") - stat(&before, "requests_finished"), 2, "{after}");
        }
        let (status, r) = post_text(&client, &w, path, format!(r#"{head}, "x_extra": {}}}"#, nested(5000))).await;
        assert_eq!(status, 400, "{path}, 5000 deep: {r}");
        let (error, kind) = if path.starts_with("/v1/messages") { (&r["error"], "invalid_request_error") } else { (&r["error"], "BadRequestError") };
        assert_eq!(error["type"], kind, "{path}: {r}");
        let message = error["message"].as_str().unwrap();
        assert!(message.starts_with("invalid request body: maximum recursion depth exceeded"), "{path}: {r}");
    }
    // The worker survived all of it.
    let (status, r) = post_text(&client, &w, bodies[0].0, format!("{}}}", bodies[0].1)).await;
    assert_eq!(status, 200, "{r}");
}
