//! API errors and their HTTP status codes.

use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use thiserror::Error;

use crate::profile::report::answer::Refusal;

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
    /// Too many queries running or waiting (see [`super::limit`]).
    #[error("busy: {0}")]
    Busy(String),
    /// A request that conflicts with one in progress (one `/trace`
    /// recording at a time).
    #[error("{0}")]
    Conflict(String),
    /// What this daemon cannot do here (e.g. the kernel refused a program).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A query that failed on its own (a bug: it panicked).
    #[error("{0}")]
    Failed(String),
    /// No or a wrong bearer token (`--token-file`).
    #[error("{0} (this wallscope requires the token of its --token-file)")]
    Unauthorized(String),
    /// What the client's local user may not read (see
    /// [`super::authority`]).
    #[error("forbidden: {0}")]
    Forbidden(String),
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
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Render(_) | ApiError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::MisdirectedHost(_) => StatusCode::MISDIRECTED_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let busy = matches!(self, ApiError::Busy(_));
        if status.is_server_error() && !busy {
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
        if busy {
            // Queries take seconds: ask for a pause, not a tight loop.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
        }
        response
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Bad(param, message) => ApiError::bad(param, message),
            Refusal::NotFound(message) => ApiError::NotFound(message),
        }
    }
}
