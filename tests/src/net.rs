//! Loopback ports and readiness polling.

use anyhow::{bail, Result};
use std::collections::BTreeSet;
use std::future::Future;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The credential the e2e stacks share: the state service's `api_token`, the filter's
/// `state_token`, and what the tests' own clients send.
pub const API_TOKEN: &str = "kvroute-e2e-api-token-0123456789abcdef";

/// An HTTP client for the tests: `timeout` per request, and the API token on every request
/// (the state service needs it; Envoy and the workers ignore it).
pub fn client(timeout: Duration) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(v) = reqwest::header::HeaderValue::from_str(&format!("Bearer {API_TOKEN}")) {
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    reqwest::Client::builder().timeout(timeout).default_headers(headers).build().unwrap_or_default()
}

/// Ports this process has handed out. The OS may give a port it just freed to the next
/// `bind(0)` (CI once gave Envoy's admin and listener the same one), so each is handed out once.
static CLAIMED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Claims `n` ports from `base` if all are free right now on 127.0.0.1 and none was handed out
/// before.
fn claim(base: u16, n: u16) -> bool {
    let Some(ports) = base.checked_add(n).filter(|_| base != 0).map(|end| base..end) else { return false };
    let Ok(mut claimed) = CLAIMED.lock() else { return false };
    let free = ports.clone().all(|p| !claimed.contains(&p) && TcpListener::bind(("127.0.0.1", p)).is_ok());
    if free {
        claimed.extend(ports);
    }
    free
}

/// A port free right now on 127.0.0.1 (the OS picks it; the listener is closed at once), never
/// one this process handed out before.
pub fn free_port() -> u16 {
    free_port_range(1)
}

/// `n` consecutive free ports (for launchers that take a base port), probing from bases the OS
/// picks; 0 when none was found.
pub fn free_port_range(n: u16) -> u16 {
    for _ in 0..200 {
        let base = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_or(0, |a| a.port());
        if claim(base, n) {
            return base;
        }
    }
    0
}

/// Polls `check` every 20 ms until it returns `Some`, failing after `deadline` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > end {
            bail!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `GET url` answers with any status below 500.
pub async fn wait_http_ok(url: &str, deadline: Duration) -> Result<()> {
    let client = reqwest::Client::new();
    wait_for(url, deadline, || async {
        match client.get(url).timeout(Duration::from_millis(500)).send().await {
            Ok(r) if r.status().as_u16() < 500 => Some(()),
            _ => None,
        }
    })
    .await
}
