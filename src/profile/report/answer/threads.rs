//! `/threads`: a process's time by thread and pool, each thread with who
//! kept it off the CPU, its sleeps and its share of the GIL.

use super::{unknown_pid, Answer, Refusal, Windowed};
use crate::profile::{
    model::{
        store::{Recorded, Snapshot},
        window::Window,
    },
    report::{
        culprits,
        disclosure::Sight,
        gil,
        host_facts::HostFacts,
        identity, sleeps,
        threads::{self, LiveProcess, ThreadReport},
    },
};

/// Culprits listed per thread (and a `[rest]`).
const THREAD_CULPRITS: usize = 3;

impl Windowed for ThreadReport {
    fn recorded_mut(&mut self) -> &mut Recorded {
        &mut self.recorded
    }
}

/// The threads of `pid` in `window`. A known process that recorded
/// nothing gets its threads as the host lists them now, all zero, with a
/// note; a pid never seen is not found.
pub fn threads(
    store: &Snapshot,
    host: &dyn HostFacts,
    pid: u32,
    window: Window,
    sight: &Sight,
) -> Result<Answer<ThreadReport>, Refusal> {
    // Four passes over the window: over the process's rows only.
    let narrowed = store.narrowed(pid, window);
    let rows = narrowed.as_ref().unwrap_or(store);
    let report = match threads::report(rows, pid, window) {
        Some(mut report) => {
            let mut culprits = culprits::by_thread(rows, window, pid, THREAD_CULPRITS, sight);
            let mut sleeps = sleeps::by_thread(rows, window, pid, sight);
            let gil = gil::share_by_thread(rows, window, pid);
            for t in &mut report.threads {
                t.kept_off_cpu_by = culprits.remove(&t.tid).unwrap_or_default();
                t.sleeps = sleeps.remove(&t.tid);
                t.gil_us = gil
                    .get(&t.tid)
                    .map(|share| (share * t.time.futex_us as f64).round() as u64);
            }
            report
        }
        None => {
            if let Some(unknown) = unknown_pid(rows, host, pid) {
                return Err(Refusal::NotFound(unknown));
            }
            let note = format!(
                "nothing recorded for pid {pid} in the {}: its threads neither ran, waited nor slept in it (it started later, or the daemon did)",
                window.describe()
            );
            threads::empty_report(pid, live_process(host, pid), window, note)
        }
    };
    let mut report = report;
    report.identity = identity::of_process(rows, pid, window, sight);
    Ok(Answer::report_of(store, (window, Some(pid)), report))
}

/// `pid` as the host shows it now.
fn live_process(host: &dyn HostFacts, pid: u32) -> LiveProcess {
    LiveProcess {
        comm: host.comm(pid, None).unwrap_or_default(),
        threads: host
            .tids(pid)
            .into_iter()
            .map(|tid| (tid, host.comm(pid, Some(tid)).unwrap_or_default()))
            .collect(),
    }
}
