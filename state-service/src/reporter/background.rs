//! Background responses are charged what they really cost. A Responses API request with
//! `background: true` answers at once (`status: "queued"`, `usage: null`) and the engine goes
//! on; vLLM keeps the response, and its `usage` once it ends, behind
//! `GET /v1/responses/{id}` on the worker that stored it (vLLM 0.33
//! `vllm/entrypoints/openai/responses/serving.py`: the stored object is replaced by the final
//! one when generation ends). So the creation keeps its reservation, and the stored response
//! is read until it is over: its usage settles the charge. Until then (or if it never ends
//! within [`FOLLOW_FOR`]) the reservation stands: it is what the request was admitted for.

use crate::tenancy::{Scope, Tenants};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// How often a running background response is read.
const POLL: Duration = Duration::from_secs(1);
/// How long one is followed: the longest a generation runs here (the assignment's life).
const FOLLOW_FOR: Duration = Duration::from_secs(600);

pub(super) struct Background {
    client: reqwest::Client,
    tenants: Arc<Tenants>,
}

/// The parts of a stored response that settle it.
#[derive(Deserialize)]
struct Stored {
    status: String,
    usage: Option<StoredUsage>,
}

#[derive(Deserialize)]
struct StoredUsage {
    input_tokens: u64,
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: u64,
}

/// What reading the stored response found.
#[derive(Debug, PartialEq)]
enum Read {
    /// Still queued or in progress.
    Running,
    /// Over: what it cost (uncached input plus output).
    Done(u64),
    /// Not there (its worker forgot it, or restarted): the reservation stands.
    Gone,
}

impl Background {
    pub(super) fn new(tenants: Arc<Tenants>) -> Background {
        Background { client: reqwest::Client::new(), tenants }
    }

    /// Follows the stored response at `url` and settles reservation `id` of `scope` when it
    /// ends (at `reserved` if it cannot be read).
    pub(super) fn follow(&self, url: String, scope: Scope, id: u64, reserved: u64) {
        let (client, tenants) = (self.client.clone(), self.tenants.clone());
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + FOLLOW_FOR;
            while tokio::time::Instant::now() < until {
                tokio::time::sleep(POLL).await;
                match read(&client, &url).await {
                    Ok(Read::Running) => continue,
                    Ok(Read::Done(tokens)) => {
                        tracing::debug!(%url, tokens, "background response settled");
                        tenants.settle_charged(scope, id, tokens, reserved);
                        return;
                    }
                    Ok(Read::Gone) => break,
                    Err(e) => tracing::debug!(%url, error = %e, "background response not read"),
                }
            }
            tracing::info!(%url, reserved, "background response not settled from its usage: its reservation stands");
            tenants.settle_charged(scope, id, reserved, reserved);
        });
    }
}

async fn read(client: &reqwest::Client, url: &str) -> Result<Read, reqwest::Error> {
    let response = client.get(url).timeout(Duration::from_secs(5)).send().await?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(Read::Gone);
    }
    let stored: Stored = response.error_for_status()?.json().await?;
    Ok(parse(&stored))
}

fn parse(stored: &Stored) -> Read {
    match (stored.status.as_str(), &stored.usage) {
        ("queued" | "in_progress", _) => Read::Running,
        (_, Some(u)) => {
            let cached = u.input_tokens_details.as_ref().map_or(0, |d| d.cached_tokens);
            Read::Done(u.input_tokens.saturating_sub(cached) + u.output_tokens)
        }
        // Over without a usage (cancelled early, failed): nothing says less was done.
        (_, None) => Read::Gone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(json: &str) -> Read {
        parse(&serde_json::from_str::<Stored>(json).expect("a stored response"))
    }

    #[test]
    fn a_stored_response_settles_when_it_is_over() {
        assert_eq!(stored(r#"{"status":"queued","usage":null}"#), Read::Running);
        assert_eq!(stored(r#"{"status":"in_progress","usage":null}"#), Read::Running);
        let done = r#"{"status":"completed","usage":{"input_tokens":100,"output_tokens":900,"input_tokens_details":{"cached_tokens":64}}}"#;
        assert_eq!(stored(done), Read::Done(936));
        assert_eq!(stored(r#"{"status":"incomplete","usage":{"input_tokens":10,"output_tokens":5}}"#), Read::Done(15));
        assert_eq!(stored(r#"{"status":"failed","usage":null}"#), Read::Gone);
    }
}
