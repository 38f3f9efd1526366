//! Headers on every answer that tell a browser what it may do with it:
//! never guess a type (`nosniff`), never frame it, and run only the web
//! UI's own scripts and styles.
//!
//! Frame names, thread names and paths come from the profiled processes,
//! so any of them could be crafted to look like markup. They are escaped
//! everywhere; these headers are the second line: even an unescaped name
//! could not run a script, load anything from elsewhere, or be framed to
//! trick a click.

use axum::{
    http::{header, HeaderValue},
    response::Response,
};

/// Pages of the web UI: its scripts, styles and images come from this
/// server (the favicon is an empty `data:` URL), no plugins, no `<base>`,
/// no framing.
pub const PAGE_POLICY: &str = "default-src 'self'; img-src 'self' data:; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Everything else (flame graph SVGs, JSON, text): no script at all, only
/// the SVG's own inline `<style>`, no framing.
pub const DATA_POLICY: &str =
    "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'";

/// Adds `Content-Security-Policy`, `X-Content-Type-Options: nosniff` and
/// `X-Frame-Options: DENY` (for browsers without `frame-ancestors`).
pub async fn add(mut response: Response) -> Response {
    let html = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/html"));
    let policy = if html { PAGE_POLICY } else { DATA_POLICY };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(policy),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}
