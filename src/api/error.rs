//! API errors and their HTTP status codes.

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use thiserror::Error;

/// Everything a request can fail with. User mistakes are 4xx with a message
/// naming what was wrong; only our own failures are 5xx.
#[derive(Debug, Error)]
pub enum ApiError {
    #[error("parameter `{param}`: {message}")]
    BadParam { param: String, message: String },
    #[error("{0}")]
    NotFound(String),
    #[error("rendering failed: {0}")]
    Render(#[source] std::io::Error),
}

impl ApiError {
    /// A 400 naming the offending parameter.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError::BadParam {
            param: param.to_string(),
            message: message.into(),
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadParam { .. } => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Render(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!("{self}");
        }
        (
            status,
            Json(serde_json::json!({ "error": self.to_string() })),
        )
            .into_response()
    }
}
