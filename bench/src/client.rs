//! One streaming OpenAI request, timed the way a user feels it: TTFT when the first chunk
//! carrying generated text arrives (not the role-only chat preamble), end-to-end latency
//! when the stream ends (`data: [DONE]` or EOF). Routing headers (`x-sim-worker`,
//! `x-kvroute-decision`, `x-kvroute-fallback`) are recorded from the response head.
//!
//! SSE parsing is a small pure state machine ([`SseParser`]) so it can be tested on
//! arbitrary chunk boundaries without a server.

use crate::stats::Sample;
use serde_json::Value;
use std::time::{Duration, Instant};

/// What one SSE `data:` line meant.
#[derive(Debug, PartialEq)]
pub enum SseEvent {
    /// Generated text (possibly with the token ids, when the server returns them).
    Text { text: String, token_ids: Vec<u32> },
    Usage { prompt_tokens: u32, completion_tokens: u32, cached_tokens: Option<u32> },
    Done,
    /// A chunk with nothing we count (role preamble, empty text, unparsable line).
    Other,
}

#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// Feed raw bytes; returns the events of every complete line.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            if let Some(data) = line.trim_end().strip_prefix("data:") {
                out.push(parse_data(data.trim()));
            }
        }
        out
    }
}

fn parse_data(data: &str) -> SseEvent {
    if data == "[DONE]" {
        return SseEvent::Done;
    }
    let Ok(v) = serde_json::from_str::<Value>(data) else { return SseEvent::Other };
    let choice = &v["choices"][0];
    let text = choice["text"].as_str().or_else(|| choice["delta"]["content"].as_str()).unwrap_or("");
    if !text.is_empty() {
        let token_ids = choice["token_ids"]
            .as_array()
            .map(|a| a.iter().filter_map(|t| t.as_u64().map(|t| t as u32)).collect())
            .unwrap_or_default();
        return SseEvent::Text { text: text.to_string(), token_ids };
    }
    let u = &v["usage"];
    if let Some(c) = u["completion_tokens"].as_u64() {
        return SseEvent::Usage {
            prompt_tokens: u["prompt_tokens"].as_u64().unwrap_or(0) as u32,
            completion_tokens: c as u32,
            cached_tokens: u["prompt_tokens_details"]["cached_tokens"].as_u64().map(|c| c as u32),
        };
    }
    SseEvent::Other
}

/// A finished request: its sample plus the answer (for the next turn of a session).
#[derive(Debug, Default)]
pub struct Outcome {
    pub sample: Sample,
    pub text: String,
    pub token_ids: Vec<u32>,
}

fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// POST `body` to `url` and read the stream to its end, or until `timeout` (whole request).
/// `tenant`: sent as `x-tenant`, which the stack's filter trusts from loopback (`--classes`).
pub async fn send(client: &reqwest::Client, url: &str, body: &Value, tenant: Option<&str>, timeout: Duration) -> Outcome {
    let start = Instant::now();
    match tokio::time::timeout(timeout, stream(client, url, body, tenant, start)).await {
        Ok(o) => o,
        Err(_) => {
            let mut o = Outcome::default();
            o.sample.error = Some(format!("timed out after {:.0} s", timeout.as_secs_f64()));
            o
        }
    }
}

async fn stream(client: &reqwest::Client, url: &str, body: &Value, tenant: Option<&str>, start: Instant) -> Outcome {
    let mut o = Outcome::default();
    let mut req = client.post(url).json(body);
    if let Some(t) = tenant {
        req = req.header("x-tenant", t);
    }
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            o.sample.error = Some(format!("send: {e}"));
            return o;
        }
    };
    o.sample.worker = header(&resp, "x-sim-worker");
    o.sample.decision = header(&resp, "x-kvroute-decision");
    o.sample.fallback = header(&resp, "x-kvroute-fallback");
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        o.sample.error = Some(format!("HTTP {status}: {}", text.chars().take(200).collect::<String>()));
        return o;
    }
    let mut parser = SseParser::default();
    let mut tokens = 0u32;
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => {
                o.sample.error = Some(format!("stream: {e}"));
                return o;
            }
        };
        for ev in parser.feed(&chunk) {
            match ev {
                SseEvent::Text { text, token_ids } => {
                    if o.sample.ttft_s.is_none() {
                        o.sample.ttft_s = Some(start.elapsed().as_secs_f64());
                    }
                    tokens += 1;
                    o.text.push_str(&text);
                    o.token_ids.extend(token_ids);
                }
                SseEvent::Usage { prompt_tokens, completion_tokens, cached_tokens } => {
                    o.sample.prompt_tokens = prompt_tokens;
                    tokens = tokens.max(completion_tokens);
                    o.sample.cached_tokens = cached_tokens;
                }
                SseEvent::Done | SseEvent::Other => {}
            }
        }
    }
    o.sample.e2e_s = Some(start.elapsed().as_secs_f64());
    o.sample.output_tokens = tokens;
    o.sample.ok = o.sample.ttft_s.is_some();
    if !o.sample.ok {
        o.sample.error = Some("stream ended without a token".into());
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_completion_and_chat_chunks_across_boundaries() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\" hi\"}}]}\n\n",
            "data: {\"choices\":[{\"text\":\" yo\",\"token_ids\":[5,6]}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
            "data: [DONE]\n\n"
        );
        let mut p = SseParser::default();
        let mut events = Vec::new();
        for piece in stream.as_bytes().chunks(7) {
            events.extend(p.feed(piece));
        }
        assert_eq!(
            events,
            vec![
                SseEvent::Other,
                SseEvent::Text { text: " hi".into(), token_ids: vec![] },
                SseEvent::Text { text: " yo".into(), token_ids: vec![5, 6] },
                SseEvent::Usage { prompt_tokens: 7, completion_tokens: 2, cached_tokens: Some(4) },
                SseEvent::Done,
            ]
        );
    }
}
