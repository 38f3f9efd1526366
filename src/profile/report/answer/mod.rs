//! The answers the API gives over a window, each a pure function of a
//! store [`Snapshot`], the asker's parameters and [`HostFacts`], wrapped
//! in one envelope ([`Answer`]) that says what the window holds. The API
//! parses, calls one of these, and renders.

pub mod explain;
pub mod profile;
pub mod runqueue;
pub mod threads;
pub mod timeline;

use std::time::SystemTime;

use super::{host_facts::HostFacts, query};
use crate::profile::model::{
    store::{Recorded, Snapshot},
    window::Window,
};

/// What every windowed answer carries beside its body: the seconds of the
/// window the store holds, their resolution and exact span (the
/// `x-wallscope-recorded-seconds`, `-resolution`, `-covered` and
/// `-prorated` headers), and why it is empty (`x-wallscope-note`).
#[derive(Debug, Clone)]
pub struct Answer<T> {
    pub body: T,
    pub recorded: Recorded,
    pub note: Option<String>,
}

/// A report that also states what its window holds in its own JSON and
/// text (`recorded_seconds`, `resolution`, `covered`), and may give a
/// note for the answer's header.
pub trait Windowed {
    fn recorded_mut(&mut self) -> &mut Recorded;
    /// The note the answer's header gives (none by default: a report
    /// whose JSON carries a note need not send it as a header too).
    fn note(&self) -> Option<String> {
        None
    }
}

impl<T> Answer<T> {
    /// `body` made knowing what `window` of `store` holds: the one place
    /// an answer's envelope is filled.
    pub fn over(
        store: &Snapshot,
        window: Window,
        note: Option<String>,
        body: impl FnOnce(&Recorded) -> T,
    ) -> Self {
        Answer::over_process(store, (window, None), note, body)
    }

    /// [`Self::over`] for an answer about process `pid` (or the host):
    /// its resolution says pools only where that process was folded.
    pub fn over_process(
        store: &Snapshot,
        (window, pid): (Window, Option<u32>),
        note: Option<String>,
        body: impl FnOnce(&Recorded) -> T,
    ) -> Self {
        let recorded = store.recorded_of(window, SystemTime::now(), pid);
        Answer {
            body: body(&recorded),
            recorded,
            note,
        }
    }

    /// The body, and the envelope without it.
    pub fn split(self) -> (T, Answer<()>) {
        let envelope = Answer {
            body: (),
            recorded: self.recorded,
            note: self.note,
        };
        (self.body, envelope)
    }
}

impl<T: Windowed> Answer<T> {
    /// The answer of a report over `window` of `store`, the report told
    /// what the window holds.
    pub fn report(store: &Snapshot, window: Window, body: T) -> Self {
        Answer::report_of(store, (window, None), body)
    }

    /// [`Self::report`] about process `pid` (see [`Self::over_process`]).
    pub fn report_of(store: &Snapshot, asked: (Window, Option<u32>), body: T) -> Self {
        let note = body.note();
        let mut answer = Answer::over_process(store, asked, note, |_| body);
        *answer.body.recorded_mut() = answer.recorded.clone();
        answer
    }
}

/// Why a question has no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A malformed or conflicting parameter (HTTP 400).
    Bad(&'static str, String),
    /// What the host never had within the retention (HTTP 404).
    NotFound(String),
}

/// Why `pid` is unknown, if it is: no such process now, and nothing
/// recorded for it within the retention.
pub fn unknown_pid(store: &Snapshot, host: &dyn HostFacts, pid: u32) -> Option<String> {
    let known = query::pid_recorded(store, pid) || host.exists(pid);
    let minutes = store.retention().as_secs() / 60;
    (!known).then(|| {
        format!("unknown pid {pid}: no such process, and nothing recorded for it in the last {minutes} min")
    })
}

/// Why `filter` found nothing: the note when its process and thread are
/// known (alive, or recorded within the retention) but recorded nothing
/// of the kind in the window, not found when one of them was never seen.
pub fn empty_note(
    store: &Snapshot,
    host: &dyn HostFacts,
    filter: &query::Filter,
) -> Result<String, Refusal> {
    let window = format!("in the {}", filter.window.describe());
    let what = format!("no {} samples", filter.kind.describe());
    let retention = format!("in the last {} min", store.retention().as_secs() / 60);
    if let Some(unknown) = filter.pid.and_then(|pid| unknown_pid(store, host, pid)) {
        return Err(Refusal::NotFound(unknown));
    }
    Ok(match (filter.pid, filter.tid) {
        (_, Some(tid)) if !query::tid_recorded(store, tid) && !host.exists(tid) => {
            return Err(Refusal::NotFound(format!(
                "unknown tid {tid}: no such thread, and nothing recorded for it {retention}"
            )));
        }
        (Some(pid), None) => format!("{what} for pid {pid} {window}"),
        (pid, Some(tid)) => {
            let of_pid = pid.map(|p| format!(" of pid {p}")).unwrap_or_default();
            format!("{what} for tid {tid}{of_pid} {window}")
        }
        (None, None) => format!("{what} {window}"),
    })
}
