//! A stored Responses API conversation through real Envoy with the official `openai` Python
//! SDK (`tests/sdk/responses_conversation.py`), on 4 simulated workers that store responses
//! as vLLM does (`VLLM_ENABLE_RESPONSES_API_STORE=1`: in the memory of the server that made
//! them). Three turns, each continuing the previous one by `previous_response_id`, streamed
//! and not: every turn succeeds, turns 2 and 3 land on turn 1's worker (any other would answer
//! 404), and that worker serves the prior conversation from its cache; `responses.retrieve`
//! returns the stored response. Then the same across two state-service replicas on Redis, the
//! follow-ups and the retrieve entering through the other replica's Envoy. The Anthropic SDK's
//! `messages.count_tokens` through Envoy returns the worker's own count.

use anyhow::{bail, Context, Result};
use kvroute_e2e::paths::repo_root;
use kvroute_e2e::replicas::{ReplicaOptions, ReplicaStack};
use kvroute_e2e::stack::{Stack, StackOptions, StateToml, MODEL};
use serde_json::{json, Value};
use std::process::Command;

const SCRIPT: &str = "tests/sdk/responses_conversation.py";
const ADMIN: &str = "kvroute-e2e-admin-token";

fn conversation(first: &str, follow: &str, stream: bool) -> Result<Value> {
    let py = repo_root().join(".cache/venv/bin/python");
    if !py.is_file() {
        bail!("{} not found: run scripts/setup.sh (it installs the openai and anthropic SDKs into .cache/venv)", py.display());
    }
    let out = Command::new(&py)
        .arg(repo_root().join(SCRIPT))
        .args(["run", first, follow, MODEL, if stream { "true" } else { "false" }])
        .output()
        .context("running responses_conversation.py")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("responses_conversation.py failed ({:?}):\n{stdout}\n{}", out.status.code(), String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_str(&stdout).with_context(|| format!("no JSON from the script:\n{stdout}"))
}

/// Every turn completed on turn 1's worker; turns 2 and 3 found the conversation cached there
/// (kvroute counted it as matched, the worker's usage says it served it from cache).
fn check(run: &Value, stream: bool) {
    let turns = run["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 3);
    let owner = turns[0]["decision"]["worker"].as_str().expect("turn 1 routed by kvroute").to_string();
    for (i, t) in turns.iter().enumerate() {
        assert_eq!(t["status"], "completed", "turn {} (stream {stream}): {t:#}", i + 1);
        assert!(t["id"].as_str().is_some_and(|id| id.starts_with("resp_")), "{t:#}");
        assert_eq!(t["decision"]["worker"].as_str(), Some(owner.as_str()), "turn {} went to turn 1's worker: {t:#}", i + 1);
        if stream {
            let events: Vec<&str> = t["events"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
            assert_eq!((events.first(), events.last()), (Some(&"response.created"), Some(&"response.completed")), "{events:?}");
        }
        if i > 0 {
            let matched: u64 = t["decision"]["matched"].as_str().and_then(|m| m.parse().ok()).unwrap_or(0);
            assert!(matched > 0, "turn {}: kvroute counts the stored conversation as matched: {t:#}", i + 1);
            let (cached, previous_input) = (t["cached_tokens"].as_u64().unwrap_or(0), turns[i - 1]["input_tokens"].as_u64().unwrap());
            assert!(cached >= previous_input / 2, "turn {}: the worker served the prior conversation from cache ({cached} of {} tokens, previous input {previous_input})", i + 1, t["input_tokens"]);
        }
    }
    assert_eq!(run["retrieved"]["id"], turns[0]["id"], "responses.retrieve found turn 1 on its worker");
    assert_eq!(run["retrieved"]["text"], turns[0]["text"]);
}

async fn worker_count(client: &reqwest::Client, worker: &str, messages: &Value) -> Result<u64> {
    let body = json!({ "model": MODEL, "messages": messages });
    let v: Value = client.post(format!("{worker}/v1/messages/count_tokens")).json(&body).send().await?.error_for_status()?.json().await?;
    v["input_tokens"].as_u64().context("input_tokens")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_conversation_stays_on_its_worker() -> Result<()> {
    let state = StateToml { top: format!("admin_token = \"{ADMIN}\""), ..StateToml::default() };
    let stack = Stack::start(StackOptions { workers: 4, state, ..StackOptions::default() }).await?;
    let url = format!("http://127.0.0.1:{}", stack.envoy().port);
    let mut last = Value::Null;
    for stream in [false, true] {
        let run = tokio::task::spawn_blocking({
            let url = url.clone();
            move || conversation(&url, &url, stream)
        })
        .await??;
        check(&run, stream);
        last = run.clone();
        if !stream {
            let direct = worker_count(&stack.client, &stack.worker_url(0, ""), &run["count_messages"]).await?;
            assert_eq!(run["count_tokens"].as_u64(), Some(direct), "count_tokens through Envoy is the worker's count");
        }
    }
    // count_tokens and the retrieves are no fallbacks: nothing fell back at all.
    let stats = stack.client.get(format!("http://127.0.0.1:{}/stats?filter=kvroute_fallback", stack.envoy().admin_port)).send().await?.text().await?;
    let fell_back: Vec<&str> = stats.lines().filter(|l| !l.ends_with(": 0")).collect();
    assert!(fell_back.is_empty(), "{fell_back:?}");

    // The worker that stored the conversation leaves: a follow-up and a GET get vLLM's own 404
    // from the filter, not another worker's answer to a conversation it never saw.
    let (owner, id) = (last["turns"][0]["decision"]["worker"].as_str().unwrap().to_string(), last["turns"][2]["id"].as_str().unwrap().to_string());
    let removed = stack.client.delete(stack.state_url(&format!("/admin/workers/{owner}?force=true"))).bearer_auth(ADMIN).send().await?;
    assert!(removed.status().is_success(), "{}", removed.status());
    let plain = reqwest::Client::new();
    let follow = plain.post(format!("{url}/v1/responses")).json(&json!({ "model": MODEL, "input": "still there?", "previous_response_id": id })).send().await?;
    let get = plain.get(format!("{url}/v1/responses/{id}")).send().await?;
    for resp in [follow, get] {
        assert_eq!(resp.status(), 404);
        let body: Value = resp.json().await?;
        assert_eq!(body, json!({ "error": { "message": format!("Response with id '{id}' not found."), "type": "invalid_request_error", "param": "response_id", "code": 404 } }));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_through_another_replica_find_the_worker() -> Result<()> {
    let stack = ReplicaStack::start(ReplicaOptions { workers: 4, replicas: 2, shards: 2, time_scale: 0.2, scrape_metrics: true, tables: String::new(), plugin: serde_json::json!({}) }).await?;
    let (a, b) = (stack.envoy_url(0, ""), stack.envoy_url(1, ""));
    for stream in [false, true] {
        let run = tokio::task::spawn_blocking({
            let (a, b) = (a.clone(), b.clone());
            move || conversation(&a, &b, stream)
        })
        .await??;
        check(&run, stream);
    }
    Ok(())
}
