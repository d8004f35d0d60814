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
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
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
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::Engine(_) => StatusCode::BAD_REQUEST,
            ApiError::Chat(ChatError::Io { .. } | ChatError::Tokenizer { .. } | ChatError::NoTemplate) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            ApiError::Chat(_) => StatusCode::BAD_REQUEST,
            ApiError::ModelNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Typed { status, .. } => *status,
        }
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
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (kind, param) = match &self {
            ApiError::Typed { kind, param, .. } => (*kind, *param),
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
    /// The error as a `/v1/messages` response.
    pub fn anthropic(self) -> Response {
        let status = self.status();
        (status, Json(anthropic_error(status, &self.to_string()))).into_response()
    }
}

/// Parse a JSON body, turning serde's message into a 400.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("invalid request body: {e}")))
}
