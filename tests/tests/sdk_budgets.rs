//! Tenant budgets as the official SDKs see them, through real Envoy with the filter, the real
//! state service and simulated workers. The `openai` and `anthropic` Python SDKs (from
//! `.cache/venv`, installed by scripts/setup.sh from scripts/requirements.txt) call Envoy with
//! API keys that the filter's `identity.api_key` source maps to tenants (by SHA-256); each
//! tenant's budget admits its first requests, then the SDK raises its own
//! `openai.RateLimitError` / `anthropic.RateLimitError` (429) carrying `retry-after` (>= 1 s),
//! `retry-after-ms` and an error body in the called API's shape. `max_retries=0`: the SDKs
//! would otherwise sleep for the Retry-After and try again.
//!
//! Covered: `chat.completions.create` (plain and `stream=True`), `completions.create` (plain
//! and streamed), Anthropic `messages.create` (plain and `stream=True`) and the
//! `messages.stream()` helper, each against a `requests_per_minute` budget (deterministic:
//! the whole run takes seconds, far inside the 60 s window), and a `tokens_per_minute` budget
//! that a small request fits and a prompt bigger than the whole budget never does (type
//! `tokens`). `GET /v1/tenants` then attributes exactly the admitted requests to each tenant,
//! and requests with a key no tenant has (a near miss of an exhausted tenant's key) are
//! charged to the default tenant, not the keyed one.
//!
//! The calls themselves are in `tests/sdk/budget_errors.py`, which prints what each returned
//! or raised as JSON; the expectations are here.

use anyhow::{bail, Context, Result};
use kvroute_e2e::paths::repo_root;
use kvroute_e2e::stack::{Stack, StackOptions, StateToml, MODEL};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const SCRIPT: &str = "tests/sdk/budget_errors.py";
/// The tenant a request without a known key is charged to.
const DEFAULT_TENANT: &str = "anonymous";
/// Key role (as the script names them) -> tenant.
const TENANTS: [(&str, &str); 4] =
    [("chat", "team-chat"), ("completions", "team-completions"), ("messages", "team-messages"), ("tokens", "team-tokens")];
/// The `team-tokens` budget: a small request (a few prompt tokens + 8 output) fits, the
/// script's 8000-word prompt (~ 57 KB) never does.
const TOKENS_PER_MINUTE: u64 = 1000;

/// The venv's Python, failing with what to do when it or the SDKs are missing.
fn python() -> Result<PathBuf> {
    let py = repo_root().join(".cache/venv/bin/python");
    if !py.is_file() {
        bail!("{} not found: run scripts/setup.sh (it creates .cache/venv with the openai and anthropic SDKs)", py.display());
    }
    let out = Command::new(&py).arg(repo_root().join(SCRIPT)).arg("check").output().context("running budget_errors.py check")?;
    if !out.status.success() {
        bail!(
            "the official SDKs are not importable by {} (exit {:?}): {}\nrun scripts/setup.sh: it installs scripts/requirements.txt (openai, anthropic) into .cache/venv",
            py.display(),
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    eprintln!("sdk_budgets: {}", String::from_utf8_lossy(&out.stdout).trim());
    Ok(py)
}

fn script(py: &Path, args: &[&str]) -> Result<Value> {
    let out = Command::new(py).arg(repo_root().join(SCRIPT)).args(args).output().context("running budget_errors.py")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("budget_errors.py {} failed ({:?}):\n{stdout}\n{}", args.first().unwrap_or(&""), out.status.code(), String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_str(&stdout).with_context(|| format!("budget_errors.py printed no JSON:\n{stdout}"))
}

/// The script's record of call `name`.
fn call<'a>(summary: &'a Value, name: &str) -> &'a Value {
    summary["calls"]
        .as_array()
        .and_then(|calls| calls.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no call {name} in the script's output"))
}

fn assert_ok(summary: &Value, name: &str) {
    let c = call(summary, name);
    assert_eq!(c["ok"], true, "{name} should have been admitted: {c:#}");
}

fn header_secs(c: &Value, name: &str) -> u64 {
    let h = &c["error"]["headers"][name];
    h.as_str().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name}: {h} in {c:#}"))
}

/// Asserts that call `name` raised the SDK's own RateLimitError for a 429 of kind `limit`
/// (`requests` or `tokens`), with usable retry headers. Returns the Retry-After seconds.
fn assert_rate_limited(summary: &Value, name: &str, limit: &str) -> u64 {
    let c = call(summary, name);
    let e = &c["error"];
    assert_eq!(c["ok"], false, "{name} should have been rejected: {c:#}");
    let sdk = c["sdk"].as_str().unwrap_or_default();
    assert_eq!(e["class"], format!("{sdk}.RateLimitError"), "{name}: {c:#}");
    assert_eq!((e["status"].as_u64(), e["status_code"].as_u64()), (Some(429), Some(429)), "{name}: {c:#}");
    assert_eq!(e["headers"]["x-kvroute-rejected"], limit, "{name}: {c:#}");
    assert_eq!(e["headers"]["content-type"], "application/json", "{name}: {c:#}");
    let seconds = header_secs(c, "retry-after");
    let ms = header_secs(c, "retry-after-ms");
    assert!(seconds >= 1, "{name}: Retry-After {seconds}: {c:#}");
    // A per-minute window: never more than the window, in whole seconds rounded up.
    assert!(seconds <= 60 && ms <= 60_000, "{name}: {c:#}");
    assert_eq!(seconds, ms.div_ceil(1000), "{name}: Retry-After is retry-after-ms rounded up: {c:#}");
    // Both SDKs prefer retry-after-ms: what they would sleep before a retry.
    let sdk_wait = e["sdk_retry_after_s"].as_f64().unwrap_or_else(|| panic!("{name}: the SDK's parser gave {}", e["sdk_retry_after_s"]));
    assert!((sdk_wait - ms as f64 / 1000.0).abs() < 1e-6, "{name}: the SDK reads retry-after-ms: {c:#}");
    match sdk {
        "openai" => {
            // openai.APIStatusError.body is the body's "error" object.
            assert_eq!((e["type"].as_str(), e["code"].as_str()), (Some(limit), Some("rate_limit_exceeded")), "{name}: {c:#}");
            assert_eq!(e["body"]["type"], limit, "{name}: {c:#}");
            assert!(e["body"]["param"].is_null() && e["body"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{name}: {c:#}");
        }
        "anthropic" => {
            assert_eq!(e["body"]["type"], "error", "{name}: {c:#}");
            assert_eq!(e["body"]["error"]["type"], "rate_limit_error", "{name}: {c:#}");
            assert!(e["body"]["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{name}: {c:#}");
        }
        other => panic!("{name}: unknown sdk {other}"),
    }
    seconds
}

/// `tenants[].budgets[0].used.requests` of `GET /v1/tenants`.
fn used_requests(tenants: &Value, tenant: &str) -> u64 {
    let t = tenants["tenants"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["tenant"] == tenant))
        .unwrap_or_else(|| panic!("tenant {tenant} not in GET /v1/tenants: {tenants:#}"));
    t["budgets"][0]["used"]["requests"].as_u64().unwrap_or_else(|| panic!("{tenant}: no used.requests: {t:#}"))
}

#[tokio::test]
async fn official_sdks_raise_their_rate_limit_errors_when_a_tenant_budget_is_spent() -> Result<()> {
    let py = python()?;
    let keys: Value = TENANTS.iter().map(|(role, _)| (role.to_string(), json!(format!("sk-kvroute-e2e-{role}-5f3a9c")))).collect::<serde_json::Map<_, _>>().into();
    let key_list: Vec<&str> = TENANTS.iter().filter_map(|(role, _)| keys[*role].as_str()).collect();
    let digests = script(&py, &[&["digest"][..], &key_list[..]].concat())?;
    let api_keys: serde_json::Map<String, Value> =
        TENANTS.iter().map(|(role, tenant)| (digests[keys[*role].as_str().unwrap_or_default()].as_str().unwrap_or_default().to_string(), json!(tenant))).collect();
    assert!(api_keys.keys().all(|k| k.len() == 7 + 64), "{api_keys:?}");

    let tables = format!(
        "\n[tenancy]\ndefault_output_tokens = 64\n\
         [tenancy.budgets.team-chat]\nrequests_per_minute = 2\n\
         [tenancy.budgets.team-completions]\nrequests_per_minute = 2\n\
         [tenancy.budgets.team-messages]\nrequests_per_minute = 2\n\
         [tenancy.budgets.team-tokens]\ntokens_per_minute = {TOKENS_PER_MINUTE}\n\
         [tenancy.budgets.{DEFAULT_TENANT}]\nrequests_per_minute = 100\n"
    );
    let s = Stack::start(StackOptions {
        plugin: json!({ "identity": { "sources": [{ "api_key": { "keys": api_keys } }], "default_tenant": DEFAULT_TENANT, "required": false } }),
        state: StateToml { tables, ..StateToml::default() },
        ..StackOptions::default()
    })
    .await?;

    let envoy = s.envoy().url("");
    let (py2, keys_json) = (py.clone(), keys.to_string());
    let started = std::time::Instant::now();
    let summary = tokio::task::spawn_blocking(move || script(&py2, &["run", &envoy, MODEL, &keys_json])).await??;
    eprintln!("sdk_budgets: the script took {:.1} s (its calls {} s)\n{summary:#}", started.elapsed().as_secs_f64(), summary["seconds"]);
    let logs = || s.log_tails();
    let runtime = summary["seconds"].as_f64().unwrap_or(f64::MAX);
    assert!(runtime < 45.0, "the calls must fit in the 60 s window for the request counts to be exact: {runtime} s\n{}", logs());

    // OpenAI chat completions: 2 admitted (plain, streamed), then the SDK's RateLimitError.
    assert_ok(&summary, "chat_plain_1");
    assert_ok(&summary, "chat_stream_2");
    assert!(call(&summary, "chat_stream_2")["result"]["chunks"].as_u64() > Some(0));
    assert_rate_limited(&summary, "chat_plain_3", "requests");
    assert_rate_limited(&summary, "chat_stream_4", "requests");
    // OpenAI legacy completions.
    assert_ok(&summary, "completions_plain_1");
    assert_ok(&summary, "completions_stream_2");
    assert_rate_limited(&summary, "completions_plain_3", "requests");
    assert_rate_limited(&summary, "completions_stream_4", "requests");
    // Anthropic messages (x-api-key): plain and stream=True admitted; then plain, stream=True
    // and the messages.stream() helper each raise anthropic.RateLimitError.
    assert_ok(&summary, "messages_plain_1");
    assert_ok(&summary, "messages_stream_2");
    let events = &call(&summary, "messages_stream_2")["result"]["events"];
    assert!(events.as_array().is_some_and(|e| e.first() == Some(&json!("message_start")) && e.last() == Some(&json!("message_stop"))), "{events}");
    assert_rate_limited(&summary, "messages_plain_3", "requests");
    assert_rate_limited(&summary, "messages_stream_4", "requests");
    assert_rate_limited(&summary, "messages_helper_5", "requests");
    // The token budget: a small request fits; a prompt larger than the whole budget is
    // rejected as `tokens`, told to wait the window out (it can only fit after it).
    assert_ok(&summary, "tokens_small_1");
    assert_rate_limited(&summary, "tokens_big_2", "tokens");
    assert_rate_limited(&summary, "tokens_big_messages_3", "tokens");
    let big = &call(&summary, "tokens_big_2")["error"];
    assert!(big["message"].as_str().is_some_and(|m| m.contains(&format!("more than the budget of {TOKENS_PER_MINUTE} tokens"))), "{big:#}");
    // Keys no tenant has, sent after `team-chat` and `team-messages` are spent: admitted,
    // so not charged to the tenant whose key they nearly are.
    assert_ok(&summary, "wrong_key_openai");
    assert_ok(&summary, "wrong_key_anthropic");

    // The state service's view: exactly the admitted requests, each on its tenant's budget.
    let tenants: Value = s.client.get(s.state_url("/v1/tenants")).send().await?.error_for_status()?.json().await?;
    for (tenant, admitted) in [("team-chat", 2), ("team-completions", 2), ("team-messages", 2), ("team-tokens", 1), (DEFAULT_TENANT, 2)] {
        assert_eq!(used_requests(&tenants, tenant), admitted, "{tenant}: {tenants:#}\n{}", logs());
    }
    let tokens = tenants["tenants"].as_array().and_then(|ts| ts.iter().find(|t| t["tenant"] == "team-tokens")).cloned().unwrap_or_default();
    assert_eq!(tokens["budgets"][0]["limits"]["tokens_per_minute"], TOKENS_PER_MINUTE, "{tokens:#}");
    let used_tokens = tokens["budgets"][0]["used"]["tokens"].as_u64().unwrap_or(0);
    assert!(used_tokens > 0 && used_tokens < TOKENS_PER_MINUTE, "only the small request is charged: {tokens:#}");
    Ok(())
}
