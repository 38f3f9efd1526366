//! `/trace?pid=P&seconds=N`: records P's threads for N seconds (1..=30,
//! default 5) and answers with the Perfetto trace of their timelines (see
//! [`crate::trace`]). One recording at a time: the others wait in the
//! recorder's queue ([`crate::trace::queue`]: one per user, root first),
//! 409 for a user's second request, 503 past the wait bound. A client
//! that hangs up leaves the queue, and its recording stops.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    extract::{RawQuery, State},
    http::{header, HeaderName, HeaderValue},
    response::{IntoResponse, Response},
    Extension,
};

use super::{authority::Authority, error::ApiError, params::Params, queries::snapshot, ApiState};
use crate::{
    profile::{model::window::Window, report::threads},
    state::Shared,
    trace::{
        perfetto::Names,
        queue::{QueueError, Stop, Who, MAX_WAIT},
        QueueEvent, Recorder, Trace, TraceError, MAX_SECONDS,
    },
    untrusted::refusals::{self, Reason, What},
};

/// Seconds recorded when the request gives none.
const DEFAULT_SECONDS: u64 = 5;
/// Seconds of the store whose full thread names (JVM, Python) are used.
const NAMES_SECONDS: u64 = 10;

/// Response headers saying what the trace holds: its window (ns of
/// CLOCK_MONOTONIC, and its start in Unix ns), its slices and threads, and
/// the events cut past the bound or lost in the kernel.
pub const WINDOW_HEADER: &str = "x-wallscope-trace-window-ns";
pub const START_HEADER: &str = "x-wallscope-trace-start-unix-ns";
pub const SLICES_HEADER: &str = "x-wallscope-trace-slices";
pub const CUT_HEADER: &str = "x-wallscope-trace-cut";
pub const LOST_HEADER: &str = "x-wallscope-trace-lost";
/// `true` when the recording ended early because root asked for one.
pub const PREEMPTED_HEADER: &str = "x-wallscope-trace-preempted";

/// Stops the request's recording, or counts its leaving the queue, when
/// the handler is dropped before it finished: its client hung up.
struct Hangup {
    recorder: Arc<Recorder>,
    stop: Arc<Stop>,
    recording: bool,
    done: bool,
}

impl Drop for Hangup {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.stop.cancel();
        // A recording counts its own cancel when it sees the stop.
        if !self.recording {
            self.recorder.stats.count(QueueEvent::Cancelled);
        }
    }
}

/// Whose turn a request waits for: root's (and every client reading all
/// processes) or one user's.
fn who(authority: Option<Authority>) -> Who {
    match authority {
        Some(Authority::Own(uid)) => Who::User(uid),
        Some(Authority::Open) => Who::User(u32::MAX),
        Some(Authority::All) | None => Who::Root,
    }
}

/// The answer to a request that got no turn, counted.
fn refused(recorder: &Recorder, e: QueueError) -> ApiError {
    let (event, reason) = match e {
        QueueError::AlreadyQueued(_) | QueueError::Full => {
            (QueueEvent::RefusedQueued, Reason::TooManyEntries)
        }
        QueueError::TimedOut => (QueueEvent::RefusedWait, Reason::Timeout),
    };
    recorder.stats.count(event);
    refusals::count(What::Share, reason);
    match e {
        QueueError::AlreadyQueued(_) => ApiError::Conflict(e.to_string()),
        _ => ApiError::Busy(format!("trace recorder: {e}")),
    }
}

pub(super) async fn trace(
    State(state): State<ApiState>,
    authority: Option<Extension<Authority>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref(), &["pid", "seconds"])?;
    let pid = p
        .id("pid")?
        .ok_or_else(|| ApiError::bad("pid", "required"))?;
    let seconds = p.int("seconds", 1, MAX_SECONDS)?.unwrap_or(DEFAULT_SECONDS);
    let Some(recorder) = state.shared.trace.get().cloned() else {
        return Err(ApiError::Unavailable(
            "no trace recorder: the kernel refused the trace programs (see the log)".into(),
        ));
    };
    if state.shared.processes.threads(pid).is_empty() {
        return Err(ApiError::NotFound(format!("no process {pid} runs now")));
    }
    let ticket = recorder
        .queue
        .enter(who(authority.map(|a| a.0)))
        .map_err(|e| refused(&recorder, e))?;
    let mut hangup = Hangup {
        recorder: recorder.clone(),
        stop: ticket.stop.clone(),
        recording: false,
        done: false,
    };
    if recorder.queue.len() > 1 {
        recorder.stats.count(QueueEvent::Waited);
    }
    let turn = match ticket.turn(MAX_WAIT).await {
        Ok(turn) => turn,
        Err(e) => {
            hangup.done = true;
            return Err(refused(&recorder, e));
        }
    };
    hangup.recording = true;
    let shared = state.shared.clone();
    let length = Duration::from_secs(seconds);
    // The turn goes into the recording's thread, handed back when the
    // recording ends (not when a hung-up client's handler is dropped: BPF
    // still points at the process until then).
    let trace = tokio::task::spawn_blocking(move || {
        recorder.record(pid, length, turn.stop(), |tids| names(&shared, pid, tids))
    })
    .await;
    hangup.done = true;
    let trace = trace
        .map_err(|e| ApiError::Failed(format!("trace failed: {e}")))?
        .map_err(|e| match e {
            TraceError::Busy => ApiError::Conflict(e.to_string()),
            e => ApiError::Failed(e.to_string()),
        })?;
    Ok(trace_response(pid, trace))
}

/// The trace as a Perfetto file to save, with headers saying what it
/// holds.
fn trace_response(pid: u32, trace: Trace) -> Response {
    let stamp =
        humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_nanos(trace.start_unix_ns))
            .to_string()
            .replace(['-', ':'], "");
    let disposition = format!("attachment; filename=wallscope-{pid}-{stamp}.perfetto-trace");
    let mut response = (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        trace.bytes,
    )
        .into_response();
    let headers = response.headers_mut();
    let mut put = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    };
    put("content-disposition", disposition);
    put(WINDOW_HEADER, format!("{}-{}", trace.start, trace.end));
    put(START_HEADER, trace.start_unix_ns.to_string());
    put(
        SLICES_HEADER,
        format!(
            "{} in {} threads, {} wakes",
            trace.slices, trace.threads, trace.wakes
        ),
    );
    put(CUT_HEADER, trace.cut.to_string());
    put(LOST_HEADER, trace.lost.to_string());
    put(PREEMPTED_HEADER, trace.preempted.to_string());
    response
}

/// The process's name and its threads': the store's (full JVM and Python
/// names) where it has them, else the kernel's.
fn names(shared: &Shared, pid: u32, tids: &[u32]) -> Names {
    let store = snapshot(shared);
    let window = Window::last(NAMES_SECONDS, SystemTime::now());
    let mut known: HashMap<u32, String> = threads::report(&store, pid, window)
        .map(|r| r.threads.into_iter().map(|t| (t.tid, t.name)).collect())
        .unwrap_or_default();
    known.retain(|tid, _| tids.binary_search(tid).is_ok());
    for &tid in tids {
        if let std::collections::hash_map::Entry::Vacant(v) = known.entry(tid) {
            if let Some(comm) = shared.processes.thread_name(pid, Some(tid)) {
                v.insert(comm);
            }
        }
    }
    Names {
        process: shared.processes.thread_name(pid, None).unwrap_or_default(),
        threads: known,
    }
}
