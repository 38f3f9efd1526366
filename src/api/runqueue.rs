//! `/runqueue`: how long the host, a process, a cgroup or a container
//! waited for a CPU and was throttled, or every cgroup's (`cgroup=all`).

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
    queries::{answer_response, over_snapshot, window, with_window},
    ApiState,
};
use crate::profile::report::{
    answer::runqueue::{self, Asked},
    cgroup_list::{self, ALL},
    runqueue::render_text,
};

pub(super) async fn runqueue(
    State(state): State<ApiState>,
    authority: Option<Extension<authority::Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let reader = authority::reader_of(authority);
    let p = Params::parse(
        q.as_deref(),
        &with_window(&["pid", "cgroup", "container", "format"]),
    )?;
    let window = window(&p, &state.shared)?;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let asked = Asked {
        pid: p.id("pid")?,
        cgroup: p.text("cgroup").map(str::to_string),
        container: p.text("container").map(str::to_string),
    };
    if asked.container.is_some() && (asked.pid.is_some() || asked.cgroup.is_some()) {
        return Err(ApiError::bad(
            "container",
            "give one of `pid`, `cgroup` and `container`",
        ));
    }
    if asked.pid.is_none() && asked.cgroup.as_deref() == Some(ALL) {
        let live_host = LiveHost::of(&state);
        let answer = over_snapshot(&state, move |store| {
            runqueue::cgroups(store, &live_host, window)
        })
        .await?;
        return Ok(answer_response(text, answer, cgroup_list::render_text));
    }
    // Resolving a cgroup path walks the cgroup tree: blocking work too.
    let live_host = LiveHost::of(&state);
    let answer = over_snapshot(&state, move |store| {
        runqueue::runqueue(store, &live_host, asked, window, &reader.sight())
    })
    .await??;
    Ok(answer_response(text, answer, render_text))
}
