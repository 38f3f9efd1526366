//! `/explain` of the host: the processes that lost the most time waiting
//! (for a CPU, the GIL, a lock, I/O; not at rest) in the window, each
//! with its top finding. One pass over the window ranks every process;
//! only the first `limit` are explained.

use std::collections::HashMap;

use serde::Serialize;

use super::{seen::Seen, waits, window_query, Explanation, Finding};
use crate::profile::model::{
    state::State,
    store::{Recorded, Snapshot},
    window::Window,
};

/// One process of the host's answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Suffering {
    pub pid: u32,
    pub process: String,
    pub wall_us: u64,
    /// Time its threads lost waiting, not at rest.
    pub waiting_us: u64,
    /// Its first finding, if any.
    pub top: Option<Finding>,
    /// How many findings it has in all...
    pub findings: usize,
    /// ...which this call lists.
    pub details: String,
}

/// The `/explain` answer without `pid`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HostExplanation {
    pub seconds: u64,
    pub window: String,
    #[serde(flatten)]
    pub recorded: Recorded,
    /// Processes that lost any time waiting in the window.
    pub waiting_processes: usize,
    pub limit: usize,
    /// Most time lost first, at most `limit`.
    pub processes: Vec<Suffering>,
}

/// Time each process lost waiting in `window` (runqueue and throttled
/// time exact, blocked waits as their stacks' estimates), by pid.
pub fn waiting_by_pid(store: &Snapshot, window: Window) -> HashMap<u32, u64> {
    let mut ns: HashMap<u32, u64> = HashMap::new();
    // One stack is classified once, however many rows share it.
    let mut suffers: HashMap<(usize, State), bool> = HashMap::new();
    for slice in store.within(window) {
        for t in &slice.thread_totals {
            let c = &t.counters;
            let waited = c.ns_in(State::Runqueue) + c.ns_in(State::Throttled);
            if waited > 0 {
                *ns.entry(t.pid).or_default() += waited;
            }
        }
        for s in &slice.samples {
            if !matches!(s.state, State::Futex | State::Io | State::Sleep) {
                continue;
            }
            let key = (s.stack.as_ptr() as *const u8 as usize, s.state);
            let lost = *suffers
                .entry(key)
                .or_insert_with(|| waits::suffers(waits::classify(s.state, &s.stack)));
            if lost {
                *ns.entry(s.pid).or_default() += s.ns;
            }
        }
    }
    ns.retain(|_, v| *v > 0);
    ns
}

/// The `limit` pids of `ranked` (pid, waiting ns) that lost the most.
pub fn first(ranked: &HashMap<u32, u64>, limit: usize) -> Vec<u32> {
    let mut ranked: Vec<(u32, u64)> = ranked.iter().map(|(p, ns)| (*p, *ns)).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.into_iter().take(limit).map(|(pid, _)| pid).collect()
}

/// The processes of `ranked` (pid, waiting ns; any order) explained, most
/// time lost first, at most `limit`, each by `explain_one`.
pub fn explain_host(
    store: &Snapshot,
    window: Window,
    ranked: HashMap<u32, u64>,
    limit: usize,
    explain_one: impl Fn(&Seen) -> Explanation,
) -> HostExplanation {
    let waiting_processes = ranked.len();
    let mut processes: Vec<Suffering> = first(&ranked, limit)
        .into_iter()
        .filter_map(|pid| {
            let seen = Seen::read(store, pid, window)?;
            let e = explain_one(&seen);
            Some(Suffering {
                pid,
                process: e.process,
                wall_us: e.wall_us,
                waiting_us: e.waiting_us,
                findings: e.findings.len(),
                details: format!("/explain?pid={pid}&{}", window_query(&window)),
                top: e.findings.into_iter().next(),
            })
        })
        .collect();
    processes.sort_by(|a, b| b.waiting_us.cmp(&a.waiting_us).then(a.pid.cmp(&b.pid)));
    HostExplanation {
        seconds: window.seconds(),
        window: window.describe(),
        recorded: Recorded::default(),
        waiting_processes,
        limit,
        processes,
    }
}
