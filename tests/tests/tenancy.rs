//! Tenants through real Envoy: identity only from what the proxy verified.
//!
//! One stack, one TLS listener (client certificates optional, verified against a test CA made
//! here with openssl), Envoy's own `jwt_authn` in front of kvroute (an RS256 key made here, its
//! JWKS inline), and the filter's identity sources in order: the JWT's `tenant` claim, the
//! client certificate's URI SAN, API keys stored as SHA-256, and `x-tenant` from one trusted
//! hop (127.0.0.2). Each admitted request is counted in the state service's per-tenant view
//! (`GET /v1/tenants`, every tenant budgeted through `"*"`), which is what the assertions read:
//! every verified identity lands on its tenant, and no forged one (a header from an untrusted
//! peer, a JWT signed with another key, an unknown key) ever moves a request's attribution.

use anyhow::{bail, Context, Result};
use kvroute_e2e::envoy::EnvoyExtra;
use kvroute_e2e::pki::{jwt, jwt_authn, make_pki, Pki};
use kvroute_e2e::stack::{Stack, StackOptions, StateToml, MODEL};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::process::Command;

/// One completion through the TLS listener with curl (from `source` address, with the
/// client certificate when `cert`, extra headers); returns the HTTP status.
fn curl(stack: &Stack, pki: &Pki, source: &str, cert: bool, headers: &[String]) -> Result<u16> {
    let url = format!("https://127.0.0.1:{}/v1/completions", stack.envoy().port);
    let body = json!({ "model": MODEL, "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 2 }).to_string();
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "30", "--interface", source, "--cacert"])
        .arg(&pki.tls.client_ca)
        .args(["-H", "content-type: application/json", "--data", &body]);
    if cert {
        cmd.arg("--cert").arg(&pki.client_cert).arg("--key").arg(&pki.client_key);
    }
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(&url).output().context("running curl")?;
    let code = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
    if code == 0 {
        bail!("curl failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(code)
}

/// Admitted requests per tenant, from the state service.
async fn requests_by_tenant(stack: &Stack) -> Result<std::collections::BTreeMap<String, u64>> {
    let view: Value = stack.client.get(stack.state_url("/v1/tenants")).send().await?.error_for_status()?.json().await?;
    let mut out = std::collections::BTreeMap::new();
    for t in view["tenants"].as_array().context("tenants")? {
        let n = t["budgets"][0]["used"]["requests"].as_u64().unwrap_or(0);
        out.insert(t["tenant"].as_str().unwrap_or_default().to_string(), n);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_come_only_from_what_envoy_verified() -> Result<()> {
    let pki = make_pki()?;
    let key = "sk-team-key-0123456789";
    let digest: String = Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let plugin = json!({
        "identity": {
            "sources": [
                { "jwt": { "claim": "tenant" } },
                { "mtls": "uri_san" },
                { "api_key": { "keys": { format!("sha256:{digest}"): "team-key" } } },
                { "header": { "name": "x-tenant", "trusted_sources": ["127.0.0.2/32"] } }
            ],
            "default_tenant": "public"
        }
    });
    // Every tenant budgeted (generously), so each one's admitted requests are counted.
    let state = StateToml { tables: "\n[tenancy.budgets.\"*\"]\nrequests_per_minute = 100000\n".into(), ..StateToml::default() };
    let envoy = EnvoyExtra { filters_before: jwt_authn(&pki.jwks), downstream_tls: Some(pki.tls.clone()), ..EnvoyExtra::default() };
    let stack = Stack::start(StackOptions { plugin, state, envoy, ..StackOptions::default() }).await?;

    let good = jwt(&pki, "jwt", &json!({ "iss": "kvroute-test", "sub": "u1", "tenant": "team-jwt", "exp": 4_000_000_000u64 }))?;
    let forged = jwt(&pki, "forger", &json!({ "iss": "kvroute-test", "sub": "u2", "tenant": "victim", "exp": 4_000_000_000u64 }))?;
    let auth = |t: &str| format!("authorization: Bearer {t}");
    let from_untrusted = "127.0.0.1";
    // Verified identities, 3 requests each.
    for _ in 0..3 {
        assert_eq!(curl(&stack, &pki, from_untrusted, false, &[auth(&good)])?, 200, "JWT");
        assert_eq!(curl(&stack, &pki, from_untrusted, true, &[])?, 200, "client certificate");
        assert_eq!(curl(&stack, &pki, from_untrusted, false, &[auth(key)])?, 200, "API key (Bearer)");
        assert_eq!(curl(&stack, &pki, from_untrusted, false, &[format!("x-api-key: {key}")])?, 200, "API key (x-api-key)");
        assert_eq!(curl(&stack, &pki, "127.0.0.2", false, &["x-tenant: team-hop".into()])?, 200, "trusted hop's header");
    }
    // Forgeries: each is attributed to the default tenant, never to the name it forged.
    let forgeries: Vec<Vec<String>> = vec![
        vec!["x-tenant: victim".into()],
        vec!["X-Tenant: victim".into(), "x-tenant: victim".into()],
        vec![auth(&forged)],
        vec![auth("sk-guessed-key"), "x-tenant: victim".into()],
        vec![format!("x-api-key: {key}x")],
        vec!["x-kvroute-tenant: victim".into()],
    ];
    for f in &forgeries {
        assert_eq!(curl(&stack, &pki, from_untrusted, false, f)?, 200, "{f:?} (fails open to the default tenant)");
    }
    // The order of sources decides: a verified JWT outranks a client certificate.
    assert_eq!(curl(&stack, &pki, from_untrusted, true, &[auth(&good)])?, 200);

    let by_tenant = requests_by_tenant(&stack).await?;
    let count = |t: &str| by_tenant.get(t).copied().unwrap_or(0);
    assert_eq!(count("team-jwt"), 4, "{by_tenant:?}");
    assert_eq!(count("spiffe://fleet/team-mtls"), 3, "{by_tenant:?}");
    assert_eq!(count("team-key"), 6, "{by_tenant:?}");
    assert_eq!(count("team-hop"), 3, "{by_tenant:?}");
    assert_eq!(count("public"), forgeries.len() as u64, "every forgery fell to the default tenant: {by_tenant:?}");
    assert_eq!(count("victim"), 0, "0 successful forgeries: {by_tenant:?}");
    let _ = std::fs::remove_dir_all(&pki.dir);
    Ok(())
}

/// `required: true`: a request without a verified identity is answered 401 by the filter, in
/// the called API's error shape, and never reaches a worker or the state service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_required_answers_401_in_the_api_shape() -> Result<()> {
    let key = "sk-required-0123456789";
    let digest: String = Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let plugin = json!({ "identity": { "sources": [ { "api_key": { "keys": { digest: "team" } } } ], "required": true } });
    let stack = Stack::start(StackOptions { plugin, ..StackOptions::default() }).await?;
    let client = reqwest::Client::new();
    let chat = json!({ "model": MODEL, "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 2 });
    let messages = json!({ "model": MODEL, "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 2 });
    let resp = client.post(stack.envoy().url("/v1/chat/completions")).bearer_auth("sk-wrong").json(&chat).send().await?;
    assert_eq!(resp.status(), 401);
    let body: Value = resp.json().await?;
    assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    let resp = client.post(stack.envoy().url("/v1/messages")).json(&messages).send().await?;
    assert_eq!(resp.status(), 401);
    let body: Value = resp.json().await?;
    assert_eq!((body["type"].as_str(), body["error"]["type"].as_str()), (Some("error"), Some("authentication_error")), "{body}");
    let ok = client.post(stack.envoy().url("/v1/chat/completions")).bearer_auth(key).json(&chat).send().await?;
    assert_eq!(ok.status(), 200);
    // A stored response is behind the same identity.
    assert_eq!(client.get(stack.envoy().url("/v1/responses/resp_0123")).send().await?.status(), 401);
    // Only the identified request was picked.
    let metrics = stack.client.get(stack.state_url("/metrics")).send().await?.text().await?;
    let picks: f64 = metrics.lines().filter(|l| l.starts_with("kvroute_picks_total{")).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum();
    assert_eq!(picks, 1.0, "{metrics}");
    Ok(())
}
