//! `/threads`: a process's time by thread and pool, the process chosen by
//! `pid=` or by `name=` (the one process of the window whose names
//! contain it), at most `limit=` thread rows.

use axum::{
    extract::{RawQuery, State},
    http::header,
    response::{IntoResponse, Response},
    Extension,
};

use super::{
    authority,
    error::ApiError,
    host_facts::LiveHost,
    params::Params,
    queries::{answer_response, jvm_report, over_snapshot, window, with_envelope, with_window},
    select::{self, SELECT_PARAMS},
    span_params::{span_match, split_attrs, SPAN_PARAMS},
    ApiState,
};
use crate::profile::report::{answer, identity, thread_fold, threads::render_text};

pub(super) async fn threads(
    State(state): State<ApiState>,
    authority: Option<Extension<authority::Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let reader = authority::reader_of(authority);
    let (rest, attrs) = split_attrs(q.as_deref())?;
    let allowed = [&["pid", "format", "fold"][..], &SELECT_PARAMS, &SPAN_PARAMS].concat();
    let p = Params::parse(Some(&rest), &with_window(&allowed))?;
    let matching = span_match(&p, attrs)?;
    let window = window(&p, &state.shared)?;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let fold = p.choice("fold", &["on", "off"])? != Some("off");
    let limit = select::limit_for(select::limit(&p)?, text);
    let pid = select::required_pid(&state, &p, window, &reader).await?;
    let live_host = LiveHost::of(&state);
    let mut answer = over_snapshot(&state, move |store| {
        // Asked for spans: each thread's exact time under them.
        let under;
        let store = if matching.is_any() {
            store
        } else {
            let keep = |span, record: Option<&_>| matching.keeps(span, record);
            under = store.under_spans(window, Some(pid), keep);
            &under
        };
        answer::threads::threads(store, &live_host, pid, window, &reader.sight())
    })
    .await??;
    answer.body.jvm = jvm_report(&state.shared, pid);
    if fold {
        thread_fold::fold(&mut answer.body);
    }
    let omitted = identity::cut(&mut answer.body.threads, limit);
    let response = match (text, identity::omitted_line(omitted, limit.unwrap_or(0))) {
        (true, Some(line)) => {
            let (body, envelope) = answer.split();
            let text = format!("{}{line}\n", render_text(&body));
            let plain = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
            with_envelope((plain, text).into_response(), &envelope)
        }
        _ => answer_response(text, answer, render_text),
    };
    Ok(select::with_omitted(response, omitted))
}
