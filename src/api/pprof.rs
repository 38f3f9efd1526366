//! `/pprof`: a profile in pprof's format, gzipped, for `go tool pprof`,
//! Pyroscope, Parca and speedscope.

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
    span_params::{span_match, split_attrs, SPAN_PARAMS},
    ApiState,
};
use crate::{
    export::pprof::{self, Detail},
    profile::{
        model::kind::Group,
        report::{
            answer::{empty_note, Answer},
            query,
        },
    },
};

/// `/pprof?pid=&tid=&kind=&group=&seconds=|from=&until=`: samples labelled
/// by thread unless `group` says otherwise. An empty profile (with a
/// note header) for a known process with nothing in the window; 404 for
/// an unknown one. Past the profile's memory bound, the lightest rows are
/// merged into `[truncated]` samples and the `x-wallscope-truncated`
/// header says `rows=N us=T max_bytes=B`.
pub(super) async fn pprof(
    State(state): State<ApiState>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let (rest, attrs) = split_attrs(q.as_deref())?;
    let p = Params::parse(Some(&rest), &[&PROFILE_PARAMS[..], &SPAN_PARAMS].concat())?;
    let filter = filter(&state.shared, &p, Group::Thread)?;
    let matching = span_match(&p, attrs)?;
    let shared = state.shared.clone();
    let live_host = LiveHost::of(&state);
    let ((bytes, cut), envelope) = state
        .queries
        .run(move || {
            let store = profile_snapshot(&shared, &filter, &matching, None);
            let (profile, cut) =
                pprof::build_within(&store, &filter, Detail::Threads, pprof::MAX_TABLE_BYTES);
            let note = if profile.sample.is_empty() {
                Some(empty_note(&store, &live_host, &filter)?)
            } else {
                None
            };
            let answer = Answer::over(&store, filter.window, note, |_| {
                (pprof::encode_gzip(&profile), cut)
            });
            Ok::<_, ApiError>(answer.split())
        })
        .await??;
    let mut response = (
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"profile.pb.gz\"",
            ),
        ],
        bytes,
    )
        .into_response();
    // Rows past the profile's memory bound, merged into `[truncated]`.
    if let Some(cut) = cut {
        let value = format!(
            "rows={} us={} max_bytes={}",
            cut.rows,
            query::ns_to_us(cut.ns),
            pprof::MAX_TABLE_BYTES
        );
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(TRUNCATED_HEADER, value);
        }
    }
    Ok(with_envelope(response, &envelope))
}
