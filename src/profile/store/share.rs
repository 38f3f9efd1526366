//! Fair shares of the store. When the store is over its bound, the rows of
//! the process holding the most go first, oldest first, before whole
//! slices are dropped for everyone: a process with 10,000 sleeping threads
//! loses its own old rows, and a small process beside it keeps its
//! history whole. (Water-filling: the largest holder is trimmed until it is
//! no longer the largest; one arriving with more rows in one slice than
//! anyone holds loses even its newest rows: the history already held is
//! not the newcomer's to take.)

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::{size, Store};
use crate::untrusted::refusals::{self, Reason, What};

/// `bytes` fewer for `pid`; forgotten at zero.
pub(super) fn take(by_pid: &mut FxHashMap<u32, usize>, pid: u32, bytes: usize) {
    if let Some(b) = by_pid.get_mut(&pid) {
        *b = b.saturating_sub(bytes);
        if *b == 0 {
            by_pid.remove(&pid);
        }
    }
}

impl Store {
    /// While the store is over `target`, drops the oldest rows of the
    /// process whose rows cost the most. Sweeps the stacks
    /// and names the dropped rows alone held after each step (a sweep is a
    /// pass over the stack table, far cheaper than a drain).
    pub(super) fn shed_largest(&mut self, target: usize) {
        let mut counted = FxHashSet::default();
        while self.bytes() > target {
            let Some((&pid, &held)) = self.pid_bytes.iter().max_by_key(|(_, b)| **b) else {
                break;
            };
            // Its oldest rows; the newest slice's too when it has no
            // other (a process arriving with more rows than anyone holds).
            let Some(i) = self.slices.iter().position(|h| h.by_pid.contains_key(&pid)) else {
                break;
            };
            // Counted (`share`/`budget`) when it holds more than a quarter
            // of what all processes hold: a store merely full of like
            // processes, or of one process alone, is nobody's fault. Pid 0
            // (wakeups sent by interrupts) is no process: its rows are
            // shed like any, but it is not named.
            let total: usize = self.pid_bytes.values().sum();
            if pid != 0 && held > total / 4 && self.pid_bytes.len() > 1 && counted.insert(pid) {
                refusals::count_for(What::Share, Reason::Budget, pid);
            }
            if i == 0 && self.slices[0].by_pid.len() == 1 && self.slices.len() > 1 {
                // Nothing of anyone else's: the whole slice goes.
                self.evict_oldest();
            } else {
                self.shed(i, pid);
            }
            // What the rows alone held goes too: counted before the next.
            self.sweep_stacks();
        }
    }

    /// Drops `pid`'s rows, thread totals and thread names from slice `i`
    /// (a copy when a query's snapshot holds it).
    fn shed(&mut self, i: usize, pid: u32) {
        let held = &mut self.slices[i];
        let slice = Arc::make_mut(&mut held.slice);
        let rows = slice.samples.len() + slice.wakeups.len();
        slice.samples.retain(|s| s.pid != pid);
        slice.samples.shrink_to_fit();
        slice.wakeups.retain(|w| w.pid != pid);
        slice.wakeups.shrink_to_fit();
        slice.thread_totals.retain(|t| t.pid != pid);
        slice.thread_totals.shrink_to_fit();
        for t in slice.threads.values().filter(|t| t.pid == pid) {
            self.names.remove(&t.name);
        }
        slice.threads.retain(|_, t| t.pid != pid);
        slice.threads.shrink_to_fit();
        self.shed_rows += (rows - slice.samples.len() - slice.wakeups.len()) as u64;
        let bytes = size::slice_bytes(slice);
        self.slice_bytes = self.slice_bytes - held.bytes + bytes;
        held.bytes = bytes;
        if let Some(b) = held.by_pid.remove(&pid) {
            take(&mut self.pid_bytes, pid, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::HashMap,
        time::{Duration, SystemTime},
    };

    use super::*;
    use crate::{
        bpf::abi::{Stat, State},
        profile::{Sample, Slice, ThreadInfo},
    };

    /// A slice ending at `end_s` with `threads` sleeping threads of pid 2
    /// (each its own name) and one thread of pid 1.
    fn slice(end_s: u64, threads: u32) -> Slice {
        let stack: crate::profile::Stack = ["main", "sleep"].map(Arc::<str>::from).into();
        let row = |pid, tid| Sample {
            pid,
            tid,
            state: State::Sleep,
            stack: stack.clone(),
            ns: 1_000,
            count: 1,
        };
        let mut samples = vec![row(1, 1)];
        samples.extend((0..threads).map(|t| row(2, 100 + t)));
        let threads: HashMap<u32, ThreadInfo> = samples
            .iter()
            .map(|s| {
                let name = Arc::from(format!("t{}-{end_s}", s.tid));
                (s.tid, ThreadInfo { pid: s.pid, name })
            })
            .collect();
        Slice {
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(end_s - 1),
            end: SystemTime::UNIX_EPOCH + Duration::from_secs(end_s),
            samples,
            wakeups: Vec::new(),
            threads,
            thread_totals: Vec::new(),
            runq_hists: Vec::new(),
            processes: HashMap::new(),
            containers: Default::default(),
            stats: [0; Stat::COUNT],
        }
    }

    #[test]
    fn many_threads_of_one_process_do_not_cut_another_processes_history() {
        let before = refusals::get(What::Share, Reason::Budget);
        let one = {
            let mut probe = Store::new(Duration::from_secs(600));
            probe.push(slice(1, 1000));
            probe.bytes()
        };
        let mut store = Store::new(Duration::from_secs(600)).with_max_bytes(one * 5);
        for t in 1..=60 {
            store.push(slice(t, 1000));
            assert!(store.bytes() <= one * 5, "within the bound after push {t}");
        }
        let stats = store.stats();
        assert_eq!(stats.evicted_slices, 0, "{stats:?}");
        assert!(stats.shed_rows > 50 * 1000, "{stats:?}");
        // Rows of a process, summed (compaction merges slices, not rows).
        let rows = |pid| -> u64 {
            let rows = store.all().flat_map(|s| &s.samples);
            rows.filter(|r| r.pid == pid).map(|r| r.count).sum()
        };
        assert_eq!(rows(1), 60, "pid 1's history whole");
        assert!(store.all().all(|s| s.threads.contains_key(&1)));
        let big = rows(2);
        assert!((1000..=5000).contains(&big), "pid 2 kept its newest: {big}");
        assert!(refusals::get(What::Share, Reason::Budget) > before);
        // The thread names of the rows shed went from the estimate too
        // (kept, 60 slices of 1,000 names would be ten times the bound;
        // merged slices hold their parts' names until shed).
        let names = stats.name_bytes;
        assert!(names < one * 5 * 3 / 5, "{names} of {}", one * 5);
    }

    #[test]
    fn a_process_bringing_long_names_pays_for_them_itself() {
        // Pid 2: one row a slice, but a stack of 50 new 2,000-byte names.
        let named = |end_s: u64| {
            let mut s = slice(end_s, 0);
            let stack: crate::profile::Stack = (0..50)
                .map(|i| Arc::<str>::from(format!("{end_s}-{i:0>2000}")))
                .collect();
            s.samples.push(Sample {
                pid: 2,
                tid: 100,
                stack,
                ..s.samples[0].clone()
            });
            s
        };
        let one = {
            let mut probe = Store::new(Duration::from_secs(600));
            probe.push(named(1));
            probe.bytes()
        };
        let mut store = Store::new(Duration::from_secs(600)).with_max_bytes(one * 5);
        for t in 1..=40 {
            store.push(named(t));
            assert!(store.bytes() <= one * 5, "within the bound after push {t}");
        }
        // Rows of pid 1, summed (compaction merges slices, not rows).
        let small: u64 = store
            .all()
            .flat_map(|s| &s.samples)
            .filter(|r| r.pid == 1)
            .map(|r| r.count)
            .sum();
        assert_eq!(small, 40, "pid 1's history whole: {:?}", store.stats());
        assert!(store.stats().name_bytes < one * 5);
    }
}
