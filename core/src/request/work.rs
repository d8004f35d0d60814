//! What a request asks the engine to do beyond its prompt, read exactly as vLLM 0.33.0 reads
//! it, because a tenant's budget is charged for it before the engine starts: the output limit
//! the engine obeys for the API, how many sequences it generates, and whether the work goes on
//! after the answer (a background response). A field vLLM ignores is ignored here too, so a
//! client cannot be reserved for one limit while the engine obeys another.

use super::{invalid, Api, ParseError};
use serde_json::{Map, Value};

/// vLLM's `VLLM_MAX_N_SEQUENCES`: the largest `n` it accepts (`vllm/sampling_params.py`).
pub const MAX_N: u32 = 16_384;

/// What `/v1/completions` generates when the request sets no `max_tokens` (or sets it to
/// null): `vllm/entrypoints/openai/completion/protocol.py` defaults the field to 16 and resets
/// an explicit null to 16.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

/// The engine work a request asks for, besides prefilling its (first) prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    /// Most tokens the engine generates per sequence, from the field it obeys for the API
    /// (`None`: no limit was set; the engine stops at the context length).
    pub max_tokens: Option<u32>,
    /// `n`: sequences per prompt (chat and completions; 1 elsewhere).
    pub n: u32,
    /// Prompts of a `/v1/completions` batch (vLLM runs one request per prompt); 1 elsewhere.
    pub prompts: u32,
    /// At least the tokens of a batch's prompts after the first (token ids counted, text
    /// counted as one token per byte, which no tokenizer exceeds).
    pub extra_prompt_tokens: u32,
    /// Responses API `background`: the creation answers at once and the work goes on.
    pub background: bool,
}

impl Default for Work {
    fn default() -> Self {
        Work { max_tokens: None, n: 1, prompts: 1, extra_prompt_tokens: 0, background: false }
    }
}

impl Work {
    /// Sequences the engine generates: `n` for every prompt.
    pub fn sequences(&self) -> u32 {
        self.n.saturating_mul(self.prompts)
    }
}

/// The output limit vLLM obeys for `api` (`None` when the request sets none):
/// - chat: `max_completion_tokens` when not null, else `max_tokens`
///   (`vllm/entrypoints/openai/chat_completion/serving.py`, where the sampling params are built);
/// - completions: `max_tokens`, 16 when absent or null;
/// - Responses: `max_output_tokens`; a `max_tokens` field is not part of the request and is
///   ignored (`vllm/entrypoints/openai/responses/protocol.py`);
/// - Anthropic messages: `max_tokens` (vLLM copies it into both chat fields).
pub(super) fn max_tokens(api: Api, obj: &Map<String, Value>) -> Result<Option<u32>, ParseError> {
    let field = |name: &'static str| -> Result<Option<u32>, ParseError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().and_then(|n| u32::try_from(n).ok()).map(Some).ok_or(invalid(name, "must be a non-negative integer")),
        }
    };
    Ok(match api {
        Api::ChatCompletions => match field("max_completion_tokens")? {
            Some(n) => Some(n),
            None => field("max_tokens")?,
        },
        Api::Completions => Some(field("max_tokens")?.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS)),
        Api::Responses => field("max_output_tokens")?,
        Api::Messages => field("max_tokens")?,
    })
}

/// `n` as vLLM reads it for chat and completions (1..=16384; absent or null: 1). The
/// Responses and Anthropic APIs have no `n`: a field of that name is ignored.
pub(super) fn n(api: Api, obj: &Map<String, Value>) -> Result<u32, ParseError> {
    if !matches!(api, Api::ChatCompletions | Api::Completions) {
        return Ok(1);
    }
    match obj.get("n") {
        None | Some(Value::Null) => Ok(1),
        Some(v) => v.as_u64().and_then(|n| u32::try_from(n).ok()).filter(|n| (1..=MAX_N).contains(n)).ok_or(invalid("n", "must be an integer from 1 to 16384")),
    }
}

/// Responses API `background` (vLLM runs it in a task of its own).
pub(super) fn background(api: Api, obj: &Map<String, Value>) -> Result<bool, ParseError> {
    if api != Api::Responses {
        return Ok(false);
    }
    match obj.get("background") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid("background", "must be a boolean")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn the_limit_is_the_field_the_engine_obeys() {
        let both = obj(json!({"max_tokens": 1, "max_completion_tokens": 1500}));
        assert_eq!(max_tokens(Api::ChatCompletions, &both), Ok(Some(1500)), "chat: max_completion_tokens wins");
        let null_mct = obj(json!({"max_tokens": 7, "max_completion_tokens": null}));
        assert_eq!(max_tokens(Api::ChatCompletions, &null_mct), Ok(Some(7)), "chat: a null max_completion_tokens defers to max_tokens");
        assert_eq!(max_tokens(Api::ChatCompletions, &obj(json!({}))), Ok(None));
        let resp = obj(json!({"max_tokens": 1, "max_output_tokens": 900}));
        assert_eq!(max_tokens(Api::Responses, &resp), Ok(Some(900)));
        assert_eq!(max_tokens(Api::Responses, &obj(json!({"max_tokens": 1}))), Ok(None), "Responses ignores max_tokens");
        assert_eq!(max_tokens(Api::Completions, &obj(json!({}))), Ok(Some(16)), "completions default to 16");
        assert_eq!(max_tokens(Api::Completions, &obj(json!({"max_tokens": null}))), Ok(Some(16)));
        assert_eq!(max_tokens(Api::Messages, &obj(json!({"max_tokens": 64, "max_completion_tokens": 9}))), Ok(Some(64)));
        assert!(max_tokens(Api::ChatCompletions, &obj(json!({"max_completion_tokens": -1}))).is_err());
    }

    #[test]
    fn n_counts_for_chat_and_completions_only() {
        assert_eq!(n(Api::ChatCompletions, &obj(json!({"n": 4}))), Ok(4));
        assert_eq!(n(Api::Completions, &obj(json!({"n": null}))), Ok(1));
        assert_eq!(n(Api::Responses, &obj(json!({"n": 50}))), Ok(1), "not a Responses field");
        assert!(n(Api::ChatCompletions, &obj(json!({"n": 0}))).is_err());
        assert!(n(Api::ChatCompletions, &obj(json!({"n": 16385}))).is_err());
        let w = Work { n: 3, prompts: 4, ..Work::default() };
        assert_eq!(w.sequences(), 12);
    }

    #[test]
    fn background_is_a_responses_flag() {
        assert_eq!(background(Api::Responses, &obj(json!({"background": true}))), Ok(true));
        assert_eq!(background(Api::Responses, &obj(json!({}))), Ok(false));
        assert_eq!(background(Api::ChatCompletions, &obj(json!({"background": true}))), Ok(false));
        assert!(background(Api::Responses, &obj(json!({"background": 1}))).is_err());
    }
}
