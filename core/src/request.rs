//! LLM request bodies -> [`PromptRequest`]: what the router needs to know about a request.
//!
//! Understood bodies:
//! - OpenAI `/v1/completions`: `prompt` as a string, a list of strings, a token-id array or a
//!   list of token-id arrays. A batch is routed by its first prompt (vLLM serves a batch on one
//!   engine, so the first prompt's prefix is as good a hint as any) and counted whole in its
//!   [`Work`].
//! - OpenAI `/v1/chat/completions`: `messages` with string or multi-part content, `tools`.
//! - Anthropic `/v1/messages`: `system` (string or blocks) and `messages` with content blocks.
//! - OpenAI `/v1/responses`: `input` (a string or items), `instructions`, `tools`,
//!   `previous_response_id` (the stored conversation it continues, on the worker that stored it).
//!
//! A missing, null or empty `model` is the engine's first served model (vLLM serves it: only
//! the Anthropic API requires the field), so such a request is read, routed and charged like
//! any other. Only the fields the router reads are parsed; every other field, at any depth, is
//! only checked to be JSON, without building it and without recursion (a field nested
//! thousands of levels deep costs what its bytes cost). What the request asks the engine to
//! generate is read by the rules vLLM applies ([`work`]).
//!
//! Chat prompts cannot be keyed exactly without the model's tokenizer and chat template, which
//! the state service owns; for those this module keeps the JSON the template needs
//! ([`Prompt::Chat::template_input`]) and a canonical text for approximate text-chunk keys.

use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::HashMap;

mod prompts;
mod work;

use prompts::{chat_prompt, completion_prompt, responses_prompt, Batch};

pub use work::{Work, COMPLETIONS_DEFAULT_MAX_TOKENS, MAX_N};

/// Which API a request was sent to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Api {
    Completions,
    ChatCompletions,
    Messages,
    Responses,
}

impl Api {
    /// The API served at `path` (query string ignored), or `None` for non-LLM paths.
    pub fn from_path(path: &str) -> Option<Api> {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        match path.trim_end_matches('/') {
            "/v1/completions" => Some(Api::Completions),
            "/v1/chat/completions" => Some(Api::ChatCompletions),
            "/v1/messages" => Some(Api::Messages),
            "/v1/responses" => Some(Api::Responses),
            _ => None,
        }
    }

    pub fn wire(self) -> crate::wire::Endpoint {
        match self {
            Api::Completions => crate::wire::Endpoint::Completions,
            Api::ChatCompletions => crate::wire::Endpoint::ChatCompletions,
            Api::Messages => crate::wire::Endpoint::Messages,
            Api::Responses => crate::wire::Endpoint::Responses,
        }
    }
}

/// The prompt of a request, in the most exact form the client gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Token ids: exact block keys can be computed anywhere.
    Tokens(Vec<u32>),
    /// Plain text for `/v1/completions`: needs the model's tokenizer.
    Text(String),
    /// A conversation: needs the model's tokenizer and chat template.
    Chat {
        /// JSON object with what a chat template reads: `messages`, and where present `tools`,
        /// `system` (Anthropic), `add_generation_prompt`, `continue_final_message`,
        /// `chat_template_kwargs`. Responses API: `input`, and where present `instructions`,
        /// `tools`, `chat_template_kwargs` (the state service builds the messages as vLLM does).
        template_input: String,
        /// Role-tagged text of the conversation, for approximate text-chunk keys.
        canonical: String,
    },
}

/// What the router needs to know about one LLM request.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptRequest {
    pub api: Api,
    /// Empty: the engine's first served model (the field was missing, null or empty).
    pub model: String,
    pub prompt: Prompt,
    pub stream: bool,
    /// What the engine will generate: output limit, sequences, batch, background.
    pub work: Work,
    /// vLLM's `cache_salt`: requests with different salts never share cache.
    pub cache_salt: String,
    /// Responses API: the stored response this request continues (its worker holds it).
    pub previous_response_id: Option<String>,
    /// A stream that ends with a usage event: OpenAI's `stream_options.include_usage`
    /// (Anthropic and Responses streams always carry usage). Without it the proxy need not read
    /// a streamed body at all.
    pub stream_usage: bool,
}

impl PromptRequest {
    /// The text approximate keys are cut from (empty for token prompts).
    pub fn canonical_text(&self) -> &str {
        match &self.prompt {
            Prompt::Tokens(_) => "",
            Prompt::Text(t) => t,
            Prompt::Chat { canonical, .. } => canonical,
        }
    }
}

/// Why a body could not be understood. The message names the offending field.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    #[error("body is not valid JSON: {0}")]
    NotJson(String),
    #[error("body must be a JSON object")]
    NotObject,
    #[error("missing field `{0}`")]
    Missing(&'static str),
    #[error("field `{field}` {why}")]
    Invalid { field: &'static str, why: &'static str },
}

impl ParseError {
    /// A short, stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ParseError::NotJson(_) => "not_json",
            ParseError::NotObject => "not_object",
            ParseError::Missing(_) => "missing_field",
            ParseError::Invalid { .. } => "invalid_field",
        }
    }
}

fn invalid(field: &'static str, why: &'static str) -> ParseError {
    ParseError::Invalid { field, why }
}

mod scan;

/// The body's top-level fields as raw JSON, when [`scan`] declines the body.
#[derive(serde::Deserialize)]
struct RawFields<'a>(#[serde(borrow)] HashMap<Cow<'a, str>, &'a RawValue>);

/// Parses a request body sent to `api`.
///
/// The body is first split into top-level fields (the fast [`scan`], else serde_json), and only
/// then are fields parsed: a token-id prompt goes straight into a `Vec<u32>`, which keeps long
/// prompts cheap in the filter (`examples/parse_bench.rs`).
pub fn parse(api: Api, body: &[u8]) -> Result<PromptRequest, ParseError> {
    let prompt_field = (api == Api::Completions).then_some("prompt");
    let fields: Vec<RawField> = match scan::top_level_fields(body, prompt_field) {
        Some(fields) => fields.into_iter().map(|f| (Cow::Borrowed(f.key), f.raw, f.tokens)).collect(),
        None => {
            let RawFields(fields) = serde_json::from_slice(body).map_err(|e| classify(body, e))?;
            fields.into_iter().map(|(k, v)| (k, v.get().as_bytes(), None)).collect()
        }
    };
    let mut obj = Map::new();
    let mut raw_prompt = None;
    // Last field first: a repeated field counts once, as its last occurrence (as in
    // serde_json's map); earlier ones need only be JSON, as on the serde_json path.
    for (name, raw, tokens) in fields.into_iter().rev() {
        let is_prompt = prompt_field == Some(name.as_ref());
        let repeated = if is_prompt { raw_prompt.is_some() } else { obj.contains_key(name.as_ref()) };
        if repeated {
            if tokens.is_none() && !is_json(raw) {
                return Err(ParseError::NotJson(format!("field `{name}` (repeated) is not JSON")));
            }
        } else if is_prompt {
            raw_prompt = Some(RawPrompt { raw, tokens });
        } else if READ_FIELDS.contains(&name.as_ref()) {
            let value = serde_json::from_slice(raw).map_err(|e| ParseError::NotJson(e.to_string()))?;
            obj.insert(name.into_owned(), value);
        } else if !scan::is_json_value(raw) {
            return Err(ParseError::NotJson(format!("field `{name}` is not JSON")));
        }
    }
    // The prompt is read last: when something else is wrong first, a prompt that is not JSON
    // still makes the body "not JSON", as on the serde_json path (token ids the scan read are
    // JSON already).
    let unread = raw_prompt.as_ref().filter(|p| p.tokens.is_none()).map(|p| p.raw);
    request(api, &obj, raw_prompt).map_err(|e| match e {
        ParseError::NotJson(_) => e,
        _ if unread.is_some_and(|raw| !is_json(raw)) => ParseError::NotJson("field `prompt` is not JSON".into()),
        _ => e,
    })
}

/// The top-level fields the router reads (a completion's `prompt` aside); any other field is
/// only checked to be JSON.
const READ_FIELDS: [&str; 19] = [
    "model",
    "messages",
    "input",
    "instructions",
    "tools",
    "system",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n",
    "cache_salt",
    "previous_response_id",
    "background",
    "store",
];

/// A top-level field: key, raw value, and its token ids when the scan read them.
type RawField<'a> = (Cow<'a, str>, &'a [u8], Option<Vec<u32>>);

/// A completion's `prompt` as the scan left it: raw bytes, and its token ids when the scan
/// read them on the way.
struct RawPrompt<'a> {
    raw: &'a [u8],
    tokens: Option<Vec<u32>>,
}

/// The request in a body's top-level fields (`raw_prompt`: a completion's unparsed `prompt`).
fn request(api: Api, obj: &Map<String, Value>, raw_prompt: Option<RawPrompt>) -> Result<PromptRequest, ParseError> {
    let model = match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        // Anthropic's API requires it (vLLM answers 400 "Model is required"); the others
        // serve the first model.
        Some(Value::String(_)) | Some(Value::Null) | None if api == Api::Messages => return Err(ParseError::Missing("model")),
        Some(Value::String(_)) | Some(Value::Null) | None => String::new(),
        Some(_) => return Err(invalid("model", "must be a string")),
    };
    let (prompt, batch) = match api {
        Api::Completions => completion_prompt(raw_prompt)?,
        Api::ChatCompletions | Api::Messages => (chat_prompt(api, obj)?, Batch::default()),
        Api::Responses => (responses_prompt(obj)?, Batch::default()),
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("stream", "must be a boolean")),
    };
    let work = Work {
        max_tokens: work::max_tokens(api, obj)?,
        n: work::n(api, obj)?,
        prompts: batch.prompts,
        extra_prompt_tokens: batch.extra_tokens,
        background: work::background(api, obj)?,
    };
    let cache_salt = match obj.get("cache_salt") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(invalid("cache_salt", "must be a string")),
    };
    let previous_response_id = match obj.get("previous_response_id") {
        _ if api != Api::Responses => None,
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if id.is_empty() => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => return Err(invalid("previous_response_id", "must be a string")),
    };
    let include_usage = obj.get("stream_options").and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false);
    let stream_usage = stream && (include_usage || matches!(api, Api::Messages | Api::Responses));
    Ok(PromptRequest { api, model, prompt, stream, work, cache_salt, previous_response_id, stream_usage })
}

/// Why a body is not a JSON object: not JSON at all, or JSON of another shape.
fn classify(body: &[u8], error: serde_json::Error) -> ParseError {
    if is_json(body) {
        ParseError::NotObject
    } else {
        ParseError::NotJson(error.to_string())
    }
}

/// Whether `bytes` are one JSON value as the serde_json path reads a field: syntax and the
/// UTF-8 of strings checked (`IgnoredAny` skips strings unchecked), numbers of any size.
fn is_json(bytes: &[u8]) -> bool {
    serde_json::from_slice::<&RawValue>(bytes).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(api: Api, body: &str) -> Result<PromptRequest, ParseError> {
        parse(api, body.as_bytes())
    }

    #[test]
    fn paths() {
        assert_eq!(Api::from_path("/v1/completions"), Some(Api::Completions));
        assert_eq!(Api::from_path("/v1/chat/completions?x=1"), Some(Api::ChatCompletions));
        assert_eq!(Api::from_path("/v1/messages"), Some(Api::Messages));
        assert_eq!(Api::from_path("/v1/models"), None);
        assert_eq!(Api::from_path("/v1/completionsx"), None);
    }

    #[test]
    fn completion_prompt_forms() {
        let r = p(Api::Completions, r#"{"model":"m","prompt":"hi","max_tokens":5,"stream":true}"#).unwrap();
        assert_eq!(r.prompt, Prompt::Text("hi".into()));
        assert_eq!((r.work.max_tokens, r.stream), (Some(5), true));
        let r = p(Api::Completions, r#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(r.prompt, Prompt::Tokens(vec![1, 2, 3]));
        let r = p(Api::Completions, r#"{"model":"m","prompt":[[4,5],[6]]}"#).unwrap();
        assert_eq!(r.prompt, Prompt::Tokens(vec![4, 5]));
        let r = p(Api::Completions, r#"{"model":"m","prompt":["a","b"],"cache_salt":"s"}"#).unwrap();
        assert_eq!(r.prompt, Prompt::Text("a".into()));
        assert_eq!(r.cache_salt, "s");
    }

    #[test]
    fn chat_forms() {
        let body = r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"x"}}]}],
            "tools":[{"type":"function","function":{"name":"f"}}]}"#;
        let r = p(Api::ChatCompletions, body).unwrap();
        let Prompt::Chat { template_input, canonical } = r.prompt else { panic!("not chat") };
        assert_eq!(canonical, "system\nbe brief\n\nuser\nlook<image_url>\n\n");
        let v: Value = serde_json::from_str(&template_input).unwrap();
        assert_eq!(v["messages"].as_array().unwrap().len(), 2);
        assert_eq!(v["tools"][0]["function"]["name"], "f");
    }

    /// Tool schemas are rendered into the prompt verbatim, so key order is part of the prompt.
    #[test]
    fn template_input_keeps_key_order() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"q"}],
            "tools":[{"type":"function","function":{"name":"f","parameters":{"zeta":1,"alpha":2}}}]}"#;
        let Prompt::Chat { template_input, .. } = p(Api::ChatCompletions, body).unwrap().prompt else { panic!("not chat") };
        assert!(template_input.find("zeta").unwrap() < template_input.find("alpha").unwrap(), "{template_input}");
    }

    #[test]
    fn anthropic_messages() {
        let body = r#"{"model":"m","max_tokens":64,"system":[{"type":"text","text":"sys"}],
            "messages":[{"role":"user","content":"q"},
              {"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]},
              {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"42"}]}]}"#;
        let r = p(Api::Messages, body).unwrap();
        assert_eq!(r.canonical_text(), "system\nsys\n\nuser\nq\n\nassistant\n{\"a\":1}\n\nuser\n42\n\n");
        assert_eq!(r.work.max_tokens, Some(64));
    }

    #[test]
    fn which_streams_carry_usage() {
        let usage = |api, body: &str| p(api, body).unwrap().stream_usage;
        assert!(usage(Api::ChatCompletions, r#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#));
        assert!(!usage(Api::ChatCompletions, r#"{"model":"m","messages":[],"stream":true}"#), "OpenAI streams only on request");
        assert!(!usage(Api::Completions, r#"{"model":"m","prompt":[1],"stream_options":{"include_usage":true}}"#), "not a stream");
        assert!(usage(Api::Messages, r#"{"model":"m","messages":[],"stream":true}"#));
        assert!(usage(Api::Responses, r#"{"model":"m","input":"x","stream":true}"#));
    }

    #[test]
    fn responses_forms() {
        let body = r#"{"model":"m","instructions":"be brief","previous_response_id":"resp_1","max_output_tokens":7,"stream":true,
            "input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},
              {"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"42"}],
            "tools":[{"type":"function","name":"f","parameters":{}}],"store":true}"#;
        let r = p(Api::Responses, body).unwrap();
        assert_eq!((r.work.max_tokens, r.stream, r.previous_response_id.as_deref()), (Some(7), true, Some("resp_1")));
        assert_eq!(r.canonical_text(), "system\nbe brief\n\nuser\nhi\n\nfunction_call\n{}\n\nfunction_call_output\n42\n\n");
        let Prompt::Chat { template_input, .. } = r.prompt else { panic!("not chat") };
        let v: Value = serde_json::from_str(&template_input).unwrap();
        assert_eq!(v.as_object().unwrap().keys().collect::<Vec<_>>(), ["input", "instructions", "tools"], "never store or previous_response_id");
        let r = p(Api::Responses, r#"{"model":"m","input":"just text"}"#).unwrap();
        assert_eq!((r.canonical_text(), r.previous_response_id.as_deref()), ("user\njust text\n\n", None));
        assert_eq!(p(Api::Responses, r#"{"model":"m"}"#), Err(ParseError::Missing("input")));
        assert_eq!(p(Api::Responses, r#"{"model":"m","input":"x","previous_response_id":3}"#).unwrap_err().kind(), "invalid_field");
        assert_eq!(p(Api::ChatCompletions, r#"{"model":"m","messages":[],"previous_response_id":"r"}"#).unwrap().previous_response_id, None);
        assert_eq!(Api::from_path("/v1/responses"), Some(Api::Responses));
        assert_eq!(Api::from_path("/v1/responses/resp_1"), None, "GET/cancel are located, not picked");
    }

    #[test]
    fn errors_name_the_field() {
        assert!(matches!(p(Api::Completions, "{"), Err(ParseError::NotJson(_))));
        assert_eq!(p(Api::Completions, "[]"), Err(ParseError::NotObject));
        assert_eq!(p(Api::Messages, r#"{"messages":[],"max_tokens":1}"#), Err(ParseError::Missing("model")), "Anthropic's API requires it");
        assert_eq!(p(Api::Messages, r#"{"model":"","messages":[],"max_tokens":1}"#), Err(ParseError::Missing("model")));
        assert_eq!(p(Api::Completions, r#"{"model":"m"}"#), Err(ParseError::Missing("prompt")));
        assert_eq!(p(Api::Completions, r#"{"model":3,"prompt":"x"}"#).unwrap_err().kind(), "invalid_field");
        assert_eq!(p(Api::Completions, r#"{"model":"m","prompt":[-1]}"#).unwrap_err().kind(), "invalid_field");
        assert_eq!(p(Api::ChatCompletions, r#"{"model":"m","messages":{}}"#).unwrap_err().kind(), "invalid_field");
        assert_eq!(p(Api::ChatCompletions, r#"{"model":"m","messages":[{"content":"x"}]}"#).unwrap_err().kind(), "invalid_field");
        let e = p(Api::Completions, r#"{"model":"m","prompt":"x","max_tokens":-3}"#).unwrap_err();
        assert_eq!(e.to_string(), "field `max_tokens` must be a non-negative integer");
    }

    /// Found by fuzzing (fuzz/fuzz_targets/request_body.rs): serde's `IgnoredAny` skips strings
    /// without checking their UTF-8, so an object holding invalid UTF-8 was "not an object"
    /// on the serde_json path (here forced by the escaped key) while the scanner said "not JSON".
    #[test]
    fn invalid_utf8_inside_an_object_is_not_json() {
        for body in [&b"{\"\\u0078\":0,\"model\":\"m\",\"x\":[{\"a\xff\":1}]}"[..], b"{\"model\":\"m\",\"x\":[{\"a\xff\":1}]}"] {
            for api in [Api::Completions, Api::ChatCompletions, Api::Messages] {
                assert!(matches!(parse(api, body), Err(ParseError::NotJson(_))), "{api:?} {:?}: {:?}", String::from_utf8_lossy(body), parse(api, body));
            }
        }
    }

    /// Found by fuzzing (fuzz/fuzz_targets/request_body.rs): a repeated `prompt` was taken
    /// from its last occurrence without the earlier ones ever being read, so the scanner path
    /// accepted a body serde_json rejects. Every occurrence must be JSON; the last one counts.
    /// Other repeated fields likewise: only the last one is parsed (an earlier one out of
    /// f64's range made the scanner path fail where the serde_json path did not).
    #[test]
    fn a_repeated_field_must_be_json_every_time_and_the_last_one_counts() {
        for body in
            [r#"{"max_tokens":1e999,"max_tokens":3,"model":"m","prompt":"a"}"#, r#"{"\u0078":0,"max_tokens":1e999,"max_tokens":3,"model":"m","prompt":"a"}"#]
        {
            assert_eq!(p(Api::Completions, body).map(|r| r.work.max_tokens), Ok(Some(3)), "{body}");
        }
        for body in [r#"{"model":[1,],"model":"m","prompt":"a"}"#, r#"{"\u0078":0,"model":[1,],"model":"m","prompt":"a"}"#] {
            assert!(matches!(p(Api::Completions, body), Err(ParseError::NotJson(_))), "{body}");
        }
        assert!(matches!(p(Api::Completions, r#"{"model":"m","prompt":tru,"prompt":[1]}"#), Err(ParseError::NotJson(_))));
        assert!(matches!(p(Api::Completions, r#"{"\u0078":0,"model":"m","prompt":tru,"prompt":[1]}"#), Err(ParseError::NotJson(_))));
        assert!(matches!(parse(Api::Completions, b"{\"model\":\"m\",\"prompt\":\"\xff\",\"prompt\":[1]}"), Err(ParseError::NotJson(_))));
        assert_eq!(p(Api::Completions, r#"{"model":"m","prompt":"a","prompt":[1]}"#).unwrap().prompt, Prompt::Tokens(vec![1]));
        assert_eq!(p(Api::Completions, r#"{"\u0078":0,"model":"m","prompt":"a","prompt":[1]}"#).unwrap().prompt, Prompt::Tokens(vec![1]));
    }

    /// Found by fuzzing (fuzz/fuzz_targets/request_body.rs): the scanner path reads a
    /// completion's `prompt` last, so a body with no `model` and a prompt that is not JSON was
    /// "missing model" there and "not JSON" on the serde_json path.
    #[test]
    fn a_prompt_that_is_not_json_makes_the_body_not_json() {
        for body in [r#"{"moeld":"m","prompt":[[4,$5],[6]]}"#, r#"{"model":1,"prompt":[1,}"#, r#"{"\u0078":0,"moeld":"m","prompt":[[4,$5],[6]]}"#] {
            assert!(matches!(p(Api::Completions, body), Err(ParseError::NotJson(_))), "{body}: {:?}", p(Api::Completions, body));
        }
        assert_eq!(p(Api::Completions, r#"{"prompt":[1]}"#).map(|r| r.model), Ok(String::new()), "the served default model");
    }

    /// Found by fuzzing (fuzz/fuzz_targets/request_body.rs): a repeated prompt holding a number
    /// out of f64's range is JSON to the serde_json path (it is never parsed there) and must be
    /// to the scanner path too.
    #[test]
    fn a_repeated_prompt_may_hold_any_number() {
        for (body, want) in [
            (r#"{"ml":"m","prompt":42.69E2999253710,"prompt":42.69E2}"#, Err(invalid("prompt", "must be a string, token ids, or a list of either"))),
            (r#"{"\u0078":0,"ml":"m","prompt":42.69E2999253710,"prompt":42.69E2}"#, Err(invalid("prompt", "must be a string, token ids, or a list of either"))),
        ] {
            assert_eq!(p(Api::Completions, body), want, "{body}");
        }
        for body in [r#"{"model":"m","prompt":1e999,"prompt":[1]}"#, r#"{"\u0078":0,"model":"m","prompt":1e999,"prompt":[1]}"#] {
            assert_eq!(p(Api::Completions, body).map(|r| r.prompt), Ok(Prompt::Tokens(vec![1])), "{body}");
        }
    }

    /// What the engine reads, read the same way: no model is the served default, fields
    /// nobody reads may nest to any depth, a batch and `n` count whole.
    #[test]
    fn reads_what_the_engine_reads() {
        for body in [r#"{"prompt":"x"}"#, r#"{"model":null,"prompt":"x"}"#, r#"{"model":"","prompt":"x"}"#] {
            assert_eq!(p(Api::Completions, body).map(|r| r.model), Ok(String::new()), "{body}");
        }
        let deep = format!("{}1{}", "[".repeat(150), "]".repeat(150));
        for body in [format!(r#"{{"model":"m","prompt":[1,2],"x":{deep}}}"#), format!(r#"{{"\u0078":0,"model":"m","prompt":[1,2],"y":{deep}}}"#)] {
            assert_eq!(p(Api::Completions, &body).map(|r| r.prompt), Ok(Prompt::Tokens(vec![1, 2])), "an ignored field 150 levels deep");
        }
        let very_deep = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"q"}}],"metadata":{}1{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
        assert!(p(Api::ChatCompletions, &very_deep).is_ok());
        let batch = p(Api::Completions, r#"{"model":"m","prompt":["ab","cde","f"],"n":2}"#).unwrap();
        assert_eq!((batch.work.prompts, batch.work.extra_prompt_tokens, batch.work.sequences()), (3, 4, 6));
        let ids = p(Api::Completions, r#"{"model":"m","prompt":[[1,2],[3],[4,5,6]]}"#).unwrap();
        assert_eq!((ids.prompt, ids.work.prompts, ids.work.extra_prompt_tokens), (Prompt::Tokens(vec![1, 2]), 3, 4));
        assert_eq!(p(Api::Completions, r#"{"model":"m","prompt":["a",[1]]}"#).unwrap_err().kind(), "invalid_field");
        let chat = p(Api::ChatCompletions, r#"{"model":"m","messages":[],"max_tokens":1,"max_completion_tokens":1500,"n":3}"#).unwrap();
        assert_eq!((chat.work.max_tokens, chat.work.sequences()), (Some(1500), 3));
        let resp = p(Api::Responses, r#"{"model":"m","input":"x","max_tokens":1,"background":true,"store":true}"#).unwrap();
        assert_eq!((resp.work.max_tokens, resp.work.background), (None, true));
    }
}
