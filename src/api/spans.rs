//! `/spans`: a process's OpenTelemetry spans in a window with their wall
//! time by state, threads and top stacks (`sort=`, `limit=`, `trace_id=`,
//! `attr.NAME=`), or one span in full (`span_id=`).

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
    select::{self, SELECT_PARAMS},
    span_params::{span_match, split_attrs, SPAN_PARAMS},
    ApiState,
};
use crate::profile::report::spans::{
    self,
    text::{render_detail_text, render_text},
    Asked, SortBy,
};

pub(super) async fn spans(
    State(state): State<ApiState>,
    authority: Option<Extension<authority::Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let reader = authority::reader_of(authority);
    let (rest, attrs) = split_attrs(q.as_deref())?;
    let allowed = [&["pid", "format", "sort"][..], &SPAN_PARAMS, &SELECT_PARAMS].concat();
    let p = Params::parse(Some(&rest), &with_window(&allowed))?;
    let window = window(&p, &state.shared)?;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let sort = p.choice("sort", &SortBy::NAMES)?.and_then(SortBy::parse);
    let limit = select::limit_for(select::limit(&p)?, text);
    let matching = span_match(&p, attrs)?;
    let pid = select::required_pid(&state, &p, window, &reader).await?;
    let live_host = LiveHost::of(&state);
    if let Some(span) = matching.span {
        let answer = over_snapshot(&state, move |store| {
            spans::detail(store, &live_host, (pid, span), window, &reader.sight())
        })
        .await??;
        return Ok(answer_response(text, answer, render_detail_text));
    }
    let asked = Asked {
        pid,
        window,
        sort: sort.unwrap_or(SortBy::Wall),
        limit,
        spans: matching,
    };
    let answer = over_snapshot(&state, move |store| {
        spans::list(store, &live_host, &asked, &reader.sight())
    })
    .await??;
    let omitted = answer.body.rows_omitted;
    Ok(select::with_omitted(
        answer_response(text, answer, render_text),
        omitted,
    ))
}
