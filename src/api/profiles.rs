//! `/folded` and `/flamegraph`: the stacks a filter selects, as folded
//! text or an SVG flame graph, within the size bounds.

use axum::{
    extract::{RawQuery, State},
    http::{header, HeaderValue},
    response::{IntoResponse, Response},
};

use super::{
    error::ApiError,
    host_facts::LiveHost,
    params::Params,
    queries::{filter, profile_snapshot, with_envelope, PROFILE_PARAMS, TRUNCATED_HEADER},
    span_params::{group_attr_needs_pid, span_match, split_attrs, split_group_attr, SPAN_PARAMS},
    ApiState,
};
use crate::profile::{
    model::kind::Group,
    report::{
        answer::profile::profile,
        query,
        render::{self, GraphLabels},
        truncate::{Limits, Truncation},
    },
};

pub(super) async fn folded(
    State(state): State<ApiState>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let (rest, attrs) = split_attrs(q.as_deref())?;
    let (rest, by_attr) = split_group_attr(&rest)?;
    let p = Params::parse(Some(&rest), &[&PROFILE_PARAMS[..], &SPAN_PARAMS].concat())?;
    let filter = filter(&state.shared, &p, Group::Process)?;
    let matching = span_match(&p, attrs)?;
    group_attr_needs_pid(by_attr.as_deref(), filter.pid)?;
    let shared = state.shared.clone();
    let live_host = LiveHost::of(&state);
    let answer = state
        .queries
        .run(move || {
            let store = profile_snapshot(&shared, &filter, &matching, by_attr.as_deref());
            profile(&store, &live_host, filter, Limits::API)
        })
        .await??;
    let (profile, envelope) = answer.split();
    let text = render::folded_text(&profile.folded);
    let response = with_truncation(folded_response(text), profile.truncated, Limits::API);
    Ok(with_envelope(response, &envelope))
}

fn folded_response(text: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

/// Marks a response whose profile lost stacks to the size bounds, e.g.
/// `x-wallscope-truncated: stacks=1234 us=5678 max_stacks=20000 max_bytes=8388608`,
/// then ` max_frames=N` for a flame graph ([`Limits::GRAPH`]), when the
/// fold's memory budget was spent, ` over_budget=N` (rows
/// merged unseen) and, when lines were cut, ` elided_lines=N`.
fn with_truncation(
    mut response: Response,
    truncated: Option<Truncation>,
    limits: Limits,
) -> Response {
    if let Some(t) = truncated {
        let mut value = format!(
            "stacks={} us={} max_stacks={} max_bytes={}",
            t.stacks,
            query::ns_to_us(t.ns),
            limits.stacks,
            limits.bytes
        );
        if limits.frames != usize::MAX {
            value.push_str(&format!(" max_frames={}", limits.frames));
        }
        if t.over_budget > 0 {
            value.push_str(&format!(" over_budget={}", t.over_budget));
        }
        if t.elided_lines > 0 {
            value.push_str(&format!(" elided_lines={}", t.elided_lines));
        }
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(TRUNCATED_HEADER, value);
        }
    }
    response
}

pub(super) async fn flamegraph(
    State(state): State<ApiState>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let (rest, attrs) = split_attrs(q.as_deref())?;
    let (rest, by_attr) = split_group_attr(&rest)?;
    let allowed = [&PROFILE_PARAMS[..], &SPAN_PARAMS, &["format"]].concat();
    let p = Params::parse(Some(&rest), &allowed)?;
    let svg = p.choice("format", &["svg", "folded"])?.unwrap_or("svg") == "svg";
    let filter = filter(&state.shared, &p, Group::Process)?;
    let matching = span_match(&p, attrs)?;
    group_attr_needs_pid(by_attr.as_deref(), filter.pid)?;
    let shared = state.shared.clone();
    // What inferno and the SVG hold grows with the frames drawn.
    let limits = if svg { Limits::GRAPH } else { Limits::API };
    let live_host = LiveHost::of(&state);
    let (body, truncated) = state
        .queries
        .run(move || {
            let store = profile_snapshot(&shared, &filter, &matching, by_attr.as_deref());
            let (profile, envelope) = profile(&store, &live_host, filter, limits)?.split();
            if !svg {
                let text = render::folded_text(&profile.folded);
                return Ok((
                    with_envelope(folded_response(text), &envelope),
                    profile.truncated,
                ));
            }
            let labels = GraphLabels {
                subject: profile.subject(),
                kind: profile.filter.kind,
                group: profile.filter.group,
                window: profile.filter.window,
            };
            let svg = match envelope.note.as_deref() {
                Some(note) => render::note_svg(&labels, note),
                None => render::flamegraph_svg(&profile.folded, &labels, false)
                    .map(render::still_svg)
                    .map_err(ApiError::Render)?,
            };
            let response = ([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response();
            Ok::<_, ApiError>((with_envelope(response, &envelope), profile.truncated))
        })
        .await??;
    Ok(with_truncation(body, truncated, limits))
}
