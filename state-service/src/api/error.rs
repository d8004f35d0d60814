//! The API's one error type: every failure becomes a status and a JSON `{"error": "..."}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed body or invalid values.
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Missing or wrong bearer token; names which one.
    #[error("missing or wrong {0} (expected `Authorization: Bearer <token>`)")]
    Unauthorized(&'static str),
    #[error("admin API disabled: no admin_token configured")]
    AdminDisabled,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// Shared state (Redis) could not take the change; nothing was changed.
    #[error("{0}")]
    Unavailable(String),
    /// Every pick slot was busy for longer than the queue bound.
    #[error("overloaded: {0} picks in progress; use the default route")]
    Overloaded(usize),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::AdminDisabled => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        tracing::debug!(%status, error = %self, "request rejected");
        (status, Json(serde_json::json!({ "error": self.to_string() }))).into_response()
    }
}
