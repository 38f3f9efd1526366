//! `/blocked`: the threads off-CPU at the last drain for at least
//! `min_seconds`, longest first, with what they wait on.

use std::time::{Duration, SystemTime};

use axum::{
    extract::{RawQuery, State},
    response::Response,
    Extension,
};

use super::{
    authority,
    error::ApiError,
    host_facts::LiveHost,
    params::Params,
    queries::{json_or_text, over_snapshot},
    ApiState,
};
use crate::profile::report::{
    answer::unknown_pid,
    blocked::{self, BlockedFilter},
};

/// `min_seconds` of `/blocked` when not given: waits shorter than a second
/// are mostly the normal ebb and flow of work.
pub const DEFAULT_MIN_BLOCKED: Duration = Duration::from_secs(1);
/// Largest `min_seconds` (about 31 years: longer than any uptime).
const MAX_MIN_BLOCKED: Duration = Duration::from_secs(1_000_000_000);
/// Threads `/blocked` shows when no `limit` is given.
pub const DEFAULT_BLOCKED_LIMIT: u64 = 100;
/// Largest `limit` of `/blocked`: an answer holds at most this many
/// stacks (each ≤ 127 user and 127 kernel frames).
pub const MAX_BLOCKED_LIMIT: u64 = 2_000;

/// `/blocked`: the threads off-CPU at the last drain for at least
/// `min_seconds`, longest first.
pub(super) async fn blocked(
    State(state): State<ApiState>,
    authority: Option<Extension<authority::Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let reader = authority::reader_of(authority);
    let p = Params::parse(q.as_deref(), &["pid", "min_seconds", "limit", "format"])?;
    let filter = BlockedFilter {
        pid: p.id("pid")?,
        min: p
            .seconds("min_seconds", MAX_MIN_BLOCKED)?
            .unwrap_or(DEFAULT_MIN_BLOCKED),
        limit: p
            .int("limit", 1, MAX_BLOCKED_LIMIT)?
            .unwrap_or(DEFAULT_BLOCKED_LIMIT) as usize,
    };
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let live_host = LiveHost::of(&state);
    let processes = state.shared.processes.clone();
    let report = over_snapshot(&state, move |store| {
        let live = store.live();
        if let Some(pid) = filter.pid {
            let blocked_now = live.threads.iter().any(|t| t.pid == pid);
            if let Some(unknown) = unknown_pid(store, &live_host, pid).filter(|_| !blocked_now) {
                return Err(ApiError::NotFound(unknown));
            }
        }
        // What each thread waits on, read live (see `wait_facts`).
        let facts = super::wait_facts::read(store, &processes, &blocked::matched(live, &filter));
        let sight = reader.sight();
        Ok(blocked::report(
            live,
            &filter,
            &facts,
            SystemTime::now(),
            &sight,
        ))
    })
    .await??;
    Ok(json_or_text(text, report, blocked::render_text))
}
