//! Token usage from the end of a response body. Only a bounded tail of the body is ever kept
//! (responses can be large and the filter must not buffer them), and `usage` is always near the
//! end: in the last SSE `data:` event of a stream (OpenAI with `include_usage`, Anthropic's
//! `message_delta`) or in the top-level object of a JSON body. Parsing therefore looks for the
//! last `"usage"` key in the tail whose value is a complete JSON object.

use serde_json::Value;
use std::collections::VecDeque;

/// Token counts from a response's `usage` (0 = not reported).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// `None` when the usage did not say (vLLM without `--enable-prompt-tokens-details`):
    /// the state service then cannot tell "nothing cached" from "not reported".
    pub cached_tokens: Option<u32>,
}

/// The last `cap` bytes of a body seen chunk by chunk.
#[derive(Clone, Debug)]
pub struct Tail {
    cap: usize,
    bytes: VecDeque<u8>,
}

impl Tail {
    pub fn new(cap: usize) -> Tail {
        Tail { cap, bytes: VecDeque::with_capacity(cap.min(4096)) }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        if self.cap == 0 {
            return;
        }
        let chunk = chunk.iter().skip(chunk.len().saturating_sub(self.cap));
        let overflow = (self.bytes.len() + chunk.len()).saturating_sub(self.cap);
        self.bytes.drain(..overflow.min(self.bytes.len()));
        self.bytes.extend(chunk);
    }

    pub fn to_vec(&self) -> Vec<u8> {
        self.bytes.iter().copied().collect()
    }
}

/// Finds the last complete `"usage": {...}` object in `tail` and reads its counts. Understands
/// OpenAI (`prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens`) and
/// Anthropic (`input_tokens`, `output_tokens`, `cache_read_input_tokens`) field names.
pub fn parse_usage(tail: &[u8]) -> Option<Usage> {
    const KEY: &[u8] = b"\"usage\"";
    let mut hay = tail;
    while let Some((before, after)) = rsplit_once(hay, KEY) {
        hay = before;
        let Some(rest) = after.trim_ascii_start().strip_prefix(b":") else { continue };
        let mut values = serde_json::Deserializer::from_slice(rest.trim_ascii_start()).into_iter::<Value>();
        if let Some(Ok(Value::Object(u))) = values.next() {
            let get = |names: &[&str]| names.iter().find_map(|n| u.get(*n).and_then(Value::as_u64)).unwrap_or(0);
            let cached = u
                .get("prompt_tokens_details")
                .and_then(|d| d.get("cached_tokens"))
                .and_then(Value::as_u64)
                .or_else(|| u.get("cache_read_input_tokens").and_then(Value::as_u64));
            return Some(Usage {
                prompt_tokens: clamp(get(&["prompt_tokens", "input_tokens"])),
                completion_tokens: clamp(get(&["completion_tokens", "output_tokens"])),
                cached_tokens: cached.map(clamp),
            });
        }
    }
    None
}

fn clamp(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// `hay` split around the last occurrence of `needle`: (bytes before it, bytes after it).
fn rsplit_once<'a>(hay: &'a [u8], needle: &[u8]) -> Option<(&'a [u8], &'a [u8])> {
    // `windows(0)` panics; an empty needle has no useful last occurrence anyway.
    if needle.is_empty() {
        return None;
    }
    let pos = hay.windows(needle.len()).rposition(|w| w == needle)?;
    let (before, at) = hay.split_at_checked(pos)?;
    Some((before, at.strip_prefix(needle)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_only_the_last_bytes() {
        let mut t = Tail::new(5);
        t.push(b"abc");
        t.push(b"defg");
        assert_eq!(t.to_vec(), b"cdefg");
        t.push(b"0123456789");
        assert_eq!(t.to_vec(), b"56789");
        let mut z = Tail::new(0);
        z.push(b"x");
        assert!(z.to_vec().is_empty());
    }

    #[test]
    fn openai_json_body() {
        let body = br#"{"id":"c","choices":[{"text":"hi"}],"usage":{"prompt_tokens":40,"completion_tokens":5,
            "prompt_tokens_details":{"cached_tokens":32}}}"#;
        assert_eq!(parse_usage(body), Some(Usage { prompt_tokens: 40, completion_tokens: 5, cached_tokens: Some(32) }));
    }

    #[test]
    fn sse_stream_takes_the_last_complete_usage() {
        let body = b"data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\n\
            data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
        assert_eq!(parse_usage(body), Some(Usage { prompt_tokens: 7, completion_tokens: 2, cached_tokens: None }));
        // A truncated last usage falls back to an earlier complete one.
        let cut = b"data: {\"usage\":{\"prompt_tokens\":3}}\n\ndata: {\"usage\":{\"prompt_tok";
        assert_eq!(parse_usage(cut).map(|u| u.prompt_tokens), Some(3));
        assert_eq!(parse_usage(b"data: [DONE]"), None);
        assert_eq!(parse_usage(b"\"usage\""), None);
        assert_eq!(parse_usage(b"sage\":{}"), None);
    }

    #[test]
    fn anthropic_message_delta() {
        let body = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9,\"input_tokens\":12,\"cache_read_input_tokens\":8}}\n\n";
        assert_eq!(parse_usage(body), Some(Usage { prompt_tokens: 12, completion_tokens: 9, cached_tokens: Some(8) }));
    }
}
