//! The filter's own answers, in the error shape of the API the client called, so the official
//! SDKs raise their usual errors: OpenAI's `{"error": {"message", "type", "param", "code"}}`
//! (`openai.RateLimitError`, `AuthenticationError`), Anthropic's
//! `{"type": "error", "error": {"type", "message"}}` (`anthropic.RateLimitError`, ...).

use kvroute_core::request::Api;
use kvroute_core::wire::{BudgetLimit, Rejection};
use serde_json::json;

/// A local reply: status, headers, JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// What kind of error, in each API's vocabulary.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    RateLimit,
    Unavailable,
    /// Every worker saturated and the request's queue deadline passed.
    Overloaded,
    Unauthenticated,
    InvalidRequest,
    TooLarge,
}

fn body(api: Option<Api>, kind: Kind, message: &str, openai_type: &str) -> Vec<u8> {
    let value = match api {
        Some(Api::Messages) => {
            let t = match kind {
                Kind::RateLimit => "rate_limit_error",
                Kind::Unavailable => "api_error",
                Kind::Overloaded => "overloaded_error",
                Kind::Unauthenticated => "authentication_error",
                Kind::InvalidRequest => "invalid_request_error",
                Kind::TooLarge => "request_too_large",
            };
            json!({ "type": "error", "error": { "type": t, "message": message } })
        }
        _ => {
            let code = match kind {
                Kind::RateLimit => "rate_limit_exceeded",
                Kind::Unavailable => "budget_unavailable",
                Kind::Overloaded => "overloaded",
                Kind::Unauthenticated => "invalid_api_key",
                Kind::InvalidRequest => "invalid_request",
                Kind::TooLarge => "request_too_large",
            };
            json!({ "error": { "message": message, "type": openai_type, "param": null, "code": code } })
        }
    };
    value.to_string().into_bytes()
}

/// 429 (503 when the budget store is unavailable, or when the request waited out its queue
/// deadline on a saturated fleet) for a request that was not admitted, with `Retry-After` in whole seconds (at least 1) and `retry-after-ms` (which the
/// OpenAI SDK prefers when present).
pub fn rejected(api: Option<Api>, rejection: &Rejection) -> Reply {
    let limit = BudgetLimit::try_from(rejection.limit).unwrap_or(BudgetLimit::BudgetUnspecified);
    let (status, kind, openai_type) = match limit {
        BudgetLimit::BudgetUnavailable => (503, Kind::Unavailable, "server_error"),
        BudgetLimit::BudgetQueue => (503, Kind::Overloaded, "server_error"),
        BudgetLimit::BudgetTokens => (429, Kind::RateLimit, "tokens"),
        BudgetLimit::BudgetRequests => (429, Kind::RateLimit, "requests"),
        _ => (429, Kind::RateLimit, "requests"),
    };
    let ms = rejection.retry_after_ms.max(1);
    let seconds = ms.div_ceil(1000);
    let message = if rejection.message.is_empty() { format!("rate limit reached ({})", limit.label()) } else { rejection.message.clone() };
    Reply {
        status,
        headers: vec![
            ("content-type", "application/json".into()),
            ("retry-after", seconds.to_string()),
            ("retry-after-ms", ms.to_string()),
            ("x-kvroute-rejected", limit.label().into()),
        ],
        body: body(api, kind, &message, openai_type),
    }
}

/// 401 for a request with no verified identity where identity is required.
pub fn unauthenticated(api: Option<Api>) -> Reply {
    let message = "no verified identity: send a valid API key, token or client certificate";
    Reply {
        status: 401,
        headers: vec![("content-type", "application/json".into()), ("www-authenticate", "Bearer".into())],
        body: body(api, Kind::Unauthenticated, message, "invalid_request_error"),
    }
}

/// A body the filter could not read, on a route that refuses those (`admission.unread_body =
/// "reject"`): 413 for one over `max_body_bytes`, 400 otherwise.
pub fn unreadable(api: Option<Api>, unread: kvroute_core::wire::UnreadBody, detail: &str) -> Reply {
    let (status, kind, message) = match unread {
        kvroute_core::wire::UnreadBody::UnreadTooLarge => (413, Kind::TooLarge, format!("request body too large: {detail}")),
        _ => (400, Kind::InvalidRequest, format!("request body not understood: {detail}")),
    };
    Reply {
        status,
        headers: vec![("content-type", "application/json".into())],
        body: body(api, kind, &message, "invalid_request_error"),
    }
}

/// 503 for a request with a tenant that could not be admitted because the state service did
/// not answer (`admission.state_unavailable = "reject"`): retry in a second.
pub fn admission_unavailable(api: Option<Api>) -> Reply {
    let message = "the request could not be admitted: the budget service is unavailable, retry shortly";
    Reply {
        status: 503,
        headers: vec![("content-type", "application/json".into()), ("retry-after", "1".into()), ("retry-after-ms", "1000".into())],
        body: body(api, Kind::Unavailable, message, "server_error"),
    }
}

/// A request of a pool that no worker of the pool can take now: 503, never another pool.
pub fn pool_unavailable(api: Option<Api>, pool: &str) -> Reply {
    let message = format!("no worker of pool {pool:?} is available for this request; retry shortly");
    Reply {
        status: 503,
        headers: vec![("content-type", "application/json".into()), ("retry-after", "1".into()), ("retry-after-ms", "1000".into())],
        body: body(api, Kind::Unavailable, &message, "server_error"),
    }
}

/// vLLM's own 404 for a stored response nobody holds any more (its worker is gone) or that is
/// another tenant's, exactly as vLLM's Responses serving writes it for an unknown id.
pub fn response_not_found(id: &str) -> Reply {
    let body = json!({ "error": { "message": format!("Response with id '{id}' not found."), "type": "invalid_request_error", "param": "response_id", "code": 404 } });
    Reply { status: 404, headers: vec![("content-type", "application/json".into())], body: body.to_string().into_bytes() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn parse(r: &Reply) -> Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    #[test]
    fn rejections_are_shaped_like_the_called_api() {
        let r = Rejection { limit: BudgetLimit::BudgetTokens as i32, retry_after_ms: 1500, message: "tenant t: 10 tokens per minute".into() };
        let openai = rejected(Some(Api::ChatCompletions), &r);
        assert_eq!(openai.status, 429);
        assert!(openai.headers.contains(&("retry-after", "2".into())) && openai.headers.contains(&("retry-after-ms", "1500".into())));
        let v = parse(&openai);
        assert_eq!((v["error"]["type"].as_str(), v["error"]["code"].as_str()), (Some("tokens"), Some("rate_limit_exceeded")));
        assert_eq!(v["error"]["message"], "tenant t: 10 tokens per minute");
        let anthropic = parse(&rejected(Some(Api::Messages), &r));
        assert_eq!((anthropic["type"].as_str(), anthropic["error"]["type"].as_str()), (Some("error"), Some("rate_limit_error")));
        let down = rejected(None, &Rejection { limit: BudgetLimit::BudgetUnavailable as i32, retry_after_ms: 0, message: String::new() });
        assert_eq!(down.status, 503);
        assert!(down.headers.contains(&("retry-after", "1".into())), "never Retry-After: 0");
        assert_eq!(parse(&unauthenticated(Some(Api::Messages)))["error"]["type"], "authentication_error");
        assert_eq!(unauthenticated(Some(Api::Completions)).status, 401);
        let big = unreadable(Some(Api::Messages), kvroute_core::wire::UnreadBody::UnreadTooLarge, "5000000 bytes");
        assert_eq!((big.status, parse(&big)["error"]["type"].as_str()), (413, Some("request_too_large")));
        let odd = unreadable(Some(Api::ChatCompletions), kvroute_core::wire::UnreadBody::UnreadUnparsable, "missing field `messages`");
        assert_eq!((odd.status, parse(&odd)["error"]["type"].as_str()), (400, Some("invalid_request_error")));
        let down = admission_unavailable(Some(Api::Responses));
        assert!(down.status == 503 && down.headers.contains(&("retry-after", "1".into())));
    }
}
