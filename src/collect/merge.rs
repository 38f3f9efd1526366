//! Folding a later batch into an earlier one, for when the symbolizer is
//! behind: the drain keeps its pace and the data waits, merged, instead of
//! being dropped.

use std::collections::{hash_map::Entry, HashMap};

use super::RawBatch;

impl RawBatch {
    /// Adds `later` (the next drain) to this batch: one batch covering both
    /// intervals, every row and total kept.
    pub fn absorb(&mut self, later: RawBatch) {
        self.end = later.end;
        self.interval += later.interval;
        self.records.extend(later.records);
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
                    for (sum, ns) in known.ns.iter_mut().zip(t.ns) {
                        *sum += ns;
                    }
                    known.switches_voluntary += t.switches_voluntary;
                    known.switches_involuntary += t.switches_involuntary;
                    known.wakeups_sent += t.wakeups_sent;
                    known.wakeups_received += t.wakeups_received;
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
        for (sum, n) in self.stats.iter_mut().zip(later.stats) {
            *sum += n;
        }
        // What is off-CPU now is what the later drain saw.
        self.live = later.live;
        self.missing_stacks += later.missing_stacks;
        self.drain_time += later.drain_time;
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::super::{HistOwner, RawThread};
    use super::*;
    use crate::bpf::abi::{Hist, Stat};

    fn batch(tid: u32, ns: u64, end: u64) -> RawBatch {
        let mut stats = [0; Stat::COUNT];
        stats[0] = 1;
        RawBatch {
            live: Vec::new(),
            end: SystemTime::UNIX_EPOCH + Duration::from_secs(end),
            interval: Duration::from_secs(1),
            records: Vec::new(),
            threads: vec![RawThread {
                tid,
                pid: 1,
                comm: format!("t{end}"),
                ns: [ns; 6],
                switches_voluntary: 1,
                switches_involuntary: 0,
                wakeups_sent: 0,
                wakeups_received: 0,
            }],
            runq_hists: vec![(
                HistOwner::Process(1),
                Hist {
                    slots: [1; 32],
                    ns: 0,
                },
            )],
            stats,
            missing_stacks: 0,
            drain_time: Duration::ZERO,
        }
    }

    #[test]
    fn a_merged_batch_keeps_every_total() {
        let mut first = batch(7, 10, 1);
        first.absorb(batch(7, 5, 2));
        first.absorb(batch(8, 3, 3));
        assert_eq!(first.interval, Duration::from_secs(3));
        assert_eq!(first.end, SystemTime::UNIX_EPOCH + Duration::from_secs(3));
        assert_eq!(first.threads.len(), 2);
        assert_eq!(first.threads[0].ns, [15; 6]);
        assert_eq!(first.threads[0].comm, "t2");
        assert_eq!(first.threads[0].switches_voluntary, 2);
        assert_eq!(first.runq_hists.len(), 1);
        assert_eq!(first.runq_hists[0].1.slots[0], 3);
        assert_eq!(first.stats[0], 3);
    }
}
