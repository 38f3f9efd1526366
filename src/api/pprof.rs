//! `/pprof`: a profile in pprof's format, gzipped, for `go tool pprof`,
//! Pyroscope, Parca and speedscope.

use std::time::SystemTime;

use axum::{
    extract::{RawQuery, State},
    http::header,
    response::{IntoResponse, Response},
};

use super::{
    error::ApiError,
    params::Params,
    queries::{empty_note, filter, snapshot, with_note, with_recorded, PROFILE_PARAMS},
    ApiState,
};
use crate::{
    export::pprof::{self, Detail},
    profile::kind::Group,
};

/// `/pprof?pid=&tid=&kind=&group=&seconds=|from=&until=`: samples labelled
/// by thread unless `group` says otherwise. An empty profile (with a
/// note header) for a known process with nothing in the window; 404 for
/// an unknown one.
pub(super) async fn pprof(
    State(state): State<ApiState>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref(), &PROFILE_PARAMS)?;
    let filter = filter(&state.shared, &p, Group::Thread)?;
    let shared = state.shared.clone();
    let (bytes, note, recorded) = state
        .queries
        .run(move || {
            let store = snapshot(&shared);
            let profile = pprof::build(&store, &filter, Detail::Threads);
            let note = if profile.sample.is_empty() {
                Some(empty_note(&store, &filter)?)
            } else {
                None
            };
            let recorded = store.recorded(filter.window, SystemTime::now());
            Ok::<_, ApiError>((pprof::encode_gzip(&profile), note, recorded))
        })
        .await??;
    let response = (
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
    Ok(with_recorded(
        with_note(response, note.as_deref()),
        &recorded,
    ))
}
