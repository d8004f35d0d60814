//! Exact keys for Responses API (`/v1/responses`) prompts through the HTTP API: the local
//! tokenizer renders them as vLLM's Responses endpoint does (`kvroute_tokenize::responses`),
//! and without a local tokenizer they are never sent to a worker's `/tokenize` (which would
//! parse them as chat messages): the pick falls to text chunks instead, as it does for a
//! follow-up (`previous_response_id`), whose stored history the pick does not carry.

mod common;

use axum::body::{to_bytes, Body};
use axum::http::{header, Request, StatusCode};
use axum::Router;
use common::{config, TestIndex};
use kvroute_core::request::Api;
use kvroute_core::wire::{PickRequest, PickResponse, TokenizationPath};
use kvroute_state::config::{Config, ModelConfig};
use kvroute_state::app::App;
use kvroute_kv::types::EngineSlot;
use kvroute_tokenize::ModelTokenizer;
use parking_lot::Mutex;
use prost::Message;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use tower::ServiceExt;

fn fixture_dir() -> PathBuf {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tokenize/fetch-tokenizer.sh");
    let out = Command::new("bash").arg(&script).output().expect("running tokenize/fetch-tokenizer.sh");
    assert!(out.status.success(), "fetch-tokenizer.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// An agent-loop step: instructions, a user message, the model's call, its output.
fn responses_body() -> Value {
    json!({"model": "m", "instructions": "You are a careful assistant for the kvroute project. ".repeat(8),
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "22 °C, sunny"}
        ]})
}

/// The pick the filter sends for a Responses body, and its template input.
fn responses_pick(body: &Value) -> (PickRequest, String) {
    common::filter_pick(Api::Responses, body)
}

fn build(mut config: Config, tokenizer_dir: PathBuf) -> (Router, Arc<TestIndex>) {
    config.models.insert("m".into(), ModelConfig { block_size: Some(16), tokenizer_dir: Some(tokenizer_dir), max_model_len: None });
    config.tokenization.deadline_ms = 10_000;
    let index = Arc::new(TestIndex::default());
    let state = App::new(config, index.clone()).expect("valid config");
    state.tokenization.local.load("m");
    (state.router(), index)
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.expect("router is infallible");
    let status = resp.status();
    (status, to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec())
}

async fn pick(app: &Router, req: &PickRequest) -> PickResponse {
    let http = Request::post("/v1/pick").header(header::CONTENT_TYPE, "application/x-protobuf").body(Body::from(req.encode_to_vec())).unwrap();
    let (status, body) = send(app, http).await;
    assert_eq!(status, StatusCode::OK);
    PickResponse::decode(&body[..]).expect("PickResponse")
}

#[tokio::test]
async fn a_responses_prompt_is_keyed_exactly_by_the_local_tokenizer() {
    let dir = fixture_dir();
    let (app, index) = build(config(&["a", "b"]), dir.clone());
    let (req, input) = responses_pick(&responses_body());
    let reference = ModelTokenizer::from_dir(&dir).expect("fixture tokenizer");
    let ids = reference.encode_chat_uncached(&input, Api::Responses).expect("reference ids");
    let text = reference.render_chat_full(&input, Api::Responses).expect("rendered").text;
    assert!(text.contains("<tool_call>") && text.contains("<tool_response>\n22 °C, sunny"), "{text}");
    let keys: Vec<u64> = kvroute_tokenize::block_keys("m", "", &ids, 16).into_iter().map(|k| k.0).collect();
    assert!(keys.len() >= 8, "{} blocks", keys.len());
    index.hold(EngineSlot(1), &keys);
    let resp = pick(&app, &req).await;
    assert_eq!(resp.tokenization, TokenizationPath::TokenizationLocal as i32, "{resp:?}");
    assert_eq!((resp.worker_id.as_str(), resp.matched_blocks, resp.total_blocks), ("b", keys.len() as u32, keys.len() as u32));

    // A follow-up continues a stored conversation the pick does not carry: no exact ids.
    let follow_up = PickRequest { previous_response_id: "resp_0123456789abcdef".into(), ..req };
    let resp = pick(&app, &follow_up).await;
    assert_eq!(resp.tokenization, TokenizationPath::TokenizationTextChunks as i32, "{resp:?}");
    let (_, metrics) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(metrics.contains(r#"kvroute_tokenization_failures_total{path="local",reason="template"} 1"#), "{metrics}");
}

#[tokio::test]
async fn without_a_local_tokenizer_a_responses_prompt_is_not_sent_to_a_worker() {
    let seen = Arc::new(Mutex::new(Vec::<Value>::new()));
    let log = seen.clone();
    let router = Router::new().route(
        "/tokenize",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let log = log.clone();
            async move {
                log.lock().push(body);
                axum::Json(json!({"count": 1, "max_model_len": 32768, "tokens": [1]}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let mut cfg = config(&["a"]);
    cfg.workers[0].endpoint = format!("127.0.0.1:{port}");
    cfg.tokenization.worker_timeout_ms = 5000;
    let (app, _) = build(cfg, PathBuf::from("/nonexistent/kvroute-tokenizer"));
    let (req, _) = responses_pick(&responses_body());
    let resp = pick(&app, &req).await;
    assert_eq!(resp.tokenization, TokenizationPath::TokenizationTextChunks as i32, "{resp:?}");
    assert!(seen.lock().is_empty(), "a worker got {:?}", seen.lock());
    let (_, metrics) = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(metrics.contains(r#"kvroute_tokenization_failures_total{path="worker",reason="template"} 1"#), "{metrics}");
    let models: Value = serde_json::from_str(&String::from_utf8(send(&app, Request::get("/v1/models").body(Body::empty()).unwrap()).await.1).unwrap()).unwrap();
    assert_eq!(models["models"][0]["worker_tokenize_paused"].as_bool(), Some(false), "{models}");
    server.abort();
}
