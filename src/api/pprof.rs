//! `/pprof`: a profile in pprof's format, gzipped, for `go tool pprof`,
//! Pyroscope, Parca and speedscope.

use axum::{
    extract::{RawQuery, State},
    http::header,
    response::{IntoResponse, Response},
};

use super::{
    error::ApiError,
    params::Params,
    queries::{empty_message, filter, snapshot, PROFILE_PARAMS},
    ApiState,
};
use crate::{
    export::pprof::{self, Detail},
    profile::kind::Group,
};

/// `/pprof?pid=&tid=&kind=&group=&seconds=|from=&until=`: samples labelled
/// by thread unless `group` says otherwise; 404 when nothing matches.
pub(super) async fn pprof(
    State(state): State<ApiState>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref(), &PROFILE_PARAMS)?;
    let filter = filter(&state.shared, &p, Group::Thread)?;
    let shared = state.shared.clone();
    let bytes = state
        .queries
        .run(move || {
            let store = snapshot(&shared);
            let profile = pprof::build(&store, &filter, Detail::Threads);
            if profile.sample.is_empty() {
                return Err(ApiError::NotFound(empty_message(&store, &filter)));
            }
            Ok(pprof::encode_gzip(&profile))
        })
        .await??;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"profile.pb.gz\"",
            ),
        ],
        bytes,
    )
        .into_response())
}
