//! The parameters that choose and bound the rows of `/processes` and
//! `/threads`, and the process of `/threads` and `/explain`: `name=`
//! (processes whose names contain it, see
//! [`crate::profile::report::identity::matches`]) and `limit=` (or `top=`): at most that many rows,
//! the cut said in a header ([`ROWS_OMITTED_HEADER`]) and, for text, a
//! last line.

use axum::{http::HeaderValue, response::Response};

use super::{error::ApiError, params::Params, queries::over_snapshot, ApiState};
use crate::profile::{
    model::{store::Snapshot, window::Window},
    report::{
        disclosure::Reader,
        identity::{self, Name},
        processes::{self, SortBy},
    },
};

/// The parameters [`name`] and [`limit`] read.
pub(super) const SELECT_PARAMS: [&str; 3] = ["name", "limit", "top"];

/// Most rows a `limit=` may ask for (more is all of them anyway).
const MAX_LIMIT: u64 = 1_000_000;

/// Rows a text answer shows when no `limit=` is given.
pub(super) const TEXT_LIMIT: usize = 50;

/// Response header: rows `limit=` left out of a JSON answer (whose array
/// keeps its shape).
pub const ROWS_OMITTED_HEADER: &str = "x-wallscope-rows-omitted";

/// The `name=` value, if given.
pub(super) fn name(p: &Params) -> Result<Option<Name>, ApiError> {
    p.text("name")
        .map(|raw| Name::parse(raw).map_err(|e| ApiError::bad("name", e)))
        .transpose()
}

/// Processes a `name=` that matches several lists in its error.
const LISTED: usize = 10;

/// The process `pid=` or `name=` names, one of which is required.
pub(super) async fn required_pid(
    state: &ApiState,
    p: &Params,
    window: Window,
    reader: &Reader,
) -> Result<u32, ApiError> {
    pid_or_name(state, p, window, reader)
        .await?
        .ok_or_else(|| ApiError::bad("pid", "required (or `name=`)"))
}

/// The process asked about: `pid=`, or the one process of `window` whose
/// names contain `name=` (400 when none or several do, listing them);
/// `None` when neither is given.
pub(super) async fn pid_or_name(
    state: &ApiState,
    p: &Params,
    window: Window,
    reader: &Reader,
) -> Result<Option<u32>, ApiError> {
    match (p.id("pid")?, name(p)?) {
        (Some(_), Some(_)) => Err(ApiError::bad("name", "give `pid=` or `name=`, not both")),
        (Some(pid), None) => Ok(Some(pid)),
        (None, Some(name)) => {
            let reader = reader.clone();
            over_snapshot(state, move |store| one_named(store, window, &name, &reader))
                .await?
                .map(Some)
        }
        (None, None) => Ok(None),
    }
}

/// The `limit=` (or `top=`) value, if given: a whole number from 1.
pub(super) fn limit(p: &Params) -> Result<Option<usize>, ApiError> {
    let limit = p.int("limit", 1, MAX_LIMIT)?;
    let top = p.int("top", 1, MAX_LIMIT)?;
    if limit.is_some() && top.is_some() {
        return Err(ApiError::bad(
            "top",
            "`top` is another name for `limit`: give one",
        ));
    }
    Ok(limit.or(top).map(|n| n as usize))
}

/// The limit of an answer: the one asked for, else [`TEXT_LIMIT`] for
/// text and none for JSON.
pub(super) fn limit_for(asked: Option<usize>, text: bool) -> Option<usize> {
    asked.or(text.then_some(TEXT_LIMIT))
}

/// `response` with [`ROWS_OMITTED_HEADER`] when rows were cut.
pub(super) fn with_omitted(mut response: Response, omitted: usize) -> Response {
    if omitted > 0 {
        response
            .headers_mut()
            .insert(ROWS_OMITTED_HEADER, HeaderValue::from(omitted));
    }
    response
}

/// The pid of the one process of `window` whose names contain `name`.
fn one_named(
    store: &Snapshot,
    window: Window,
    name: &Name,
    reader: &Reader,
) -> Result<u32, ApiError> {
    let select = (None, Some(name));
    let rows = processes::processes(store, window, SortBy::Wall, select, &reader.sight());
    match rows.as_slice() {
        [] => Err(ApiError::bad(
            "name",
            format!("no process of the {} has a name, command line, executable, program or container containing it", window.describe()),
        )),
        [one] => Ok(one.pid),
        many => {
            let listed: Vec<String> = many
                .iter()
                .take(LISTED)
                .map(|r| format!("{} ({})", r.pid, identity::Shown::short_command(r.identity.as_ref(), 60)))
                .collect();
            Err(ApiError::bad(
                "name",
                format!(
                    "{} processes match, give `pid=` (most wall time first): {}",
                    many.len(),
                    listed.join(", ")
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(q: &str) -> Params {
        Params::parse(Some(q), &SELECT_PARAMS).unwrap()
    }

    #[test]
    fn limits_and_names_are_checked() {
        assert_eq!(limit(&parsed("limit=5")).unwrap(), Some(5));
        assert_eq!(limit(&parsed("top=7")).unwrap(), Some(7));
        assert_eq!(limit(&parsed("")).unwrap(), None);
        for bad in [
            "limit=0",
            "limit=x",
            "top=-1",
            "limit=1&top=2",
            "limit=99999999999",
        ] {
            assert!(limit(&parsed(bad)).is_err(), "{bad}");
        }
        assert_eq!(limit_for(None, true), Some(TEXT_LIMIT));
        assert_eq!(limit_for(None, false), None);
        assert_eq!(limit_for(Some(3), true), Some(3));
        assert!(name(&parsed("name=")).is_err());
        assert!(name(&parsed(&format!("name={}", "a".repeat(300)))).is_err());
        assert!(name(&parsed("name=Shop")).unwrap().is_some());
    }
}
