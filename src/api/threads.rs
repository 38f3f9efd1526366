//! `/threads`: a process's time by thread and pool.

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
    queries::{answer_response, jvm_report, over_snapshot, window, with_window},
    ApiState,
};
use crate::profile::report::{answer, threads::render_text};

pub(super) async fn threads(
    State(state): State<ApiState>,
    authority: Option<Extension<authority::Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let reader = authority::reader_of(authority);
    let p = Params::parse(q.as_deref(), &with_window(&["pid", "format"]))?;
    let pid = p
        .id("pid")?
        .ok_or_else(|| ApiError::bad("pid", "required"))?;
    let window = window(&p, &state.shared)?;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let live_host = LiveHost::of(&state);
    let mut answer = over_snapshot(&state, move |store| {
        answer::threads::threads(store, &live_host, pid, window, &reader.sight())
    })
    .await??;
    answer.body.jvm = jvm_report(&state.shared, pid);
    Ok(answer_response(text, answer, render_text))
}
