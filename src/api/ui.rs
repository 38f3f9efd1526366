//! The web UI: the pages and scripts of `web/`, built into the binary so
//! that the daemon serves them with nothing else installed on the host and
//! nothing fetched from elsewhere. Written without third-party JavaScript:
//! a flame graph, a timeline and tables are a few hundred lines each.

use std::collections::BTreeMap;

use axum::{
    extract::Path,
    http::{header, StatusCode},
    response::{Html, IntoResponse, Response},
    Json,
};
use serde::Serialize;

use super::error::ApiError;
use crate::profile::{
    model::kind::{Group, Kind, STATES_CPU_FIRST},
    report::{processes::SortBy, strip},
};

const HOST_PAGE: &str = include_str!("../../web/index.html");
const PROCESS_PAGE: &str = include_str!("../../web/process.html");

/// The files under `/ui/`: name, content type, content.
const ASSETS: [(&str, &str, &str); 6] = [
    ("app.css", "text/css", include_str!("../../web/ui/app.css")),
    ("common.js", JS, include_str!("../../web/ui/common.js")),
    ("host.js", JS, include_str!("../../web/ui/host.js")),
    ("process.js", JS, include_str!("../../web/ui/process.js")),
    ("flame.js", JS, include_str!("../../web/ui/flame.js")),
    ("timeline.js", JS, include_str!("../../web/ui/timeline.js")),
];
const JS: &str = "text/javascript; charset=utf-8";

/// `/`: processes by wall time or CPU, split by state.
pub(super) async fn host_page() -> Html<&'static str> {
    Html(HOST_PAGE)
}

/// `/process/PID`: one process's threads, timeline, flame graphs and
/// runqueue latency; the page reads its pid and view from the URL.
pub(super) async fn process_page(Path(pid): Path<String>) -> Result<Html<&'static str>, ApiError> {
    if pid.is_empty() || pid.len() > 10 || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ApiError::bad(
            "pid",
            format!("expected a process id, got `{pid}`"),
        ));
    }
    Ok(Html(PROCESS_PAGE))
}

/// `/ui/meta.json`: the names the pages offer, taken from the enums the
/// API parses them with, so that the scripts keep no copy of them.
#[derive(Debug, Serialize)]
pub struct Meta {
    /// Thread states, in the order the pages draw them.
    pub states: Vec<&'static str>,
    /// Profile kinds (`kind=`).
    pub kinds: Vec<&'static str>,
    /// Flame graph groupings (`group=`).
    pub groups: Vec<&'static str>,
    /// `/processes` orders (`sort=`).
    pub sorts: Vec<&'static str>,
    /// The letters of `/processes?strip=1`, by the state each stands for.
    pub strip_letters: BTreeMap<char, &'static str>,
}

impl Meta {
    /// The lists as this build names them.
    pub fn new() -> Meta {
        Meta {
            states: STATES_CPU_FIRST.iter().map(|s| s.name()).collect(),
            kinds: Kind::names().to_vec(),
            groups: Group::names(),
            sorts: SortBy::names().to_vec(),
            strip_letters: STATES_CPU_FIRST
                .iter()
                .map(|s| (strip::letter(*s), s.name()))
                .collect(),
        }
    }
}

impl Default for Meta {
    fn default() -> Self {
        Meta::new()
    }
}

/// `/ui/meta.json`: see [`Meta`].
pub(super) async fn meta() -> Response {
    ([(header::CACHE_CONTROL, "no-cache")], Json(Meta::new())).into_response()
}

/// `/ui/NAME`: one of [`ASSETS`].
pub(super) async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, kind, body)) => (
            [
                (header::CONTENT_TYPE, *kind),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, format!("no such file: /ui/{name}\n")).into_response(),
    }
}
