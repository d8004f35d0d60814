//! Pools and their label sources through Envoy: worker 0 is the restricted pool
//! (`labels = { sensitivity = "restricted" }`, exclusive), workers 1 and 2 are public. A mixed
//! load (8 concurrent clients): prompts holding secrets or personal data (the classifier) and
//! requests with the clinic's API key (`pools.sources`) reach worker 0 and nothing else;
//! unlabelled ones, including those that claim the pool in a header of their own, never reach
//! it; with worker 0 down, labelled requests get 503 in the API's shape, counted, and still
//! never reach a public worker.

use anyhow::Result;
use kvroute_e2e::stack::{Stack, StackOptions, StateToml, MODEL};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// The API key whose requests the `pools.sources` entry places in the restricted pool.
const POOL_KEY: &str = "sk-clinic-team-7f3a9c";

fn options() -> StackOptions {
    let restricted = "labels = { sensitivity = \"restricted\" }".to_string();
    let state = StateToml {
        worker_lines: vec![restricted],
        tables: "\n[pools.restricted]\nlabels = { sensitivity = \"restricted\" }\n".into(),
        ..StateToml::default()
    };
    let digest: String = Sha256::digest(POOL_KEY.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let plugin = json!({
        "sensitivity": { "pool": "restricted" },
        "pools": { "sources": [{ "api_key": { "keys": { format!("sha256:{digest}"): "restricted" } } }] },
    });
    StackOptions { workers: 3, plugin, state, ..StackOptions::default() }
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

/// How request `i` of the mixed load is labelled: by the classifier, by its API key (a
/// `pools.sources` entry), not at all but claiming the pool in a header of its own (stripped:
/// it names nothing), or not at all.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Secret,
    Keyed,
    Forged,
    Plain,
}

impl Kind {
    fn of(i: usize) -> Kind {
        [Kind::Secret, Kind::Keyed, Kind::Forged, Kind::Plain][i % 4]
    }

    fn restricted(self) -> bool {
        matches!(self, Kind::Secret | Kind::Keyed)
    }
}

/// Sends `n` requests of the mixed load, 8 at a time; (kind, status, body) of each.
async fn mixed_load(stack: &Stack, n: usize) -> Result<Vec<(Kind, u16, String)>> {
    let client = reqwest::Client::new();
    let url = stack.url("/v1/completions");
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (client, url, next) = (client.clone(), url.clone(), next.clone());
        set.spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(out);
                }
                let kind = Kind::of(i);
                let mut req = client.post(&url).timeout(Duration::from_secs(30)).json(&body(i, kind == Kind::Secret));
                match kind {
                    Kind::Keyed => req = req.bearer_auth(POOL_KEY),
                    Kind::Forged => req = req.header("x-kvroute-pool", "restricted").bearer_auth("sk-not-a-pool-key"),
                    _ => {}
                }
                let r = req.send().await?;
                let status = r.status().as_u16();
                out.push((kind, status, r.text().await?));
            }
        });
    }
    let mut results = Vec::new();
    while let Some(done) = set.join_next().await {
        results.extend(done??);
    }
    Ok(results)
}

#[tokio::test]
async fn labelled_requests_reach_only_their_pool_and_are_refused_when_it_is_down() -> Result<()> {
    let mut stack = Stack::start(options()).await?;
    let before = served(&stack, 3).await?;
    let results = mixed_load(&stack, 96).await?;
    for (kind, status, text) in &results {
        assert_eq!(*status, 200, "{kind:?}: {text}");
    }
    let after = served(&stack, 3).await?;
    let delta: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(delta[0], 48.0, "every labelled request (classifier, API key), and only those, on the restricted worker: {delta:?}");
    assert_eq!(delta[1] + delta[2], 48.0, "unlabelled and forged requests on the public workers: {delta:?}");
    assert_eq!(stack.envoy().counter("kvroute_sensitive").await?, 24);
    assert_eq!(stack.metric("kvroute_pool_picks_total", "pool=\"restricted\",outcome=\"eligible\"").await?, 48.0);
    let view = stack.workers_view().await?;
    assert_eq!(view["pools"]["restricted"]["workers"], 1, "{view}");
    assert_eq!(view["workers"][0]["pools"], json!(["restricted"]));
    assert_eq!(view["workers"][1]["pools"], json!([]));

    // The restricted pool goes down: labelled requests are refused, the others still served.
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
    let results = mixed_load(&stack, 48).await?;
    for (kind, status, text) in &results {
        if kind.restricted() {
            assert_eq!(*status, 503, "{kind:?}: {text}");
            let err: Value = serde_json::from_str(text)?;
            assert!(err["error"]["message"].as_str().unwrap_or("").contains("restricted"), "{text}");
        } else {
            assert_eq!(*status, 200, "{kind:?}: {text}");
        }
    }
    let after = served(&stack, 3).await?;
    assert_eq!(after[1] + after[2] - before[1] - before[2], 24.0, "no labelled request spilled to a public worker");
    assert_eq!(stack.envoy().counter("kvroute_pool_unavailable").await?, 24);
    assert_eq!(stack.metric("kvroute_pool_picks_total", "pool=\"restricted\",outcome=\"no_worker\"").await?, 24.0);
    assert_eq!(stack.metric("kvroute_pool_workers", "pool=\"restricted\",state=\"taking_picks\"").await?, 0.0);
    assert_eq!(stack.metric("kvroute_pool_workers", "pool=\"restricted\",state=\"registered\"").await?, 1.0);
    Ok(())
}
