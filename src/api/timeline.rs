//! `/timeline`: each thread's (or pool's) time by state across a window,
//! for the web UI's thread-state timeline.

use std::time::SystemTime;

use axum::{
    extract::{RawQuery, State},
    response::{IntoResponse, Response},
    Json,
};

use super::{
    error::ApiError,
    params::Params,
    queries::{over_snapshot, unknown_pid, window, with_window},
    recorded::with_recorded,
    ApiState,
};
use crate::profile::timeline::{self, Grouping, DEFAULT_ROWS, MAX_ROWS};

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
    let processes = state.shared.processes.clone();
    let answer = over_snapshot(&state, move |store| {
        let recorded = store.recorded(window, SystemTime::now());
        match timeline::timeline(store, pid, window, group, limit) {
            Some(mut t) => {
                t.recorded = recorded;
                Ok(t)
            }
            None => match unknown_pid(store, &processes, pid) {
                Some(unknown) => Err(ApiError::NotFound(unknown)),
                None => Ok(timeline::Timeline {
                    recorded,
                    ..timeline::Timeline::empty(pid, window, group)
                }),
            },
        }
    })
    .await??;
    let recorded = answer.recorded.clone();
    Ok(with_recorded(Json(answer).into_response(), &recorded))
}
