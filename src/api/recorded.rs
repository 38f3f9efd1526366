//! Headers saying what an answer holds: the seconds of its window the
//! daemon has records of, their resolution, and why it is empty.

use axum::{http::HeaderValue, response::Response};

use crate::profile::model::store::Recorded;

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

/// Response header with the exact span the answer holds, `FROM/UNTIL` in
/// RFC 3339 to the nanosecond: the asked window, less what the daemon has
/// no records of.
pub const COVERED_HEADER: &str = "x-wallscope-covered";

/// Response header naming the slices an edge of the window cut, whose
/// figures count pro rata: `start 2.500 s of a 10.000 s slice`.
pub const PRORATED_HEADER: &str = "x-wallscope-prorated";

/// Adds the [`RECORDED_HEADER`], the [`RESOLUTION_HEADER`], and the
/// [`COVERED_HEADER`] and [`PRORATED_HEADER`] when they apply.
pub(super) fn with_recorded(mut response: Response, recorded: &Recorded) -> Response {
    let headers = response.headers_mut();
    headers.insert(RECORDED_HEADER, HeaderValue::from(recorded.seconds));
    let covered = recorded.covered.as_ref();
    let lines = [
        (RESOLUTION_HEADER, Some(recorded.describe())),
        (COVERED_HEADER, covered.map(|c| c.line())),
        (PRORATED_HEADER, covered.and_then(|c| c.prorated_line())),
    ];
    for (name, line) in lines {
        if let Some(value) = line.and_then(|l| HeaderValue::from_str(&l).ok()) {
            headers.insert(name, value);
        }
    }
    response
}

/// Adds the [`NOTE_HEADER`] when there is a note.
pub(super) fn with_note(mut response: Response, note: Option<&str>) -> Response {
    if let Some(value) = note.and_then(|n| HeaderValue::from_str(n).ok()) {
        response.headers_mut().insert(NOTE_HEADER, value);
    }
    response
}
