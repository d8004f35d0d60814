//! Protobuf by default, JSON with the same field names for humans and tests. The response
//! uses the request's format.

use super::ApiError;
use axum::http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::{de::DeserializeOwned, Serialize};

pub const PROTOBUF: &str = "application/x-protobuf";
pub const JSON: &str = "application/json";

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Format {
    Protobuf,
    Json,
}

impl Format {
    /// From `content-type`; absent means protobuf (what the filter sends).
    pub fn from_headers(headers: &HeaderMap) -> Result<Format, ApiError> {
        let Some(value) = headers.get(CONTENT_TYPE) else { return Ok(Format::Protobuf) };
        let text = value.to_str().unwrap_or("");
        let mime = text.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        match mime.as_str() {
            "application/x-protobuf" | "application/protobuf" | "application/octet-stream" => Ok(Format::Protobuf),
            "application/json" => Ok(Format::Json),
            _ => Err(ApiError::UnsupportedMediaType(format!(
                "unsupported content-type {text:?}: send {PROTOBUF} or {JSON}"
            ))),
        }
    }

    /// Decodes a message; `name` appears in the error ("invalid protobuf PickRequest: ...").
    pub fn decode<T: prost::Message + DeserializeOwned + Default>(self, body: &[u8], name: &str) -> Result<T, ApiError> {
        match self {
            Format::Protobuf => T::decode(body).map_err(|e| ApiError::BadRequest(format!("invalid protobuf {name}: {e}"))),
            Format::Json => serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("invalid JSON {name}: {e}"))),
        }
    }

    pub fn respond<T: prost::Message + Serialize>(self, message: &T) -> Response {
        match self {
            Format::Protobuf => ([(CONTENT_TYPE, HeaderValue::from_static(PROTOBUF))], message.encode_to_vec()).into_response(),
            Format::Json => axum::Json(message).into_response(),
        }
    }
}
