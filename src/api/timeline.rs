//! `/timeline`: each thread's (or pool's) time by state across a window,
//! for the web UI's thread-state timeline.

use axum::{
    extract::{RawQuery, State},
    response::{IntoResponse, Response},
    Json,
};

use super::{
    error::ApiError,
    host_facts::LiveHost,
    params::Params,
    queries::{over_snapshot, window, with_envelope, with_window},
    ApiState,
};
use crate::profile::report::{
    answer,
    timeline::{Grouping, DEFAULT_ROWS, MAX_ROWS},
};

/// `/timeline?pid=&group=thread|pool&limit=&seconds=|from=&until=`: 404
/// for a pid never seen; a known process with nothing in the window gets
/// 200 with no rows.
pub(super) async fn timeline(
    State(state): State<ApiState>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref(), &with_window(&["pid", "group", "limit"]))?;
    let pid = p
        .id("pid")?
        .ok_or_else(|| ApiError::bad("pid", "required"))?;
    let window = window(&p, &state.shared)?;
    let group = match p.choice("group", &["thread", "pool"])? {
        Some("pool") => Grouping::Pool,
        _ => Grouping::Thread,
    };
    let limit = p
        .int("limit", 1, MAX_ROWS as u64)?
        .map_or(DEFAULT_ROWS, |n| n as usize);
    let live_host = LiveHost::of(&state);
    let answer = over_snapshot(&state, move |store| {
        answer::timeline::timeline(store, &live_host, pid, window, group, limit)
    })
    .await??;
    let (timeline, envelope) = answer.split();
    Ok(with_envelope(Json(timeline).into_response(), &envelope))
}
