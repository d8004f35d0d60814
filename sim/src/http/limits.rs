//! Output limits and sample counts, checked and computed in the order vLLM 0.33 does:
//!
//! 1. `TokenizeParams.__post_init__` (`renderers/params.py`), before tokenizing: a requested
//!    limit above `max_model_len` is a 400 ([`check_requested`]).
//! 2. `_token_len_check`, after tokenizing: a prompt longer than `max_model_len` is a 400
//!    ([`check_prompt`]); a prompt may use the whole context.
//! 3. `get_max_tokens` (`serve/utils/api_utils.py`): the limit is the request's, or with none
//!    (chat, responses) the rest of the context, always clamped to `max_model_len - prompt`
//!    ([`max_tokens`]). No generation config is modelled, so there is no other default.
//! 4. `SamplingParams._verify_args` (`sampling_params.py`): `n` in `1..=VLLM_MAX_N_SEQUENCES`,
//!    then the limit at least 1, then (`_verify_greedy_sampling`) `n == 1` at temperature 0
//!    ([`sampling`]).
//!
//! Which field is the limit is the endpoint's business (see `openai.rs`, `responses.rs`).

use super::error::ApiError;

/// vLLM's `VLLM_MAX_N_SEQUENCES` default.
pub const MAX_N_SEQUENCES: i64 = 16384;
/// vLLM's `VLLM_MAX_COMPLETION_PROMPTS` default: most prompts in one completions request.
pub const MAX_COMPLETION_PROMPTS: usize = 1024;
/// `_SAMPLING_EPS`: a temperature below it is greedy sampling.
const SAMPLING_EPS: f64 = 1e-5;

/// The output limit a request asked for, and the field it came from (named in errors).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Requested {
    pub value: Option<i64>,
    pub param: &'static str,
}

/// Step 1: a limit above the whole context is refused before the prompt is even tokenized.
pub fn check_requested(limit: Requested, max_model_len: usize) -> Result<(), ApiError> {
    match limit.value {
        Some(v) if v > max_model_len as i64 => Err(ApiError::validation_value(
            &format!("{}={v} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens.", limit.param),
            limit.param,
            &v.to_string(),
        )),
        _ => Ok(()),
    }
}

/// How the prompt reached the tokenizer: text is tokenized truncated to `max_model_len + 1`
/// tokens (`get_encode_kwargs`), so an over-long text prompt is reported as "at least" that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptForm {
    Text,
    TokenIds,
}

/// Step 2: a prompt longer than the context, even without output tokens.
pub fn check_prompt(prompt_len: usize, max_model_len: usize, form: PromptForm) -> Result<(), ApiError> {
    if prompt_len <= max_model_len {
        return Ok(());
    }
    let count = match form {
        PromptForm::Text => prompt_len.min(max_model_len + 1),
        PromptForm::TokenIds => prompt_len,
    };
    let qualifier = if count == max_model_len + 1 { "at least " } else { "" };
    Err(ApiError::validation_value(
        &format!(
            "This model's maximum context length is {max_model_len} tokens. However, your prompt contains {qualifier}{count} input \
             tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt."
        ),
        "input_tokens",
        &count.to_string(),
    ))
}

/// Step 3, `get_max_tokens`: the requested limit, or the rest of the context, clamped to the
/// rest of the context. May be below 1 (a negative request, a prompt filling the context):
/// [`sampling`] refuses that.
pub fn max_tokens(requested: Option<i64>, prompt_len: usize, max_model_len: usize) -> i64 {
    let room = max_model_len.saturating_sub(prompt_len) as i64;
    requested.map_or(room, |v| v.min(room))
}

/// Step 4: `n` and the effective limit as `SamplingParams` validates them (neither check
/// names a parameter except the limit's). Returns `(n, max_tokens)` for the engine.
pub fn sampling(n: i64, max_tokens: i64, temperature: Option<f64>) -> Result<(usize, usize), ApiError> {
    if n < 1 {
        return Err(ApiError::BadRequest(format!("n must be at least 1, got {n}.")));
    }
    if n > MAX_N_SEQUENCES {
        return Err(ApiError::BadRequest(format!(
            "n must be at most {MAX_N_SEQUENCES}, got {n}. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable."
        )));
    }
    if max_tokens < 1 {
        return Err(ApiError::validation_value(&format!("max_tokens must be at least 1, got {max_tokens}."), "max_tokens", &max_tokens.to_string()));
    }
    if n > 1 && temperature.is_some_and(|t| t < SAMPLING_EPS) {
        return Err(ApiError::BadRequest(format!("n must be 1 when using greedy sampling, got {n}.")));
    }
    Ok((n as usize, max_tokens as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(e: ApiError) -> String {
        e.to_string()
    }

    #[test]
    fn a_request_above_the_context_is_refused_naming_its_field() {
        let limit = |value| Requested { value, param: "max_completion_tokens" };
        assert!(check_requested(limit(Some(100)), 100).is_ok());
        assert!(check_requested(limit(None), 100).is_ok());
        assert!(check_requested(limit(Some(-5)), 100).is_ok(), "negative limits fail later, in SamplingParams");
        let e = message(check_requested(limit(Some(101)), 100).unwrap_err());
        assert_eq!(
            e,
            "max_completion_tokens=101 cannot be greater than max_model_len=100. Please request fewer output tokens. \
             (parameter=max_completion_tokens, value=101)"
        );
    }

    #[test]
    fn a_prompt_may_fill_the_context_but_not_exceed_it() {
        assert!(check_prompt(100, 100, PromptForm::Text).is_ok());
        let e = message(check_prompt(150, 100, PromptForm::TokenIds).unwrap_err());
        assert!(e.contains("your prompt contains 150 input tokens") && e.ends_with("(parameter=input_tokens, value=150)"), "{e}");
        let e = message(check_prompt(150, 100, PromptForm::Text).unwrap_err());
        assert!(e.contains("your prompt contains at least 101 input tokens"), "text is tokenized truncated: {e}");
    }

    #[test]
    fn the_limit_is_the_request_or_the_rest_of_the_context_clamped() {
        assert_eq!(max_tokens(None, 30, 100), 70);
        assert_eq!(max_tokens(Some(16), 30, 100), 16);
        assert_eq!(max_tokens(Some(90), 30, 100), 70, "clamped silently");
        assert_eq!(max_tokens(None, 100, 100), 0, "refused by sampling()");
        assert_eq!(max_tokens(Some(-3), 30, 100), -3);
    }

    #[test]
    fn sampling_checks_n_then_the_limit_then_greedy_n() {
        assert_eq!(sampling(1, 5, Some(0.0)).unwrap(), (1, 5));
        assert_eq!(sampling(3, 5, None).unwrap(), (3, 5), "the default temperature (1.0) samples");
        assert_eq!(sampling(MAX_N_SEQUENCES, 5, Some(0.7)).unwrap(), (16384, 5));
        assert_eq!(message(sampling(0, 0, None).unwrap_err()), "n must be at least 1, got 0.", "n is checked first");
        assert!(message(sampling(16385, 5, None).unwrap_err()).starts_with("n must be at most 16384, got 16385."));
        assert_eq!(message(sampling(2, 0, Some(0.0)).unwrap_err()), "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)");
        assert_eq!(message(sampling(2, 5, Some(0.0)).unwrap_err()), "n must be 1 when using greedy sampling, got 2.");
    }
}
