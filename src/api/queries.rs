//! What the endpoints that walk the store share: the window and filter
//! they parse, a [`Snapshot`] of the store (taken under a short lock) read
//! on a blocking thread within the [`super::limit::Queries`] bound, and
//! the rendering of an [`Answer`] with its envelope's headers.

use std::time::SystemTime;

use axum::{
    http::header,
    response::{IntoResponse, Response},
    Json,
};

use super::{
    authority,
    error::ApiError,
    params::Params,
    recorded::{with_note, with_recorded},
    window::WINDOW_PARAMS,
    ApiState,
};
use crate::{
    profile::model::state::State,
    profile::{
        model::{
            kind::{Group, Kind},
            store::Snapshot,
            window::Window,
        },
        report::{answer::Answer, filter::Filter, spans::select::SpanMatch},
    },
    state::Shared,
};

/// Parameters of `/folded` (and, with `format`, `/flamegraph`).
pub(super) const PROFILE_PARAMS: [&str; 7] =
    ["pid", "tid", "seconds", "from", "until", "kind", "group"];

/// Response header saying what the size bounds merged away.
pub const TRUNCATED_HEADER: &str = "x-wallscope-truncated";

/// The store's slices now; the lock is held only to copy the list.
pub(super) fn snapshot(shared: &Shared) -> Snapshot {
    shared
        .store
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .snapshot()
}

/// What a profile reads: the store's rows, or (spans asked for) only
/// those spent under the spans `matching` keeps; with `by_attr`, every
/// stack under a first frame `NAME=value` of that span attribute.
pub(super) fn profile_snapshot(
    shared: &Shared,
    filter: &Filter,
    matching: &SpanMatch,
    by_attr: Option<&str>,
) -> Snapshot {
    let mut store = snapshot(shared);
    if !matching.is_any() {
        store = store.under_spans(filter.window, filter.pid, |span, record| {
            matching.keeps(span, record)
        });
    }
    match by_attr {
        Some(name) => store.by_attribute(filter.window, filter.pid, name),
        None => store,
    }
}

/// The window `p` asks for, `seconds` bounded by the retention. "The last
/// N seconds" end at the newest slice (the last drain, at most a second
/// ago), so that they hold N seconds of records, not N less the part not
/// drained yet.
pub(super) fn window(p: &Params, shared: &Shared) -> Result<Window, ApiError> {
    let (retention, newest) = {
        let store = shared.store.read().unwrap_or_else(|e| e.into_inner());
        (store.retention(), store.newest_end())
    };
    let now = newest.unwrap_or_else(SystemTime::now);
    super::window::window(p, retention, now).map(authority::clamp)
}

/// `names` and the window's parameters.
pub(super) fn with_window(names: &[&'static str]) -> Vec<&'static str> {
    [names, &WINDOW_PARAMS[..]].concat()
}

/// The filter of a profile query; `group` when none is given.
pub(super) fn filter(shared: &Shared, p: &Params, group: Group) -> Result<Filter, ApiError> {
    let kind = p
        .choice("kind", &Kind::names())?
        .and_then(Kind::parse)
        .unwrap_or(Kind::State(State::Cpu));
    let group = p
        .choice("group", &Group::names())?
        .and_then(Group::parse)
        .unwrap_or(group);
    Ok(Filter {
        pid: p.id("pid")?,
        tid: p.id("tid")?,
        kind,
        group,
        window: window(p, shared)?,
        others_hidden: authority::others_hidden(),
    })
}

/// The JVM report of `pid`'s newest process, if it is a JVM the agent
/// knows (never the report of an earlier process with that pid).
pub(super) fn jvm_report(shared: &Shared, pid: u32) -> Option<crate::jvm::JvmReport> {
    shared.jvms.report_of(shared.processes.newest(pid)?)
}

/// Runs `query` over a snapshot of the store within the bound.
pub(super) async fn over_snapshot<T, F>(state: &ApiState, query: F) -> Result<T, ApiError>
where
    F: FnOnce(&Snapshot) -> T + Send + 'static,
    T: Send + 'static,
{
    let shared = state.shared.clone();
    state.queries.run(move || query(&snapshot(&shared))).await
}

/// A report as JSON, or as text for a terminal when `text`.
pub(super) fn json_or_text<T: serde::Serialize>(
    text: bool,
    report: T,
    render: fn(&T) -> String,
) -> Response {
    if text {
        (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            render(&report),
        )
            .into_response()
    } else {
        Json(report).into_response()
    }
}

/// `response` with the headers of an answer's envelope: its note and what
/// its window holds.
pub(super) fn with_envelope<T>(response: Response, answer: &Answer<T>) -> Response {
    with_recorded(
        with_note(response, answer.note.as_deref()),
        &answer.recorded,
    )
}

/// An answer's report as JSON or text ([`json_or_text`]), with its
/// envelope's headers.
pub(super) fn answer_response<T: serde::Serialize>(
    text: bool,
    answer: Answer<T>,
    render: fn(&T) -> String,
) -> Response {
    let (body, envelope) = answer.split();
    with_envelope(json_or_text(text, body, render), &envelope)
}
