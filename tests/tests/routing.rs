//! Must-show routing behaviour through the real proxy, the real state service and simulated vLLM
//! workers: cache-aware placement, conversation affinity, load deciding between equal caches,
//! pass-through paths, both routing modes (client headers that cannot steer: `spoofing.rs`).
//! Every test runs through Envoy, and through NGINX too when `KVROUTE_NGINX` is set
//! (`host::for_each_host`); cluster mode is Envoy-only (NGINX has no named clusters to choose).

use anyhow::Result;
use kvroute_e2e::envoy::Mode;
use kvroute_e2e::host::{for_each_host, Host};
use kvroute_e2e::llm::{completion, concat, decision_field, header, tokens};
use kvroute_e2e::net::wait_for;
use kvroute_e2e::stack::{Stack, StackOptions, MODEL};
use serde_json::json;
use std::time::Duration;

async fn stack(host: Host, mode: Mode, workers: usize) -> Result<Stack> {
    Stack::start(StackOptions { host, mode, workers, ..StackOptions::default() }).await
}

/// Puts `prompt` into worker `i`'s cache by asking it directly (not through Envoy), then waits
/// until the state service has seen the KV events.
async fn warm(s: &Stack, i: usize, prompt: &[u32]) -> Result<()> {
    let before = s.worker_view(i).await?["index_blocks"].as_u64().unwrap_or(0);
    let r = s.client.post(s.worker_url(i, "/v1/completions")).json(&completion(MODEL, prompt, 1, false)).send().await?;
    assert_eq!(r.status(), 200);
    r.bytes().await?;
    s.wait_index(i, before + (prompt.len() / 16) as u64).await?;
    s.wait_idle().await
}

/// Sends a completion through the proxy; returns (worker, decision header) once the state service
/// has its completion report (so the next pick sees the fleet idle again).
async fn route(s: &Stack, prompt: &[u32]) -> Result<(String, String)> {
    let r = s.client.post(s.url("/v1/completions")).json(&completion(MODEL, prompt, 2, false)).send().await?;
    assert_eq!(r.status(), 200, "{}", s.log_tails());
    let out = (header(&r, "x-sim-worker"), header(&r, "x-kvroute-decision"));
    r.bytes().await?;
    s.wait_idle().await?;
    Ok(out)
}

async fn prefix_only_b_holds_goes_to_b(host: Host, mode: Mode) -> Result<()> {
    let s = stack(host, mode, 3).await?;
    for (b, seed) in [(1usize, 11u32), (2, 12), (0, 13)] {
        let prefix = tokens(seed, 160);
        warm(&s, b, &prefix).await?;
        let (worker, decision) = route(&s, &concat(&prefix, &tokens(seed + 100, 24))).await?;
        assert_eq!(worker, b.to_string(), "decision {decision}");
        assert_eq!(decision_field(&decision, "matched").as_deref(), Some("10"), "{decision}");
        assert_eq!(decision_field(&decision, "worker").as_deref(), Some(b.to_string().as_str()));
    }
    Ok(())
}

#[tokio::test]
async fn prefix_held_by_one_worker_routes_there_endpoint_mode() -> Result<()> {
    for_each_host(|host| prefix_only_b_holds_goes_to_b(host, Mode::Endpoint)).await
}

/// Envoy-only: cluster mode names an Envoy cluster per worker.
#[tokio::test]
async fn prefix_held_by_one_worker_routes_there_cluster_mode() -> Result<()> {
    prefix_only_b_holds_goes_to_b(Host::Envoy, Mode::Cluster).await
}

#[tokio::test]
async fn next_turn_lands_where_turn_one_ran() -> Result<()> {
    for_each_host(next_turn).await
}

async fn next_turn(host: Host) -> Result<()> {
    let s = stack(host, Mode::Endpoint, 3).await?;
    for conv in 0..4u32 {
        let turn1 = tokens(500 + conv, 200);
        let before: Vec<u64> = index_sizes(&s).await?;
        let (first, _) = route(&s, &turn1).await?;
        // The user's think time: turn one's KV events reach the state service.
        let w: usize = first.parse()?;
        s.wait_index(w, before[w] + 12).await?;
        // Turn two repeats turn one (plus the "assistant reply" and a new user message).
        let turn2 = concat(&concat(&turn1, &tokens(600 + conv, 30)), &tokens(700 + conv, 40));
        let (second, decision) = route(&s, &turn2).await?;
        assert_eq!(second, first, "conversation {conv}: {decision}");
        let matched: u32 = decision_field(&decision, "matched").and_then(|m| m.parse().ok()).unwrap_or(0);
        assert!(matched >= 12, "turn two should match turn one's blocks: {decision}");
    }
    Ok(())
}

async fn index_sizes(s: &Stack) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for i in 0..s.workers {
        out.push(s.worker_view(i).await?["index_blocks"].as_u64().unwrap_or(0));
    }
    Ok(out)
}

#[tokio::test]
async fn with_equal_caches_load_decides() -> Result<()> {
    for_each_host(load_decides).await
}

async fn load_decides(host: Host) -> Result<()> {
    // Enough running sequences that the load term dominates calibration noise between workers.
    const BUSY: u32 = 48;
    let s = stack(host, Mode::Endpoint, 2).await?;
    // Keep worker 0 busy with long generations sent to it directly.
    let mut busy = Vec::new();
    for i in 0..BUSY {
        let body = completion(MODEL, &tokens(900 + i, 40), 20_000, true);
        busy.push(s.client.post(s.worker_url(0, "/v1/completions")).json(&body).send().await?);
    }
    wait_for("worker 0 running them all", Duration::from_secs(20), || async {
        let w = s.worker_view(0).await.ok()?;
        (w["load"]["running"].as_u64()? >= u64::from(BUSY)).then_some(())
    })
    .await?;
    // Fresh prompts: neither worker holds them, so the idle one wins.
    for i in 0..3u32 {
        let r = s.client.post(s.url("/v1/completions")).json(&completion(MODEL, &tokens(950 + i, 64), 2, false)).send().await?;
        let decision = header(&r, "x-kvroute-decision");
        let view = s.workers_view().await?;
        assert_eq!(header(&r, "x-sim-worker"), "1", "{decision} {view}");
        assert_eq!(decision_field(&decision, "matched").as_deref(), Some("0"));
        r.bytes().await?;
        wait_for("reports in", Duration::from_secs(20), || async {
            (s.workers_view().await.ok()?["assignments"].as_u64()? == 0).then_some(())
        })
        .await?;
    }
    drop(busy);
    Ok(())
}

#[tokio::test]
async fn models_and_non_llm_paths_pass_through_unchanged() -> Result<()> {
    for_each_host(pass_through).await
}

async fn pass_through(host: Host) -> Result<()> {
    let s = stack(host, Mode::Endpoint, 2).await?;
    for path in ["/v1/models", "/health"] {
        let r = s.client.get(s.url(path)).send().await?;
        assert_eq!(r.status(), 200, "{path}");
        assert!(header(&r, "x-kvroute-decision").is_empty() && header(&r, "x-kvroute-fallback").is_empty());
        let worker: usize = header(&r, "x-sim-worker").parse()?;
        let via_envoy = r.bytes().await?;
        let direct = s.client.get(s.worker_url(worker, path)).send().await?.bytes().await?;
        assert_eq!(via_envoy, direct, "{path}");
    }
    // Counters: Envoy's admin stats (NGINX shows none).
    if let Some(llm) = s.proxy.counter("kvroute_llm_requests").await? {
        assert_eq!(llm, 0);
    }
    Ok(())
}

/// Chat prompts: the filter sends the messages (and text-chunk keys); the state service keys
/// them (its tokenizer, the worker's `/tokenize`, or text chunks) and keeps the conversation on
/// turn one's worker. `chat_exact.rs` checks the exact block counts with a real tokenizer.
#[tokio::test]
async fn chat_conversation_turn_two_follows_turn_one() -> Result<()> {
    for_each_host(chat_turn_two).await
}

async fn chat_turn_two(host: Host) -> Result<()> {
    let s = stack(host, Mode::Endpoint, 3).await?;
    let system = "You are a careful assistant for the kvroute project. ".repeat(30);
    for conv in 0..3 {
        let mut messages = vec![
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": format!("Conversation {conv}: explain prefix caching in detail.")}),
        ];
        let body = json!({"model": MODEL, "messages": messages, "max_tokens": 8});
        let r = s.client.post(s.url("/v1/chat/completions")).json(&body).send().await?;
        assert_eq!(r.status(), 200);
        let first = header(&r, "x-sim-worker");
        let answer: serde_json::Value = r.json().await?;
        s.wait_idle().await?;
        messages.push(answer["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": "And how does routing use it?"}));
        let body = json!({"model": MODEL, "messages": messages, "max_tokens": 8});
        let r = s.client.post(s.url("/v1/chat/completions")).json(&body).send().await?;
        let decision = header(&r, "x-kvroute-decision");
        assert_eq!(header(&r, "x-sim-worker"), first, "conversation {conv}: {decision}");
        r.bytes().await?;
        s.wait_idle().await?;
    }
    Ok(())
}
