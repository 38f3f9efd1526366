//! Running totals per process since the daemon first saw it, for
//! Prometheus counters (which only grow).

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::super::{counters::ThreadCounters, HistOwner, Slice};
use crate::{process::container::Container, profile::model::state::HIST_SLOTS};

/// A process's totals since the daemon first saw it: they only grow, as
/// Prometheus counters must.
#[derive(Debug, Clone)]
pub struct ProcessTotals {
    pub comm: Arc<str>,
    /// Time by state, switches and wakeups of all its threads.
    pub counters: ThreadCounters,
    /// Runqueue latency histogram (log2 us slots).
    pub runq: [u64; HIST_SLOTS],
    /// End of the last slice that had anything of it.
    pub last_seen: SystemTime,
    /// Its container, as last seen.
    pub container: Option<Arc<Container>>,
}

/// Adds `slice` to the totals and forgets the processes nothing of which
/// is left in the last `retention`.
pub(super) fn add(processes: &mut HashMap<u32, ProcessTotals>, slice: &Slice, retention: Duration) {
    for t in &slice.thread_totals {
        let e = process_entry(processes, slice, t.pid);
        e.counters += &t.counters;
    }
    for (owner, hist) in &slice.runq_hists {
        if let HistOwner::Process(pid) = owner {
            let e = process_entry(processes, slice, *pid);
            for (a, b) in e.runq.iter_mut().zip(hist.slots) {
                *a += b;
            }
        }
    }
    if let Some(horizon) = slice.end.checked_sub(retention) {
        processes.retain(|_, p| p.last_seen >= horizon);
    }
}

fn process_entry<'a>(
    processes: &'a mut HashMap<u32, ProcessTotals>,
    slice: &Slice,
    pid: u32,
) -> &'a mut ProcessTotals {
    // The process's name, else its main thread's.
    let comm = slice.processes.get(&pid).cloned().or_else(|| {
        let main = slice.thread_totals.iter().find(|t| t.tid == pid)?;
        Some(Arc::from(main.comm.as_str()))
    });
    let e = processes.entry(pid).or_insert_with(|| ProcessTotals {
        comm: comm.clone().unwrap_or_else(|| Arc::from("[unknown]")),
        counters: ThreadCounters::default(),
        runq: [0; HIST_SLOTS],
        last_seen: slice.end,
        container: None,
    });
    if let Some(comm) = comm {
        e.comm = comm;
    }
    e.last_seen = slice.end;
    if let Some(c) = slice.containers.get(&pid) {
        e.container = Some(c.clone());
    }
    e
}
