//! What the finders read of one process over the window, gathered in one
//! pass: its threads' exact time by state (and their GIL waits), and its
//! stacked rows summed by thread, state and stack.

use std::collections::HashMap;

use crate::profile::{
    model::{state::State, store::Snapshot, window::Window, Stack},
    report::{
        gil,
        threads::{self, ThreadReport, ThreadRow},
    },
};

/// Time one thread spent in one state with one stack, over the window.
#[derive(Debug, Clone)]
pub struct Row {
    pub tid: u32,
    pub state: State,
    /// Outermost frame first.
    pub stack: Stack,
    /// An estimate where short waits were drawn (see `--offcpu-sample-us`).
    pub ns: u64,
    /// The events (waits drawn, samples) it sums.
    pub count: u64,
}

/// One process over one window.
#[derive(Debug, Clone)]
pub struct Seen {
    pub pid: u32,
    /// Its threads and pools, each thread's `gil_us` filled in.
    pub threads: ThreadReport,
    pub rows: Vec<Row>,
}

impl Seen {
    /// `pid` over `window` of `store`; `None` when nothing was recorded
    /// for it.
    pub fn read(store: &Snapshot, pid: u32, window: Window) -> Option<Seen> {
        let narrowed = store.narrowed(pid, window);
        let store = narrowed.as_ref().unwrap_or(store);
        let mut threads = threads::report(store, pid, window)?;
        let gil = gil::share_by_thread(store, window, pid);
        for t in &mut threads.threads {
            t.gil_us = gil
                .get(&t.tid)
                .map(|share| (share * t.time.futex_us as f64).round() as u64);
        }
        let mut sums: HashMap<(u32, State, Stack), (u64, u64)> = HashMap::new();
        for slice in store.within(window) {
            for s in slice.samples.iter().filter(|s| s.pid == pid) {
                let sum = sums.entry((s.tid, s.state, s.stack.clone())).or_default();
                sum.0 += s.ns;
                sum.1 += s.count;
            }
        }
        let rows = sums
            .into_iter()
            .map(|((tid, state, stack), (ns, count))| Row {
                tid,
                state,
                stack,
                ns,
                count,
            })
            .collect();
        Some(Seen { pid, threads, rows })
    }

    /// Thread `tid`'s row.
    pub fn thread(&self, tid: u32) -> Option<&ThreadRow> {
        self.threads.threads.iter().find(|t| t.tid == tid)
    }

    /// Its name as the report gives it: `tid N` when it has none.
    pub fn thread_name(&self, tid: u32) -> String {
        self.thread(tid)
            .map(|t| t.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("tid {tid}"))
    }
}
