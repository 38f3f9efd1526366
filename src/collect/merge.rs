//! Folding a later batch into an earlier one, for when the symbolizer is
//! behind: the drain keeps its pace and the data waits, merged, instead of
//! being dropped.

use std::{
    collections::{hash_map::Entry, HashMap},
    hash::{BuildHasher, Hash, Hasher},
};

use super::{RawBatch, RawRecord, RecordKind};
use crate::profile::model::spans::{SpanId, SpanTime};

/// Hash of the fields that make a row distinct (everything but `ns` and
/// `count`): rows with the same key are summed.
fn row_hash(state: &impl BuildHasher, r: &RawRecord) -> u64 {
    let mut h = state.build_hasher();
    (r.pid, r.tid, r.syscall, r.comm.as_str(), r.span).hash(&mut h);
    match r.kind {
        RecordKind::Time(s) => (0u8, s as u32, 0u32).hash(&mut h),
        RecordKind::Wakeup { peer_pid, peer_tid } => (1u8, peer_pid, peer_tid).hash(&mut h),
    }
    (r.user_stack.as_deref(), r.kernel_stack.as_deref()).hash(&mut h);
    h.finish()
}

/// Whether `a` and `b` are the same row (they are summed).
fn same_row(a: &RawRecord, b: &RawRecord) -> bool {
    a.pid == b.pid
        && a.tid == b.tid
        && a.kind == b.kind
        && a.syscall == b.syscall
        && a.comm == b.comm
        && a.user_stack == b.user_stack
        && a.kernel_stack == b.kernel_stack
        && a.span == b.span
}

/// Sums span times of the same thread and span (first and last widened),
/// keeping the first occurrence's place.
pub(super) fn merge_span_times(times: &mut Vec<SpanTime>) {
    let mut index: HashMap<(u32, u32, SpanId), usize> = HashMap::with_capacity(times.len());
    let mut kept: Vec<SpanTime> = Vec::with_capacity(times.len());
    for t in times.drain(..) {
        match index.entry((t.pid, t.tid, t.span)) {
            Entry::Occupied(at) => {
                let known = &mut kept[*at.get()];
                for (sum, n) in known.ns.iter_mut().zip(t.ns) {
                    *sum += n;
                }
                known.first_ns = known.first_ns.min(t.first_ns);
                known.last_ns = known.last_ns.max(t.last_ns);
            }
            Entry::Vacant(slot) => {
                slot.insert(kept.len());
                kept.push(t);
            }
        }
    }
    *times = kept;
}

/// Appends `later` to `rows`, summing rows with the same key, so that rows
/// waiting for the symbolizer stay bounded by the key space (threads x
/// states x stacks) rather than by how many drains they wait.
pub(super) fn merge_rows(rows: &mut Vec<RawRecord>, later: Vec<RawRecord>) {
    let state = std::collections::hash_map::RandomState::new();
    let mut index: HashMap<u64, usize> = HashMap::with_capacity(rows.len() + later.len());
    let mut kept = Vec::with_capacity(rows.len() + later.len());
    for r in rows.drain(..).chain(later) {
        match index.entry(row_hash(&state, &r)) {
            Entry::Occupied(at) if same_row(&kept[*at.get()], &r) => {
                let known: &mut RawRecord = &mut kept[*at.get()];
                known.ns += r.ns;
                known.count += r.count;
            }
            // A hash collision of two different rows: both kept.
            Entry::Occupied(_) => kept.push(r),
            Entry::Vacant(slot) => {
                slot.insert(kept.len());
                kept.push(r);
            }
        }
    }
    *rows = kept;
}

impl RawBatch {
    /// Adds `later` (the next drain) to this batch: one batch covering both
    /// intervals, every row and total kept.
    pub fn absorb(&mut self, later: RawBatch) {
        self.end = later.end;
        self.interval += later.interval;
        merge_rows(&mut self.records, later.records);
        let mut threads: HashMap<u32, usize> = self
            .threads
            .iter()
            .enumerate()
            .map(|(i, t)| (t.tid, i))
            .collect();
        for t in later.threads {
            match threads.entry(t.tid) {
                Entry::Occupied(at) => {
                    let known = &mut self.threads[*at.get()];
                    known.counters += t.counters;
                    known.comm = t.comm;
                }
                Entry::Vacant(slot) => {
                    slot.insert(self.threads.len());
                    self.threads.push(t);
                }
            }
        }
        for (owner, hist) in later.runq_hists {
            match self.runq_hists.iter_mut().find(|(o, _)| *o == owner) {
                Some((_, known)) => {
                    for (sum, n) in known.slots.iter_mut().zip(hist.slots) {
                        *sum += n;
                    }
                    known.ns += hist.ns;
                }
                None => self.runq_hists.push((owner, hist)),
            }
        }
        self.kept_off.extend(later.kept_off);
        self.sleeps.extend(later.sleeps);
        self.span_times.extend(later.span_times);
        merge_span_times(&mut self.span_times);
        // A span's record is taken once per drain it is first seen in.
        let mut known: std::collections::HashSet<(u32, SpanId)> =
            self.span_records.iter().map(|r| (r.pid, r.span)).collect();
        for r in later.span_records {
            if known.insert((r.pid, r.span)) {
                self.span_records.push(r);
            }
        }
        for (sum, n) in self.stats.iter_mut().zip(later.stats) {
            *sum += n;
        }
        // What is off-CPU now is what the later drain saw.
        self.live = later.live;
        self.missing_stacks += later.missing_stacks;
        self.drain_time += later.drain_time;
    }

    /// Last step before dropping a batch that outgrew its bound: rows lose
    /// their stacks and are summed again, which keeps every thread's time
    /// by state (and wakeups) exact, only without where in the code.
    /// Returns how many rows are left.
    pub fn strip_stacks(&mut self) -> usize {
        for r in &mut self.records {
            r.user_stack = None;
            r.kernel_stack = None;
        }
        merge_rows(&mut self.records, Vec::new());
        self.records.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::super::{HistOwner, KeptOff, RawThread};
    use super::*;
    use crate::profile::model::counters::ThreadCounters;
    use crate::profile::model::state::{Hist, STAT_COUNTERS};

    fn batch(tid: u32, ns: u64, end: u64) -> RawBatch {
        let mut stats = [0; STAT_COUNTERS];
        stats[0] = 1;
        RawBatch {
            live: Vec::new(),
            span_times: Vec::new(),
            span_records: Vec::new(),
            end: SystemTime::UNIX_EPOCH + Duration::from_secs(end),
            interval: Duration::from_secs(1),
            records: Vec::new(),
            threads: vec![RawThread {
                tid,
                pid: 1,
                comm: format!("t{end}"),
                counters: ThreadCounters {
                    ns: [ns; 6],
                    switches_voluntary: 1,
                    switches_involuntary: 0,
                    wakeups_sent: 0,
                    wakeups_received: 0,
                },
            }],
            runq_hists: vec![(
                HistOwner::Process(1),
                Hist {
                    slots: [1; 32],
                    ns: 0,
                },
            )],
            sleeps: Vec::new(),
            kept_off: vec![KeptOff {
                pid: 1,
                tid,
                by: 2,
                ns,
            }],
            stats,
            missing_stacks: 0,
            drain_time: Duration::ZERO,
        }
    }

    fn row(tid: u32, stack: u64, ns: u64) -> RawRecord {
        RawRecord {
            pid: 1,
            tid,
            kind: RecordKind::Time(crate::profile::model::state::State::Cpu),
            comm: "w".into(),
            syscall: None,
            user_stack: Some(vec![stack, 1].into()),
            kernel_stack: None,
            ns,
            count: 1,
            span: None,
        }
    }

    #[test]
    fn rows_with_the_same_key_are_summed_and_stripped_rows_keep_totals() {
        let mut first = batch(7, 10, 1);
        first.records = vec![row(7, 1, 10), row(7, 2, 20)];
        for end in 2..50 {
            let mut later = batch(7, 10, end);
            later.records = vec![row(7, 1, 1), row(8, 3, 5)];
            first.absorb(later);
        }
        // Three keys however many drains waited.
        assert_eq!(first.records.len(), 3);
        let ns = |b: &RawBatch| b.records.iter().map(|r| r.ns).sum::<u64>();
        assert_eq!(ns(&first), 30 + 48 * 6);
        let t7: u64 = first
            .records
            .iter()
            .filter(|r| r.tid == 7)
            .map(|r| r.count)
            .sum();
        assert_eq!(t7, 2 + 48);
        assert_eq!(first.strip_stacks(), 2);
        assert_eq!(ns(&first), 30 + 48 * 6);
    }

    #[test]
    fn a_merged_batch_keeps_every_total() {
        let mut first = batch(7, 10, 1);
        first.absorb(batch(7, 5, 2));
        first.absorb(batch(8, 3, 3));
        assert_eq!(first.interval, Duration::from_secs(3));
        assert_eq!(first.end, SystemTime::UNIX_EPOCH + Duration::from_secs(3));
        assert_eq!(first.threads.len(), 2);
        assert_eq!(first.threads[0].counters.ns, [15; 6]);
        assert_eq!(first.threads[0].comm, "t2");
        assert_eq!(first.threads[0].counters.switches_voluntary, 2);
        assert_eq!(first.runq_hists.len(), 1);
        assert_eq!(first.runq_hists[0].1.slots[0], 3);
        // Who kept threads off the CPU: every drain's, kept.
        assert_eq!(first.kept_off.len(), 3);
        assert_eq!(first.stats[0], 3);
    }

    #[test]
    fn spans_keep_rows_apart_and_their_times_are_summed() {
        use crate::profile::model::spans::{SpanId, SpanTime};

        let span = SpanId::from_raw(5);
        let time = |tid, ns, first, last| SpanTime {
            pid: 1,
            tid,
            span: span.unwrap(),
            ns: [ns; 6],
            first_ns: first,
            last_ns: last,
        };
        let mut first = batch(7, 10, 1);
        let mut under = row(7, 1, 10);
        under.span = span;
        first.records = vec![row(7, 1, 10), under.clone()];
        first.span_times = vec![time(7, 10, 100, 200)];
        let mut later = batch(7, 10, 2);
        later.records = vec![under];
        later.span_times = vec![time(7, 5, 200, 300), time(8, 1, 250, 260)];
        first.absorb(later);
        assert_eq!(first.records.len(), 2);
        let spanned: Vec<u64> = (first.records.iter())
            .filter(|r| r.span == span)
            .map(|r| r.ns)
            .collect();
        assert_eq!(spanned, [20]);
        assert_eq!(
            first.span_times,
            vec![time(7, 15, 100, 300), time(8, 1, 250, 260)]
        );
    }
}
