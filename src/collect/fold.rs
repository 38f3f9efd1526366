//! The step between stripping a drained batch's stacks and dropping it:
//! the process holding the most of the batch is folded into one merged
//! thread. A host with one process of 10,000 threads, behind a symbolizer
//! that fell behind, made batches that stayed past their bound even
//! without stacks; dropping them lost a second of every thread of the
//! host. Folding the largest process first costs only that process its
//! per-thread detail (its time by state stays exact, summed), the way the
//! store folds a process into pools before it sheds anything.

use std::collections::HashMap;

use super::{
    merge::{merge_rows, merge_span_times},
    RawBatch, RawRecord, RecordKind, MERGED_THREADS,
};
use crate::profile::model::state::{is_merged_tid, MERGED_TID};

/// The tid of `pid`'s merged thread (as the BPF programs write it).
fn merged(pid: u32) -> u32 {
    MERGED_TID | pid
}

fn record_bytes(r: &RawRecord) -> usize {
    let stack = |s: &Option<super::RawStack>| s.as_ref().map_or(0, |s| s.len() * 8);
    size_of::<RawRecord>() + r.comm.capacity() + stack(&r.user_stack) + stack(&r.kernel_stack)
}

/// What keeping a batch within its bound cost it (see
/// [`RawBatch::fit_within`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fit {
    /// Its rows lost their stacks.
    pub stripped: bool,
    /// Processes folded into one merged thread each.
    pub folded: u64,
    /// Rows dropped, their totals kept.
    pub rows_dropped: u64,
    /// Dropped whole: even its totals did not fit.
    pub dropped: bool,
}

impl RawBatch {
    /// Keeps the batch within `max` bytes: past it its rows lose their
    /// stacks and are summed again, which keeps every thread's time by
    /// state exact; if still past it, the processes holding the most of it
    /// are folded, largest first ([`RawBatch::fold_largest`]); then its
    /// rows go and its totals stay; only when even those do not fit is it
    /// to be dropped whole.
    pub fn fit_within(&mut self, max: u64) -> Fit {
        let mut fit = Fit::default();
        if self.estimated_bytes() <= max {
            return fit;
        }
        fit.stripped = true;
        self.strip_stacks();
        while self.estimated_bytes() > max && self.fold_largest().is_some() {
            fit.folded += 1;
        }
        if self.estimated_bytes() > max {
            fit.rows_dropped = self.drop_rows();
            fit.dropped = self.estimated_bytes() > max;
        }
        fit
    }

    /// Folds the process holding the most bytes among those with more
    /// than one thread left into its merged thread: rows, totals, sleeps
    /// and culprit rows summed under it, wakeups it received included;
    /// its live threads keep their states without stacks. `None` when no
    /// process has anything left to fold.
    pub fn fold_largest(&mut self) -> Option<u32> {
        let pid = self.largest_foldable()?;
        let to_merged = |p: u32, tid: u32| if p == pid { merged(pid) } else { tid };
        for r in &mut self.records {
            if r.pid == pid {
                r.tid = merged(pid);
                r.comm = MERGED_THREADS.to_string();
            }
            if let RecordKind::Wakeup { peer_pid, peer_tid } = r.kind {
                let peer_tid = to_merged(peer_pid, peer_tid);
                r.kind = RecordKind::Wakeup { peer_pid, peer_tid };
            }
        }
        merge_rows(&mut self.records, Vec::new());
        let mut total: Option<usize> = None;
        let mut threads = Vec::with_capacity(self.threads.len());
        for mut t in self.threads.drain(..) {
            if t.pid != pid {
                threads.push(t);
                continue;
            }
            match total {
                Some(at) => {
                    let sum: &mut super::RawThread = &mut threads[at];
                    sum.counters += t.counters;
                }
                None => {
                    t.tid = merged(pid);
                    t.comm = MERGED_THREADS.to_string();
                    total = Some(threads.len());
                    threads.push(t);
                }
            }
        }
        self.threads = threads;
        let mut sleeps: HashMap<(u32, u32), usize> = HashMap::new();
        let mut kept_sleeps = Vec::with_capacity(self.sleeps.len());
        for mut s in self.sleeps.drain(..) {
            s.tid = to_merged(s.pid, s.tid);
            match sleeps.get(&(s.pid, s.tid)) {
                Some(&at) => {
                    let sum: &mut super::Sleeps = &mut kept_sleeps[at];
                    for (x, y) in sum.slots.iter_mut().zip(s.slots) {
                        *x = x.saturating_add(y);
                    }
                }
                None => {
                    sleeps.insert((s.pid, s.tid), kept_sleeps.len());
                    kept_sleeps.push(s);
                }
            }
        }
        self.sleeps = kept_sleeps;
        let mut kept_off: HashMap<(u32, u32, u32), u64> = HashMap::new();
        for k in self.kept_off.drain(..) {
            *kept_off
                .entry((k.pid, to_merged(k.pid, k.tid), k.by))
                .or_default() += k.ns;
        }
        self.kept_off = (kept_off.into_iter())
            .map(|((pid, tid, by), ns)| super::KeptOff { pid, tid, by, ns })
            .collect();
        for l in self.live.iter_mut().filter(|l| l.pid == pid) {
            l.user_stack = None;
            l.kernel_stack = None;
        }
        for t in self.span_times.iter_mut().filter(|t| t.pid == pid) {
            t.tid = merged(pid);
        }
        merge_span_times(&mut self.span_times);
        Some(pid)
    }

    /// Drops the rows, the threads seen off-CPU and the span data,
    /// keeping every thread's totals, runqueue histograms, culprits and
    /// sleeps; how many rows went.
    pub fn drop_rows(&mut self) -> u64 {
        let rows =
            self.records.len() + self.live.len() + self.span_times.len() + self.span_records.len();
        self.records = Vec::new();
        self.live = Vec::new();
        self.span_times = Vec::new();
        self.span_records = Vec::new();
        rows as u64
    }

    /// The process whose rows take the most bytes, among those with a
    /// thread not yet folded.
    fn largest_foldable(&self) -> Option<u32> {
        let mut bytes: HashMap<u32, usize> = HashMap::new();
        let mut foldable = std::collections::HashSet::new();
        for r in &self.records {
            *bytes.entry(r.pid).or_default() += record_bytes(r);
        }
        for t in &self.threads {
            *bytes.entry(t.pid).or_default() += size_of::<super::RawThread>() + t.comm.capacity();
            if !is_merged_tid(t.tid) {
                foldable.insert(t.pid);
            }
        }
        for s in &self.sleeps {
            *bytes.entry(s.pid).or_default() += size_of::<super::Sleeps>();
        }
        for k in &self.kept_off {
            *bytes.entry(k.pid).or_default() += size_of::<super::KeptOff>();
        }
        for l in &self.live {
            let stack = |s: &Option<super::RawStack>| s.as_ref().map_or(0, |s| s.len() * 8);
            *bytes.entry(l.pid).or_default() += stack(&l.user_stack) + stack(&l.kernel_stack);
        }
        // A process whose threads are all folded still counts as foldable
        // while its rows are not (rows of threads without totals).
        for r in &self.records {
            if !is_merged_tid(r.tid) {
                foldable.insert(r.pid);
            }
        }
        (bytes.into_iter())
            .filter(|(pid, _)| *pid != 0 && foldable.contains(pid))
            .max_by_key(|&(pid, b)| (b, pid))
            .map(|(pid, _)| pid)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::super::{RawThread, Sleeps};
    use super::*;
    use crate::profile::model::counters::ThreadCounters;
    use crate::profile::model::state::{State, STAT_COUNTERS};

    fn thread(pid: u32, tid: u32, ns: u64) -> RawThread {
        RawThread {
            tid,
            pid,
            comm: format!("t{tid}"),
            counters: ThreadCounters {
                ns: [ns; 6],
                switches_voluntary: 1,
                switches_involuntary: 0,
                wakeups_sent: 0,
                wakeups_received: 1,
            },
        }
    }

    fn record(pid: u32, tid: u32, kind: RecordKind, ns: u64) -> RawRecord {
        RawRecord {
            pid,
            tid,
            kind,
            comm: format!("t{tid}"),
            syscall: None,
            user_stack: Some(vec![1, 2, 3].into()),
            kernel_stack: None,
            ns,
            count: 1,
            span: None,
        }
    }

    /// A batch of a small process (pid 7, 2 threads) and a large one
    /// (pid 9, 500 threads), each thread 1 ms of sleep, woken by pid 7.
    fn batch() -> RawBatch {
        let mut b = RawBatch {
            end: SystemTime::UNIX_EPOCH + Duration::from_secs(10),
            interval: Duration::from_secs(1),
            records: Vec::new(),
            threads: Vec::new(),
            runq_hists: Vec::new(),
            kept_off: Vec::new(),
            sleeps: Vec::new(),
            live: Vec::new(),
            span_times: Vec::new(),
            span_records: Vec::new(),
            stats: [0; STAT_COUNTERS],
            missing_stacks: 0,
            drain_time: Duration::ZERO,
        };
        for (pid, tids) in [(7u32, 2u32), (9, 500)] {
            for i in 0..tids {
                let tid = pid * 1000 + i;
                b.threads.push(thread(pid, tid, 1_000_000));
                b.records
                    .push(record(pid, tid, RecordKind::Time(State::Sleep), 1_000_000));
                b.sleeps.push(Sleeps {
                    pid,
                    tid,
                    slots: [1; crate::profile::model::state::SLEEP_SLOTS],
                });
                let peer = RecordKind::Wakeup {
                    peer_pid: pid,
                    peer_tid: tid,
                };
                b.records.push(record(7, 7000, peer, 5));
            }
        }
        b
    }

    fn time_of(b: &RawBatch, pid: u32) -> u64 {
        (b.threads.iter().filter(|t| t.pid == pid))
            .map(|t| t.counters.ns.iter().sum::<u64>())
            .sum()
    }

    #[test]
    fn the_largest_process_is_folded_and_every_total_is_kept() {
        let mut b = batch();
        let before = (time_of(&b, 7), time_of(&b, 9), b.estimated_bytes());
        assert_eq!(b.fold_largest(), Some(9));
        assert!(b.estimated_bytes() < before.2 / 2, "folding saved little");
        // The small process keeps its threads; the large one is one thread.
        assert_eq!(b.threads.iter().filter(|t| t.pid == 7).count(), 2);
        let nine: Vec<_> = b.threads.iter().filter(|t| t.pid == 9).collect();
        assert_eq!(nine.len(), 1);
        assert_eq!(
            (nine[0].tid, nine[0].comm.as_str()),
            (merged(9), MERGED_THREADS)
        );
        assert_eq!((time_of(&b, 7), time_of(&b, 9)), (before.0, before.1));
        // Rows summed under the merged thread, the wakeups it received too.
        let sleep: u64 = (b.records.iter())
            .filter(|r| r.pid == 9 && r.kind == RecordKind::Time(State::Sleep))
            .map(|r| r.ns)
            .sum();
        assert_eq!(sleep, 500 * 1_000_000);
        let woke: Vec<_> = (b.records.iter())
            .filter(|r| matches!(r.kind, RecordKind::Wakeup { peer_pid: 9, .. }))
            .collect();
        assert_eq!(woke.len(), 1);
        assert_eq!((woke[0].count, woke[0].ns), (500, 2500));
        assert_eq!(b.sleeps.iter().filter(|s| s.pid == 9).count(), 1);
        assert_eq!(b.sleeps.iter().find(|s| s.pid == 9).unwrap().slots[0], 500);
    }

    #[test]
    fn folding_ends_when_every_process_is_one_thread() {
        let mut b = batch();
        assert_eq!(b.fold_largest(), Some(9));
        assert_eq!(b.fold_largest(), Some(7));
        assert_eq!(b.fold_largest(), None);
        assert_eq!(b.threads.len(), 2);
        let (seven, nine) = (time_of(&b, 7), time_of(&b, 9));
        assert!(b.drop_rows() > 0);
        assert!(b.records.is_empty());
        assert_eq!((time_of(&b, 7), time_of(&b, 9)), (seven, nine));
    }

    #[test]
    fn a_batch_is_fitted_by_folding_before_anything_is_dropped() {
        let mut b = batch();
        let (seven, nine) = (time_of(&b, 7), time_of(&b, 9));
        assert_eq!(b.fit_within(u64::MAX), Fit::default());
        let fit = b.fit_within(b.estimated_bytes() / 2);
        assert!(fit.stripped && fit.folded >= 1 && !fit.dropped, "{fit:?}");
        assert_eq!((time_of(&b, 7), time_of(&b, 9)), (seven, nine));
        assert!(b.fit_within(0).dropped);
    }
}
