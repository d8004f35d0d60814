//! A hostile tenant against its budget, through real Envoy (its own `jwt_authn` in front of
//! the filter), the state service and simulated workers. Each test is one way around a budget
//! that kvroute once let through: mallory, verified by a JWT, has 3,000 tokens per minute, and
//!
//! - the work the workers really did (their own counters: the prefill they computed, not read
//!   from cache, plus every token they generated) stays within 1.05x of that budget, and
//! - nothing is billed to a tenant other than the verified one.
//!
//! Every test runs inside one budget window (60 s), with `ignore_eos` so the engine generates
//! all a request allows. Routing still fails open (the resilience tests): these hold what
//! admission must never let through.

use anyhow::{bail, Context, Result};
use kvroute_e2e::envoy::EnvoyExtra;
use kvroute_e2e::net::wait_for;
use kvroute_e2e::pki::{jwt, jwt_authn, make_pki, Pki};
use kvroute_e2e::stack::{Stack, StackOptions, StateToml, MODEL};
use serde_json::{json, Value};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

/// Mallory's tokens per minute.
const BUDGET: u64 = 3000;
/// What the workers may do for mallory in the test's one window.
const MOST_WORK: f64 = BUDGET as f64 * 1.05;

struct Fleet {
    stack: Stack,
    pki: Pki,
    /// Mallory's verified token.
    token: String,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.pki.dir);
    }
}

/// Envoy with `jwt_authn` and the filter (a JWT's `tenant` claim, then `x-tenant` from the
/// trusted hop 127.0.0.2, else tenant `public`; budgeted requests refused when the state
/// service cannot admit them), every tenant budgeted at [`BUDGET`] tokens per minute.
async fn fleet(plugin: Value) -> Result<Fleet> {
    let pki = make_pki()?;
    let mut config = json!({
        "identity": {
            "sources": [
                { "jwt": { "claim": "tenant" } },
                { "header": { "name": "x-tenant", "trusted_sources": ["127.0.0.2/32"] } }
            ],
            "default_tenant": "public"
        },
        "admission": { "state_unavailable": "reject" },
        "decision_header": true,
        "trusted_sources": ["127.0.0.2/32"]
    });
    if let (Some(base), Value::Object(extra)) = (config.as_object_mut(), plugin) {
        base.extend(extra);
    }
    let state = StateToml { tables: format!("\n[tenancy.budgets.\"*\"]\ntokens_per_minute = {BUDGET}\n"), ..StateToml::default() };
    let envoy = EnvoyExtra { filters_before: jwt_authn(&pki.jwks), ..EnvoyExtra::default() };
    let stack = Stack::start(StackOptions { plugin: config, state, envoy, workers: 2, ..StackOptions::default() }).await?;
    let token = jwt(&pki, "jwt", &json!({ "iss": "kvroute-test", "sub": "m", "tenant": "mallory", "exp": 4_000_000_000u64 }))?;
    Ok(Fleet { stack, pki, token })
}

/// A client whose connections come from `source` (a loopback address).
fn client_from(source: Ipv4Addr, timeout: Duration) -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder().local_address(IpAddr::V4(source)).timeout(timeout).build()?)
}

/// Sums a metric family over every series of a Prometheus text page.
fn family(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What the workers really did so far: prompt tokens they computed (not served from a cache)
/// and tokens they generated, by their own counters.
async fn work(stack: &Stack) -> Result<u64> {
    let mut total = 0.0;
    for i in 0..stack.workers {
        let text = stack.client.get(stack.worker_url(i, "/metrics")).send().await?.error_for_status()?.text().await?;
        let prompt = family(&text, "kvroute_sim_prompt_tokens_first_scheduled_total");
        let cached = family(&text, "kvroute_sim_cached_tokens_first_scheduled_total");
        total += prompt - cached + family(&text, "vllm:generation_tokens_total");
    }
    Ok(total as u64)
}

/// Waits until no worker runs or queues a request.
async fn workers_idle(stack: &Stack) -> Result<()> {
    wait_for("workers idle", Duration::from_secs(90), || async {
        let mut busy = 0.0;
        for i in 0..stack.workers {
            let text = stack.client.get(stack.worker_url(i, "/metrics")).send().await.ok()?.text().await.ok()?;
            busy += family(&text, "vllm:num_requests_running") + family(&text, "vllm:num_requests_waiting");
        }
        (busy == 0.0).then_some(())
    })
    .await
}

/// Tokens charged to `tenant` over the window, and its admitted requests.
async fn charged(stack: &Stack, tenant: &str) -> Result<(u64, u64)> {
    let view: Value = stack.client.get(stack.state_url("/v1/tenants")).send().await?.error_for_status()?.json().await?;
    let found = view["tenants"].as_array().context("tenants")?.iter().find(|t| t["tenant"] == tenant);
    Ok(found.map_or((0, 0), |t| (t["budgets"][0]["used"]["tokens"].as_u64().unwrap_or(0), t["budgets"][0]["used"]["requests"].as_u64().unwrap_or(0))))
}

/// `n` requests, `at_once` in flight, each built by `send(i)`: their statuses (0: no answer,
/// the client gave up or the connection failed).
async fn hammer<F, Fut>(n: usize, at_once: usize, send: F) -> Vec<u16>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<u16>> + Send + 'static,
{
    let gate = Arc::new(tokio::sync::Semaphore::new(at_once));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let permit = gate.clone().acquire_owned().await.expect("semaphore open");
        let request = send(i);
        set.spawn(async move {
            let status = request.await.unwrap_or(0);
            drop(permit);
            status
        });
    }
    let mut statuses = Vec::new();
    while let Some(done) = set.join_next().await {
        statuses.push(done.unwrap_or(0));
    }
    statuses
}

/// Posts `body` to `path` as mallory; the status (the body is read to its end).
fn post(fleet: &Fleet, client: &reqwest::Client, path: &str, body: Value) -> impl std::future::Future<Output = Result<u16>> + Send + 'static {
    let request = client.post(fleet.stack.url(path)).bearer_auth(&fleet.token).json(&body);
    async move {
        let resp = request.send().await?;
        let status = resp.status().as_u16();
        resp.bytes().await?;
        Ok(status)
    }
}

/// The work mallory's traffic cost, after it ends: within 1.05x of the budget, and nobody
/// else was billed for it.
async fn assert_within_budget(fleet: &Fleet, before: u64, what: &str) -> Result<u64> {
    workers_idle(&fleet.stack).await?;
    let done = work(&fleet.stack).await? - before;
    assert!(done as f64 <= MOST_WORK, "{what}: the workers did {done} tokens for a budget of {BUDGET}\n{}", fleet.stack.log_tails());
    for other in ["public", "victim"] {
        assert_eq!(charged(&fleet.stack, other).await?.1, 0, "{what}: billed to {other}");
    }
    Ok(done)
}

fn chat(extra: Value) -> Value {
    let mut body = json!({ "model": MODEL, "messages": [{ "role": "user", "content": "write a long story" }], "ignore_eos": true });
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
    body
}

/// `X-Forwarded-For` naming the trusted hop, in every spelling, from a peer that is not it:
/// the tenant header it carries is not believed and the decision's details are not shown. The
/// hop itself still is believed (the check works).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_changes_neither_identity_nor_what_is_revealed() -> Result<()> {
    let fleet = fleet(json!({})).await?;
    let outsider = client_from(Ipv4Addr::LOCALHOST, Duration::from_secs(30))?;
    let spellings = ["127.0.0.2", "127.0.0.2, 127.0.0.2", "10.9.8.7, 127.0.0.2", "127.0.0.2, 10.9.8.7", "127.0.0.2:4321", "::ffff:127.0.0.2"];
    for xff in spellings {
        let resp = outsider
            .post(fleet.stack.url("/v1/chat/completions"))
            .header("x-forwarded-for", xff)
            .header("forwarded", "for=127.0.0.2")
            .header("x-tenant", "victim")
            .json(&json!({ "model": MODEL, "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 2 }))
            .send()
            .await?;
        assert_eq!(resp.status(), 200, "{xff}");
        let decision = resp.headers().get("x-kvroute-decision").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        assert!(!decision.is_empty() && !decision.contains("worker="), "{xff}: the decision's details went to an untrusted peer: {decision}");
        resp.bytes().await?;
    }
    assert_eq!(charged(&fleet.stack, "victim").await?.1, 0, "no forged attribution");
    assert_eq!(charged(&fleet.stack, "public").await?.1, spellings.len() as u64, "every one is the default tenant's");
    let hop = client_from(Ipv4Addr::new(127, 0, 0, 2), Duration::from_secs(30))?;
    let resp = hop
        .post(fleet.stack.url("/v1/chat/completions"))
        .header("x-tenant", "victim")
        .json(&json!({ "model": MODEL, "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 2 }))
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-kvroute-decision").and_then(|v| v.to_str().ok()).is_some_and(|d| d.contains("worker=")), "the hop sees details");
    resp.bytes().await?;
    assert_eq!(charged(&fleet.stack, "victim").await?.1, 1, "the trusted hop's header names the tenant");
    Ok(())
}

/// `max_tokens: 1` beside the limit the engine obeys (chat: `max_completion_tokens`;
/// Responses: `max_output_tokens`): reserved at what the engine will generate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_output_limit_charged_is_the_one_the_engine_obeys() -> Result<()> {
    let fleet = fleet(json!({})).await?;
    let client = client_from(Ipv4Addr::LOCALHOST, Duration::from_secs(60))?;
    let before = work(&fleet.stack).await?;
    let chats = hammer(8, 4, |_| post(&fleet, &client, "/v1/chat/completions", chat(json!({ "max_tokens": 1, "max_completion_tokens": 1200 })))).await;
    let input = "write a long story";
    let body = json!({ "model": MODEL, "input": input, "max_tokens": 1, "max_output_tokens": 1200, "ignore_eos": true });
    let responses = hammer(8, 4, |_| post(&fleet, &client, "/v1/responses", body.clone())).await;
    assert!(chats.iter().chain(&responses).any(|s| *s == 200) && chats.iter().chain(&responses).any(|s| *s == 429), "{chats:?} {responses:?}");
    assert_within_budget(&fleet, before, "max_tokens beside the engine's limit").await?;
    Ok(())
}

/// No `model`, or an empty one: vLLM serves its first model, and kvroute charges it so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_model_is_charged() -> Result<()> {
    let fleet = fleet(json!({})).await?;
    let client = client_from(Ipv4Addr::LOCALHOST, Duration::from_secs(60))?;
    let before = work(&fleet.stack).await?;
    let statuses = hammer(12, 4, |i| {
        let mut body = chat(json!({ "max_completion_tokens": 1200 }));
        match i % 2 {
            0 => body.as_object_mut().map(|b| b.remove("model")),
            _ => body.as_object_mut().map(|b| b.insert("model".into(), json!(""))),
        };
        post(&fleet, &client, "/v1/chat/completions", body)
    })
    .await;
    assert!(statuses.contains(&200) && statuses.contains(&429), "{statuses:?}");
    assert_within_budget(&fleet, before, "no model").await?;
    Ok(())
}

/// A body larger than `max_body_bytes` is not read, and is charged its worst case (a model's
/// whole context), which this budget cannot hold: refused, and nothing reaches a worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_too_large_to_read_is_charged_its_worst_case() -> Result<()> {
    let fleet = fleet(json!({ "max_body_bytes": 65536 })).await?;
    let client = client_from(Ipv4Addr::LOCALHOST, Duration::from_secs(60))?;
    let before = work(&fleet.stack).await?;
    let big = "lorem ipsum ".repeat(10_000);
    let statuses = hammer(6, 3, |_| post(&fleet, &client, "/v1/chat/completions", chat(json!({ "messages": [{ "role": "user", "content": big }], "max_tokens": 50 })))).await;
    assert!(statuses.iter().all(|s| *s == 429), "{statuses:?}");
    let done = assert_within_budget(&fleet, before, "an oversized body").await?;
    assert_eq!(done, 0, "refused before any worker");
    Ok(())
}

/// The same body to a route refusing unreadable bodies: 413 in the API's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_may_refuse_unreadable_bodies() -> Result<()> {
    let fleet = fleet(json!({ "max_body_bytes": 65536, "admission": { "unread_body": "reject", "state_unavailable": "reject" } })).await?;
    let client = client_from(Ipv4Addr::LOCALHOST, Duration::from_secs(60))?;
    let big = "lorem ipsum ".repeat(10_000);
    let resp = client
        .post(fleet.stack.url("/v1/chat/completions"))
        .bearer_auth(&fleet.token)
        .json(&chat(json!({ "messages": [{ "role": "user", "content": big }] })))
        .send()
        .await?;
    assert_eq!(resp.status(), 413);
    let body: Value = resp.json().await?;
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let resp = client.post(fleet.stack.url("/v1/chat/completions")).bearer_auth(&fleet.token).body("{\"model\": ").send().await?;
    assert_eq!(resp.status(), 400, "not a request body");
    Ok(())
}

/// An HTTP/2 request whose body ends in trailers is read like any other: routed and charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_ending_in_trailers_is_read() -> Result<()> {
    let fleet = fleet(json!({})).await?;
    let before = work(&fleet.stack).await?;
    let port = fleet.stack.envoy().port;
    let token = fleet.token.clone();
    let statuses = hammer(8, 4, |_| {
        let (token, body) = (token.clone(), chat(json!({ "max_completion_tokens": 1200 })).to_string());
        async move { h2_post_with_trailers(port, "/v1/chat/completions", &token, body.into_bytes()).await }
    })
    .await;
    assert!(statuses.contains(&200) && statuses.contains(&429), "{statuses:?}");
    assert_within_budget(&fleet, before, "a body ending in trailers").await?;
    Ok(())
}

/// One HTTP/2 (prior knowledge) POST whose body is followed by trailers; its status.
async fn h2_post_with_trailers(port: u16, path: &str, token: &str, body: Vec<u8>) -> Result<u16> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let (send, connection) = h2::client::handshake(tcp).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut send = send.ready().await?;
    let request = http::Request::post(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {token}"))
        .body(())?;
    let (response, mut stream) = send.send_request(request, false)?;
    stream.send_data(body.into(), false)?;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-checksum", http::HeaderValue::from_static("none"));
    stream.send_trailers(trailers)?;
    let response = tokio::time::timeout(Duration::from_secs(60), response).await??;
    let status = response.status().as_u16();
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    Ok(status)
}

/// A field nobody reads, nested 150 levels deep, does not make the body unreadable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ignored_field_nested_deep_is_read_past() -> Result<()> {
    let fleet = fleet(json!({})).await?;
    let client = client_from(Ipv4Addr::LOCALHOST, Duration::from_secs(60))?;
    let before = work(&fleet.stack).await?;
    let nested = format!("{}1{}", "[".repeat(150), "]".repeat(150));
    let body = chat(json!({ "max_completion_tokens": 1200 })).to_string().replacen('{', &format!("{{\"metadata\":{nested},"), 1);
    let statuses = hammer(8, 4, |_| {
        let request = client.post(fleet.stack.url("/v1/chat/completions")).bearer_auth(&fleet.token).header("content-type", "application/json").body(body.clone());
        async move {
            let resp = request.send().await?;
            let status = resp.status().as_u16();
            if resp.headers().get("x-kvroute-fallback").is_some_and(|v| v == "unparsable_body") {
                bail!("read as unparsable");
            }
            resp.bytes().await?;
            Ok(status)
        }
    })
    .await;
    assert!(statuses.contains(&200) && statuses.contains(&429) && !statuses.contains(&0), "{statuses:?}");
    assert_within_budget(&fleet, before, "a deeply nested ignored field").await?;
    Ok(())
}

/// `background: true`: the creation answers at once with no usage while the engine goes on;
/// the charge is settled from the stored response when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_responses_are_charged_their_real_usage() -> Result<()> {
    let fleet = fleet(json!({})).await?;
    let client = client_from(Ipv4Addr::LOCALHOST, Duration::from_secs(60))?;
    let before = work(&fleet.stack).await?;
    let body = json!({ "model": MODEL, "input": "write a long story", "background": true, "store": true, "max_output_tokens": 1200, "ignore_eos": true });
    let statuses = hammer(8, 4, |_| post(&fleet, &client, "/v1/responses", body.clone())).await;
    assert!(statuses.contains(&200) && statuses.contains(&429), "{statuses:?}");
    let done = assert_within_budget(&fleet, before, "background responses").await?;
    assert!(done > 1000, "the background work ran: {done}");
    // Settled from the stored responses' usage (read once a second).
    wait_for("background charges settled", Duration::from_secs(10), || async {
        let (tokens, _) = charged(&fleet.stack, "mallory").await.ok()?;
        (tokens as f64 >= done as f64 * 0.95 && tokens as f64 <= done as f64 * 1.05).then_some(())
    })
    .await?;
    Ok(())
}

/// Non-streamed requests abandoned before their only byte: the engine did work the proxy
/// never saw; they are charged what they were admitted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_requests_pay_for_their_work() -> Result<()> {
    let fleet = fleet(json!({})).await?;
    let impatient = client_from(Ipv4Addr::LOCALHOST, Duration::from_millis(400))?;
    let before = work(&fleet.stack).await?;
    let statuses = hammer(12, 4, |_| post(&fleet, &impatient, "/v1/chat/completions", chat(json!({ "max_completion_tokens": 1200 })))).await;
    assert!(statuses.contains(&0), "the client gave up: {statuses:?}");
    let done = assert_within_budget(&fleet, before, "abandoned requests").await?;
    let (tokens, _) = charged(&fleet.stack, "mallory").await?;
    assert!(tokens >= done, "charged {tokens} for {done} tokens of work");
    Ok(())
}

/// A stream without an output limit may run to the model's context: reserved so, it does not
/// fit this budget and is refused with a message saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_a_limit_is_reserved_its_context() -> Result<()> {
    let fleet = fleet(json!({})).await?;
    let client = client_from(Ipv4Addr::LOCALHOST, Duration::from_secs(60))?;
    let before = work(&fleet.stack).await?;
    let resp = client.post(fleet.stack.url("/v1/chat/completions")).bearer_auth(&fleet.token).json(&chat(json!({ "stream": true }))).send().await?;
    assert_eq!(resp.status(), 429);
    let body: Value = resp.json().await?;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("more than the budget"), "{body}");
    assert_eq!(assert_within_budget(&fleet, before, "an unlimited stream").await?, 0);
    Ok(())
}

/// The state service down: a budgeted route refuses (503 with Retry-After) rather than
/// serve uncharged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_admission_no_service_on_a_budgeted_route() -> Result<()> {
    let mut fleet = fleet(json!({})).await?;
    let before = work(&fleet.stack).await?;
    fleet.stack.kill_state();
    let client = client_from(Ipv4Addr::LOCALHOST, Duration::from_secs(30))?;
    let resp = client.post(fleet.stack.url("/v1/chat/completions")).bearer_auth(&fleet.token).json(&chat(json!({ "max_tokens": 5 }))).send().await?;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    resp.bytes().await?;
    workers_idle(&fleet.stack).await?;
    assert_eq!(work(&fleet.stack).await?, before, "nothing reached a worker");
    Ok(())
}

/// A stored response is its tenant's alone, through two replicas on Redis: another tenant's
/// `GET`, `DELETE`, cancel and continuation are vLLM's own 404, as if the id did not exist;
/// the owner still reaches it through either replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_are_private_to_their_tenant() -> Result<()> {
    use kvroute_e2e::replicas::{ReplicaOptions, ReplicaStack};
    use sha2::{Digest, Sha256};
    let keys: Vec<(String, &str)> = vec![("sk-alice-0123456789abcdef".into(), "alice"), ("sk-bob-0123456789abcdef".into(), "bob")];
    let digest = |k: &str| -> String { Sha256::digest(k.as_bytes()).iter().map(|b| format!("{b:02x}")).collect() };
    let table: serde_json::Map<String, Value> = keys.iter().map(|(k, t)| (format!("sha256:{}", digest(k)), json!(t))).collect();
    let plugin = json!({ "identity": { "sources": [{ "api_key": { "keys": table } }], "required": true } });
    let stack = ReplicaStack::start(ReplicaOptions { workers: 2, replicas: 2, shards: 2, time_scale: 0.2, scrape_metrics: true, tables: String::new(), plugin }).await?;
    let (alice, bob) = (keys[0].0.as_str(), keys[1].0.as_str());
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let created: Value = client
        .post(stack.envoy_url(0, "/v1/responses"))
        .bearer_auth(alice)
        .json(&json!({ "model": MODEL, "input": "remember: the code is 42", "store": true, "max_output_tokens": 8 }))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let id = created["id"].as_str().context("a response id")?.to_string();
    // The owner, through the other replica, once the report told where it is stored.
    wait_for("alice reaches her response through replica 1", Duration::from_secs(10), || async {
        let resp = client.get(stack.envoy_url(1, &format!("/v1/responses/{id}"))).bearer_auth(alice).send().await.ok()?;
        (resp.status() == 200).then_some(())
    })
    .await?;
    let not_found = json!({ "error": { "message": format!("Response with id '{id}' not found."), "type": "invalid_request_error", "param": "response_id", "code": 404 } });
    for r in [0, 1] {
        let path = format!("/v1/responses/{id}");
        let attempts = [
            client.get(stack.envoy_url(r, &path)),
            client.delete(stack.envoy_url(r, &path)),
            client.post(stack.envoy_url(r, &format!("{path}/cancel"))),
            client.post(stack.envoy_url(r, "/v1/responses")).json(&json!({ "model": MODEL, "input": "and the code was?", "previous_response_id": id, "max_output_tokens": 8 })),
        ];
        for attempt in attempts {
            let resp = attempt.bearer_auth(bob).send().await?;
            assert_eq!(resp.status(), 404, "replica {r}");
            assert_eq!(resp.json::<Value>().await?, not_found, "replica {r}: vLLM's own 404");
        }
    }
    let follow = client
        .post(stack.envoy_url(1, "/v1/responses"))
        .bearer_auth(alice)
        .json(&json!({ "model": MODEL, "input": "and the code was?", "previous_response_id": id, "max_output_tokens": 8 }))
        .send()
        .await?;
    assert_eq!(follow.status(), 200, "the owner continues it through either replica");
    Ok(())
}
