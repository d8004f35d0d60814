//! Pools and the sensitivity classifier through Envoy: worker 0 is the restricted pool
//! (`labels = { sensitivity = "restricted" }`, exclusive), workers 1 and 2 are public. Prompts
//! holding secrets or personal data reach worker 0 and nothing else; plain prompts never reach
//! it; with worker 0 down, sensitive requests get 503 in the API's shape, counted, and still
//! never reach a public worker.

use anyhow::Result;
use kvroute_e2e::stack::{Stack, StackOptions, StateToml, MODEL};
use serde_json::{json, Value};
use std::time::Duration;

fn options() -> StackOptions {
    let restricted = "labels = { sensitivity = \"restricted\" }".to_string();
    let state = StateToml {
        worker_lines: vec![restricted],
        tables: "\n[pools.restricted]\nlabels = { sensitivity = \"restricted\" }\n".into(),
        ..StateToml::default()
    };
    StackOptions { workers: 3, plugin: json!({ "sensitivity": { "pool": "restricted" } }), state, ..StackOptions::default() }
}

/// Requests each sim has started (its TTFT histogram's count).
async fn served(stack: &Stack, workers: usize) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for i in 0..workers {
        // A killed worker serves nothing: 0.
        let Ok(r) = reqwest::get(stack.worker_url(i, "/metrics")).await else {
            out.push(0.0);
            continue;
        };
        let text = r.text().await?;
        let n = text
            .lines()
            .filter(|l| l.starts_with("vllm:time_to_first_token_seconds_count"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        out.push(n);
    }
    Ok(out)
}

const SECRETS: [&str; 6] = [
    "my card is 4111 1111 1111 1111, exp 09/29",
    "deploy with OPENAI_API_KEY=sk-proj-Ab3dEf5hIj7kLm9nOp1qRs3tUv5wXy7zAb9cDe1fGh3",
    "wire it to DE89 3704 0044 0532 0130 00 today",
    "her SSN is 500-04-6387",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
    "reach me at jane.doe@example.com or +44 20 7946 0958",
];

fn body(i: usize, secret: bool) -> Value {
    let text = if secret { SECRETS[i % SECRETS.len()] } else { "explain how a KV cache speeds up the next turn" };
    json!({ "model": MODEL, "prompt": format!("request {i}: {text}. {}", "Answer briefly. ".repeat(20)), "max_tokens": 4 })
}

#[tokio::test]
async fn sensitive_prompts_reach_only_their_pool_and_are_refused_when_it_is_down() -> Result<()> {
    let mut stack = Stack::start(options()).await?;
    let client = reqwest::Client::new();
    let before = served(&stack, 3).await?;
    for i in 0..24 {
        let r = client.post(stack.url("/v1/completions")).json(&body(i, i % 2 == 0)).send().await?;
        assert_eq!(r.status(), 200, "request {i}: {}", r.text().await?);
    }
    let after = served(&stack, 3).await?;
    let delta: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(delta[0], 12.0, "every sensitive request, and only those, on the restricted worker: {delta:?}");
    assert_eq!(delta[1] + delta[2], 12.0, "plain requests on the public workers: {delta:?}");
    assert_eq!(stack.envoy().counter("kvroute_sensitive").await?, 12);

    // The restricted pool goes down: sensitive requests are refused, plain ones still served.
    stack.kill_worker(0);
    // Until the state service sees it gone, a pick may still name it: Envoy then answers 503
    // itself (no retry leaves the pool). After, the filter refuses with the API's error.
    for _ in 0..100 {
        if stack.worker_view(0).await?["takes_picks"] == json!(false) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = served(&stack, 3).await?;
    let (mut refused, mut ok) = (0, 0);
    for i in 0..12 {
        let secret = i % 2 == 0;
        let r = client.post(stack.url("/v1/completions")).timeout(Duration::from_secs(20)).json(&body(i, secret)).send().await?;
        let status = r.status().as_u16();
        let text = r.text().await?;
        if secret {
            assert_eq!(status, 503, "request {i}: {text}");
            let err: Value = serde_json::from_str(&text)?;
            assert!(err["error"]["message"].as_str().unwrap_or("").contains("restricted"), "{text}");
            refused += 1;
        } else {
            assert_eq!(status, 200, "request {i}: {text}");
            ok += 1;
        }
    }
    let after = served(&stack, 3).await?;
    assert_eq!((refused, ok), (6, 6));
    assert_eq!(after[1] + after[2] - before[1] - before[2], 6.0, "no sensitive request spilled to a public worker");
    assert_eq!(stack.envoy().counter("kvroute_pool_unavailable").await?, 6);
    Ok(())
}
