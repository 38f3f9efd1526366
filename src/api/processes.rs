//! `/processes`: every process of the window with its time by state and
//! identity (found by `name=`, at most `limit=` rows), or processes summed
//! by name, parent, cgroup or container (`group=`). The host's CPU count
//! and utilisation in the window ride in headers (see [`super::host`]).

use axum::{
    extract::{RawQuery, State},
    http::header,
    response::{IntoResponse, Response},
    Extension, Json,
};

use super::{
    authority::{self, Authority},
    error::ApiError,
    host,
    host_facts::LiveHost,
    params::Params,
    queries::{jvm_report, over_snapshot, window, with_envelope, with_window},
    select::{self, SELECT_PARAMS},
    ApiState,
};
use crate::profile::{
    model::window::Window,
    report::{
        answer::Answer,
        disclosure::{self, Reader},
        groups::{self, GroupBy},
        host_facts::HostFacts,
        identity,
        processes::{self, ProcessSummary, SortBy},
        processes_text, strip,
    },
};

/// `/processes`: every process recorded in the window, or for a local user
/// other than root, their own (each with its own process's time only) and
/// a count of the others ([`authority::reader`]).
pub(super) async fn processes(
    State(state): State<ApiState>,
    authority: Option<Extension<Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let reader = authority::reader_of(authority);
    let allowed = [
        &["sort", "comm", "group", "strip", "format"][..],
        &SELECT_PARAMS,
    ]
    .concat();
    let p = Params::parse(q.as_deref(), &with_window(&allowed))?;
    let window = window(&p, &state.shared)?;
    let sort = p
        .choice("sort", &SortBy::names())?
        .and_then(SortBy::parse)
        .unwrap_or(SortBy::Cpu);
    let comm = p.text("comm").map(str::to_string);
    let with_strips = p.choice("strip", &["0", "1"])? == Some("1");
    let name = select::name(&p)?;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let limit = select::limit_for(select::limit(&p)?, text);
    if let Some(by) = p.choice("group", &GroupBy::NAMES)? {
        if text || name.is_some() || limit.is_some() {
            return Err(ApiError::bad(
                "group",
                "`format=text`, `name=` and `limit=` are for process rows, not with `group=`",
            ));
        }
        let by: GroupBy = by.parse().expect("a listed name");
        return grouped(&state, reader, window, by, sort, comm).await;
    }
    let ((mut rows, cpu), envelope) = over_snapshot(&state, move |store| {
        let sight = reader.sight();
        let select = (comm.as_deref(), name.as_ref());
        let mut rows = processes::processes(store, window, sort, select, &sight);
        if with_strips {
            let mut strips = strip::strips(store, window, &sight);
            for row in &mut rows {
                row.strip = strips.remove(&row.pid);
            }
        }
        Answer::over(store, window, None, |_| {
            (rows, host::cpu_use(store, window))
        })
        .split()
    })
    .await?;
    let omitted = cut_keeping_others(&mut rows, limit);
    mark_runtimes(&state, &mut rows);
    let body = match text {
        true => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            processes_text::render(&rows, omitted, limit.unwrap_or(0)),
        )
            .into_response(),
        false => Json(rows).into_response(),
    };
    let response = select::with_omitted(with_envelope(body, &envelope), omitted);
    Ok(host::with_cpu_use(response, &cpu))
}

/// `/processes?group=`: processes summed by `by`.
async fn grouped(
    state: &ApiState,
    reader: Reader,
    window: Window,
    by: GroupBy,
    sort: SortBy,
    comm: Option<String>,
) -> Result<Response, ApiError> {
    let live_host = LiveHost::of(state);
    let ((rows, cpu), envelope) = over_snapshot(state, move |store| {
        // A user other than root sums their own processes only.
        let sight = reader.sight();
        let rows = groups::groups(store, &live_host, window, by, sort, comm.as_deref(), &sight);
        Answer::over(store, window, None, |_| {
            (rows, host::cpu_use(store, window))
        })
        .split()
    })
    .await?;
    let response = with_envelope(Json(rows).into_response(), &envelope);
    Ok(host::with_cpu_use(response, &cpu))
}

/// Cuts `rows` to `limit`, the `[other users]` summary row (pid 0, last)
/// kept; returns the rows cut.
fn cut_keeping_others(rows: &mut Vec<ProcessSummary>, limit: Option<usize>) -> usize {
    let others = rows.pop_if(|r| r.pid == 0 && r.comm.starts_with(disclosure::OTHER_USERS));
    let omitted = identity::cut(rows, limit);
    rows.extend(others);
    omitted
}

/// What the daemon knows of each row's runtime: its JVM, a kernel thread.
fn mark_runtimes(state: &ApiState, rows: &mut [ProcessSummary]) {
    let live_host = LiveHost::of(state);
    for row in rows {
        row.jvm = jvm_report(&state.shared, row.pid);
        row.kernel = live_host.is_kernel_thread(row.pid);
    }
}
