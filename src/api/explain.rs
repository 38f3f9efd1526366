//! `/explain`: ranked findings that state a cause with its numbers, for
//! one process (`pid=`, or `name=` as `/threads` takes it) or, host-wide, for the processes that lost the
//! most time waiting (`limit=`).

use std::time::{Duration, SystemTime};

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
    select, ApiState,
};
use crate::{
    process::ProcessTable,
    profile::{
        model::{live::LiveThread, store::Snapshot},
        report::{
            answer::{
                explain::{self, Around},
                Answer,
            },
            disclosure::Sight,
            explain::{
                host::{self, HostExplanation},
                text, Explanation,
            },
            stuck::WaitFacts,
        },
    },
};

/// Processes `/explain` of the host lists when no `limit` is given.
pub const DEFAULT_LIMIT: u64 = 10;
/// Largest `limit`: each process listed is explained in full.
pub const MAX_LIMIT: u64 = 50;
/// How long a thread must have been blocked for its mutex owner to be
/// read (as `/blocked`'s default).
const STUCK_AFTER: Duration = Duration::from_secs(1);
/// Blocked threads whose waits are read, at most (the reads are bounded
/// again per process in `wait_facts`).
const MAX_STUCK_THREADS: usize = 2_000;

pub(super) async fn explain(
    State(state): State<ApiState>,
    authority: Option<Extension<authority::Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let reader = authority::reader_of(authority);
    let p = Params::parse(
        q.as_deref(),
        &with_window(&["pid", "name", "limit", "format"]),
    )?;
    let limit = p.int("limit", 1, MAX_LIMIT)?;
    let window = window(&p, &state.shared)?;
    let pid = select::pid_or_name(&state, &p, window, &reader).await?;
    if pid.is_some() && limit.is_some() {
        return Err(ApiError::bad(
            "limit",
            "`limit` bounds the host-wide answer: give it without `pid`",
        ));
    }
    let limit = limit.unwrap_or(DEFAULT_LIMIT) as usize;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let live_host = LiveHost::of(&state);
    let processes = state.shared.processes.clone();
    let answer = over_snapshot(&state, move |store| {
        let sight = reader.sight();
        match pid {
            Some(pid) => {
                let facts = stuck_facts(store, &processes, &[pid]);
                let around = around(&live_host, &facts, &sight);
                explain::process(store, pid, window, &around).map(Explained::Process)
            }
            None => {
                let ranked = explain::ranked(store, window, &sight);
                let facts = stuck_facts(store, &processes, &host::first(&ranked, limit));
                let around = around(&live_host, &facts, &sight);
                let host = explain::host(store, window, (ranked, limit), &around);
                Ok(Explained::Host(host))
            }
        }
    })
    .await??;
    Ok(match answer {
        Explained::Process(one) => answer_response(text, one, text::render),
        Explained::Host(host) => answer_response(text, host, text::render_host),
    })
}

/// What the explanations read beside the store, now.
fn around<'a>(host: &'a LiveHost, facts: &'a WaitFacts, sight: &'a Sight) -> Around<'a> {
    Around {
        host,
        facts,
        sight,
        now: SystemTime::now(),
        own_pid: std::process::id(),
    }
}

/// Who holds the mutexes the threads of `pids` blocked for a while wait
/// for, read live (as `/blocked` does).
fn stuck_facts(store: &Snapshot, processes: &ProcessTable, pids: &[u32]) -> WaitFacts {
    let mut matched: Vec<&LiveThread> = store
        .live()
        .threads
        .iter()
        .filter(|t| t.in_state >= STUCK_AFTER && pids.contains(&t.pid))
        .collect();
    matched.truncate(MAX_STUCK_THREADS);
    super::wait_facts::read(store, processes, &matched)
}

/// The answer about one process or the host.
enum Explained {
    Process(Answer<Explanation>),
    Host(Answer<HostExplanation>),
}
