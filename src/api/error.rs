//! API errors and their HTTP status codes.

use axum::{
    http::{header, HeaderValue, StatusCode},
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
    /// A `Host` this server does not answer to (DNS rebinding protection).
    #[error(
        "this server does not answer to host `{0}`: use its IP address, localhost or \
         its host name, or start wallscope with `--allow-host NAME` for this name"
    )]
    MisdirectedHost(String),
    /// No or a wrong bearer token (`--token-file`).
    #[error("{0} (this wallscope requires the token of its --token-file)")]
    Unauthorized(String),
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
            ApiError::MisdirectedHost(_) => StatusCode::MISDIRECTED_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!("{self}");
        }
        let challenge = matches!(self, ApiError::Unauthorized(_));
        let mut response = (
            status,
            Json(serde_json::json!({ "error": self.to_string() })),
        )
            .into_response();
        if challenge {
            // RFC 6750: a 401 says which scheme it wants.
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
