//! One error type for every handler, mapped to vLLM's OpenAI-style error body (or, for
//! `/v1/messages`, its Anthropic one) in one place.

use crate::chat::ChatError;
use crate::engine::EngineError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Chat(#[from] ChatError),
    #[error("{0}")]
    Unavailable(String),
    /// An error vLLM writes with its own type and `param` (`create_error_response(message,
    /// err_type, status_code, param)`), e.g. the Responses API's `invalid_request_error`s.
    #[error("{message}")]
    Typed { status: StatusCode, kind: &'static str, message: String, param: Option<&'static str> },
    /// The body failed the request model's pydantic validation, before any handler ran: vLLM's
    /// `validation_exception_handler` answers 400 `Bad Request` in the OpenAI shape, on every
    /// route (the Anthropic ones too). Built by [`request_validation`].
    #[error("{message}")]
    RequestValidation { message: String, param: String },
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::Engine(_) => StatusCode::BAD_REQUEST,
            ApiError::Chat(ChatError::Io { .. } | ChatError::Tokenizer { .. } | ChatError::NoTemplate) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            ApiError::Chat(_) => StatusCode::BAD_REQUEST,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Typed { status, .. } => *status,
            ApiError::RequestValidation { .. } => StatusCode::BAD_REQUEST,
        }
    }

    /// vLLM's `_check_model` refusal of a model it does not serve (`served`, its one name).
    pub fn model_not_found(model: &str, served: &str) -> ApiError {
        let message = format!("The model `{model}` does not exist. Valid aliases: {served}.");
        ApiError::Typed { status: StatusCode::NOT_FOUND, kind: "NotFoundError", message, param: Some("model") }
    }

    /// vLLM's `invalid_request_error` with a `param` (status 400 unless given).
    pub fn invalid(status: StatusCode, message: impl Into<String>, param: &'static str) -> ApiError {
        ApiError::Typed { status, kind: "invalid_request_error", message: message.into(), param: Some(param) }
    }

    /// A `VLLMValidationError` raised while the request parses: `BadRequestError`, the
    /// parameter as `param`, and `str(exc)`, which appends `(parameter=...)` to the message.
    pub fn validation(message: &str, param: &'static str) -> ApiError {
        ApiError::Typed { status: StatusCode::BAD_REQUEST, kind: "BadRequestError", message: format!("{message} (parameter={param})"), param: Some(param) }
    }

    /// A `VLLMValidationError` that also carries the refused value: `str(exc)` appends
    /// `(parameter=..., value=...)`.
    pub fn validation_value(message: &str, param: &'static str, value: &str) -> ApiError {
        let message = format!("{message} (parameter={param}, value={value})");
        ApiError::Typed { status: StatusCode::BAD_REQUEST, kind: "BadRequestError", message, param: Some(param) }
    }
}

/// One pydantic error as vLLM's validation handler prints it (`_format_error`): the error
/// dict's Python repr, `loc` joined with dots, `input` summarized to a string.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    kind: &'static str,
    /// E.g. `body.model`.
    loc: &'static str,
    msg: String,
    /// The summarized input (`_summarize_error_input`), a string.
    input: String,
    /// A `value_error`'s exception, as Python writes it.
    ctx: Option<String>,
}

impl FieldError {
    /// A required field is absent; pydantic's input is then the whole body (`body_len` keys).
    pub fn missing(loc: &'static str, body_len: usize) -> FieldError {
        FieldError { kind: "missing", loc, msg: "Field required".into(), input: format!("<dict of {body_len} items>"), ctx: None }
    }

    /// A field validator raised `ValueError(reason)` for `input` (already summarized).
    pub fn value_error(loc: &'static str, reason: &str, input: String) -> FieldError {
        let ctx = Some(format!("{{'error': ValueError({})}}", py_repr(reason)));
        FieldError { kind: "value_error", loc, msg: format!("Value error, {reason}"), input, ctx }
    }

    /// The field has the wrong type (`expected` as pydantic names it: `string`, `integer`).
    pub fn wrong_type(loc: &'static str, expected: &str, input: String) -> FieldError {
        let kind = if expected == "string" { "string_type" } else { "int_type" };
        FieldError { kind, loc, msg: format!("Input should be a valid {expected}"), input, ctx: None }
    }

    fn repr(&self) -> String {
        let mut s = format!("{{'type': '{}', 'loc': '{}', 'msg': {}, 'input': {}", self.kind, self.loc, py_repr(&self.msg), py_repr(&self.input));
        if let Some(ctx) = &self.ctx {
            s += &format!(", 'ctx': {ctx}");
        }
        s + "}"
    }
}

/// `_summarize_error_input` of a JSON value: strings as they are (cut at 200 characters),
/// containers as `<dict of N items>`, anything else as Python's `str()` of it.
pub fn summarize_input(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::String(s) if s.chars().count() > 200 => format!("{}...[truncated]", s.chars().take(200).collect::<String>()),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("<list of {} items>", a.len()),
        Value::Object(o) => format!("<dict of {} items>", o.len()),
        Value::Null => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Number(n) => n.to_string(),
    }
}

/// Python's `repr` of a string: single quotes unless it holds one and no double quote.
fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// The 400 vLLM's `validation_exception_handler` writes for pydantic errors: `N validation
/// error(s):` and one line per error (at most 10), `param` the first error's location.
/// `errors` must not be empty.
pub fn request_validation(errors: &[FieldError]) -> ApiError {
    let count = errors.len();
    let label = if count == 1 { "error" } else { "errors" };
    let mut message = format!("{count} validation {label}:\n");
    for e in errors.iter().take(10) {
        message += &format!("  {}\n", e.repr());
    }
    if count > 10 {
        message += &format!("  ...and {} more {label}\n", count - 10);
    }
    let param = errors.first().map_or(String::new(), |e| e.loc.to_string());
    ApiError::RequestValidation { message: message.trim_end().to_string(), param }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (kind, param) = match &self {
            ApiError::Typed { kind, param, .. } => (*kind, param.map(str::to_string)),
            ApiError::RequestValidation { param, .. } => ("Bad Request", Some(param.clone())),
            _ => match status {
                StatusCode::NOT_FOUND => ("NotFoundError", None),
                StatusCode::BAD_REQUEST => ("BadRequestError", None),
                _ => ("InternalServerError", None),
            },
        };
        let body = serde_json::json!({
            "error": {"message": self.to_string(), "type": kind, "param": param, "code": status.as_u16()}
        });
        (status, Json(body)).into_response()
    }
}

/// An error as vLLM's Anthropic endpoint writes it (a response body or an SSE `error` event):
/// `{"type": "error", "error": {type, message}}`, the type in Anthropic's vocabulary.
pub fn anthropic_error(status: StatusCode, message: &str) -> serde_json::Value {
    let kind = match status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        _ => "api_error",
    };
    serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
}

impl ApiError {
    /// The error as a `/v1/messages` response: Anthropic's shape for what the handler raises,
    /// the OpenAI shape for a body that failed validation before it (vLLM's app-wide handler).
    pub fn anthropic(self) -> Response {
        if matches!(self, ApiError::RequestValidation { .. }) {
            return self.into_response();
        }
        let status = self.status();
        (status, Json(anthropic_error(status, &self.to_string()))).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pydantic_errors_print_as_vllm_prints_them() {
        let e = request_validation(&[FieldError::value_error("body.model", "Model is required", String::new())]);
        assert_eq!(
            e.to_string(),
            "1 validation error:\n  {'type': 'value_error', 'loc': 'body.model', 'msg': 'Value error, Model is required', 'input': '', \
             'ctx': {'error': ValueError('Model is required')}}"
        );
        let e = request_validation(&[FieldError::missing("body.model", 2), FieldError::wrong_type("body.max_tokens", "integer", "None".into())]);
        assert_eq!(
            e.to_string(),
            "2 validation errors:\n  {'type': 'missing', 'loc': 'body.model', 'msg': 'Field required', 'input': '<dict of 2 items>'}\n  \
             {'type': 'int_type', 'loc': 'body.max_tokens', 'msg': 'Input should be a valid integer', 'input': 'None'}"
        );
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("a'\"b\n"), "'a\\'\"b\\n'");
        assert_eq!(summarize_input(&serde_json::json!(0)), "0");
    }
}
