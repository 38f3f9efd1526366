//! What `/blocked` reads of the host beside the live view, for its pool
//! summaries and deadlock findings ([`crate::profile::report::stuck`]): each
//! process's live threads by pool, and who holds the mutexes its threads
//! wait for. Bounded per process and per request.

use std::{collections::HashMap, sync::Arc, time::SystemTime};

use crate::{
    process::ProcessTable,
    profile::model::state::State,
    profile::{
        model::{kind, live::LiveThread, store::Snapshot, window::Window},
        report::stuck::WaitFacts,
    },
};

/// Processes whose pools are counted for one `/blocked`, and mutex owners
/// read, at most: each costs a few reads of `/proc`.
const MAX_POOL_PROCESSES: usize = 64;
const MAX_OWNER_READS: usize = 256;
const MAX_OWNER_READS_PER_PROCESS: usize = 32;

/// What `/blocked` reads of the host for `matched`: each process's live
/// threads by pool (named as the store last saw them: full Java names),
/// and who holds the mutex each thread blocked on a futex waits for.
pub(super) fn read(
    store: &Snapshot,
    processes: &ProcessTable,
    matched: &[&LiveThread],
) -> WaitFacts {
    let mut facts = WaitFacts::default();
    let mut pids: Vec<u32> = matched.iter().map(|t| t.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    pids.truncate(MAX_POOL_PROCESSES);
    let now = SystemTime::now();
    let mut names: HashMap<u32, Arc<str>> = HashMap::new();
    for slice in store.within(Window::last(10, now)) {
        for (tid, info) in &slice.threads {
            if pids.binary_search(&info.pid).is_ok() {
                names.insert(*tid, info.name.clone());
            }
        }
    }
    for t in matched {
        names.insert(t.tid, t.name.clone());
    }
    for &pid in &pids {
        for tid in processes.threads(pid) {
            let name = names
                .get(&tid)
                .map(|n| n.to_string())
                .or_else(|| processes.thread_name(pid, Some(tid)))
                .unwrap_or_default();
            *facts
                .pool_sizes
                .entry((pid, kind::pool_name(&name)))
                .or_default() += 1;
        }
    }
    // Per process as well as in all: one process's thousands of waiting
    // threads cannot use up the reads of the others.
    let mut reads: HashMap<u32, usize> = HashMap::new();
    let mut total = 0;
    for t in matched.iter().filter(|t| t.state == State::Futex) {
        let done = reads.entry(t.pid).or_default();
        if *done >= MAX_OWNER_READS_PER_PROCESS {
            continue;
        }
        if total >= MAX_OWNER_READS {
            break;
        }
        *done += 1;
        total += 1;
        if let Some(owner) = crate::process::locks::mutex_owner(t.pid, t.tid) {
            facts.owners.insert(t.tid, owner);
        }
    }
    facts
}
