//! `/folded`, `/flamegraph`: the stacks a filter selects, folded within
//! size bounds.

use super::{empty_note, Answer, Refusal};
use crate::profile::{
    model::store::Snapshot,
    report::{
        host_facts::HostFacts,
        query::{self, Filter, Folded},
        truncate::{Limits, Truncation},
    },
};

/// A folded profile within its [`Limits`].
pub struct Profile {
    pub filter: Filter,
    pub folded: Folded,
    pub truncated: Option<Truncation>,
}

/// Folds the samples `filter` selects. Empty, with a note saying why,
/// when the process or thread is known but recorded nothing in the
/// window; not found when it was never seen.
pub fn profile(
    store: &Snapshot,
    host: &dyn HostFacts,
    filter: Filter,
    limits: Limits,
) -> Result<Answer<Profile>, Refusal> {
    // Two passes over the window (names, rows): over the process's only.
    let narrowed = filter
        .pid
        .and_then(|pid| store.narrowed(pid, filter.window));
    let (folded, truncated) =
        query::folded_within(narrowed.as_ref().unwrap_or(store), &filter, limits);
    let note = if folded.stacks.is_empty() {
        Some(empty_note(store, host, &filter)?)
    } else {
        None
    };
    let asked = (filter.window, filter.pid);
    Ok(Answer::over_process(store, asked, note, |_| Profile {
        filter,
        folded,
        truncated,
    }))
}

impl Profile {
    /// What a graph shows, e.g. `stress (pid 42), tid 43` or `all
    /// processes`.
    pub fn subject(&self) -> String {
        let f = &self.filter;
        let name_of = |pid: u32| {
            self.folded
                .processes
                .get(&pid)
                .map(|n| n.to_string())
                .unwrap_or_default()
        };
        let mut s = match f.pid {
            Some(pid) => format!("{} (pid {pid})", name_of(pid)),
            None => "all processes".to_string(),
        };
        if let Some(tid) = f.tid {
            s.push_str(&format!(", tid {tid}"));
        }
        s
    }
}
