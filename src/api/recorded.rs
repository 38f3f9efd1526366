//! Headers saying what an answer holds: the seconds of its window the
//! daemon has records of, their resolution, and why it is empty.

use axum::{http::HeaderValue, response::Response};

use crate::profile::store::{Recorded, ResolutionPart};

/// Response header saying why an answer for a known process is empty.
pub const NOTE_HEADER: &str = "x-wallscope-note";

/// Response header with the seconds of the window the daemon has records
/// of: less than the window when it reaches before the daemon started (or
/// past what the retention keeps).
pub const RECORDED_HEADER: &str = "x-wallscope-recorded-seconds";

/// Response header with the resolution of each part of the window, newest
/// first, e.g. `1s:0-60s ago, 10s:60-300s ago, 60s:300-600s ago (pools)`:
/// the store merges old slices in time and, under memory pressure, folds
/// their per-thread stack rows into per-pool rows (`(pools)`).
pub const RESOLUTION_HEADER: &str = "x-wallscope-resolution";

/// Adds the [`RECORDED_HEADER`] and the [`RESOLUTION_HEADER`].
pub(super) fn with_recorded(mut response: Response, recorded: &Recorded) -> Response {
    let headers = response.headers_mut();
    headers.insert(RECORDED_HEADER, HeaderValue::from(recorded.seconds));
    if let Ok(line) = HeaderValue::from_str(&recorded.describe()) {
        headers.insert(RESOLUTION_HEADER, line);
    }
    response
}

/// The seconds a report says it recorded and its resolution, for
/// [`with_recorded`].
pub(super) fn recorded_of(seconds: u64, resolution: &[ResolutionPart]) -> Recorded {
    Recorded {
        seconds,
        resolution: resolution.to_vec(),
    }
}

/// Adds the [`NOTE_HEADER`] when there is a note.
pub(super) fn with_note(mut response: Response, note: Option<&str>) -> Response {
    if let Some(value) = note.and_then(|n| HeaderValue::from_str(n).ok()) {
        response.headers_mut().insert(NOTE_HEADER, value);
    }
    response
}
