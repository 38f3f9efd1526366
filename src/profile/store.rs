//! The in-memory store: the last `retention` of slices, bounded.

use std::{
    collections::VecDeque,
    time::{Duration, SystemTime},
};

use std::{collections::HashMap, sync::Arc};

use super::{Slice, Stack};
use crate::{
    bpf::abi::{Stat, HIST_SLOTS},
    collect::{HistOwner, StatDeltas},
};

/// A process's totals since the daemon first saw it: they only grow, as
/// Prometheus counters must.
#[derive(Debug, Clone)]
pub struct ProcessTotals {
    pub comm: Arc<str>,
    /// Nanoseconds by state.
    pub ns: [u64; 5],
    pub switches_voluntary: u64,
    pub switches_involuntary: u64,
    pub wakeups_received: u64,
    /// Runqueue latency histogram (log2 us slots).
    pub runq: [u64; HIST_SLOTS],
    /// End of the last slice that had anything of it.
    pub last_seen: SystemTime,
}

/// Pushes between two sweeps of the stack table.
const COMPACT_EVERY: u64 = 60;

/// Slices of recent history, oldest first. Memory is bounded by the
/// retention (one slice per drain) and by the BPF map sizes (rows per slice).
pub struct Store {
    slices: VecDeque<Slice>,
    retention: Duration,
    /// Every distinct stack once; slices share them.
    stacks: rustc_hash::FxHashSet<Stack>,
    pushes: u64,
    totals: StatDeltas,
    processes: HashMap<u32, ProcessTotals>,
}

impl Store {
    /// An empty store that keeps `retention` of history.
    pub fn new(retention: Duration) -> Self {
        Store {
            slices: VecDeque::new(),
            retention,
            stacks: rustc_hash::FxHashSet::default(),
            pushes: 0,
            totals: [0; Stat::COUNT],
            processes: HashMap::new(),
        }
    }

    /// How much history is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Adds a slice and drops what fell out of the retention window.
    pub fn push(&mut self, mut slice: Slice) {
        for sample in &mut slice.samples {
            match self.stacks.get(&sample.stack) {
                Some(shared) => sample.stack = shared.clone(),
                None => {
                    self.stacks.insert(sample.stack.clone());
                }
            }
        }
        for (total, delta) in self.totals.iter_mut().zip(slice.stats) {
            *total += delta;
        }
        self.add_process_totals(&slice);
        let horizon = slice.end.checked_sub(self.retention);
        self.slices.push_back(slice);
        while let (Some(oldest), Some(horizon)) = (self.slices.front(), horizon) {
            if oldest.end >= horizon {
                break;
            }
            self.slices.pop_front();
        }
        self.pushes += 1;
        if self.pushes.is_multiple_of(COMPACT_EVERY) {
            // A stack only the table still holds belongs to no slice.
            self.stacks.retain(|s| std::sync::Arc::strong_count(s) > 1);
        }
    }

    /// Running totals per process; a process is forgotten once nothing of
    /// it is left in the retention window (its series then go stale).
    pub fn process_totals(&self) -> &HashMap<u32, ProcessTotals> {
        &self.processes
    }

    fn add_process_totals(&mut self, slice: &Slice) {
        for t in &slice.thread_totals {
            let e = process_entry(&mut self.processes, slice, t.pid);
            for (a, b) in e.ns.iter_mut().zip(t.ns) {
                *a += b;
            }
            e.switches_voluntary += t.switches_voluntary;
            e.switches_involuntary += t.switches_involuntary;
            e.wakeups_received += t.wakeups_received;
        }
        for (owner, hist) in &slice.runq_hists {
            if let HistOwner::Process(pid) = owner {
                let e = process_entry(&mut self.processes, slice, *pid);
                for (a, b) in e.runq.iter_mut().zip(hist.slots) {
                    *a += b;
                }
            }
        }
        if let Some(horizon) = slice.end.checked_sub(self.retention) {
            self.processes.retain(|_, p| p.last_seen >= horizon);
        }
    }

    /// Slices that ended within the last `seconds` before `now`.
    pub fn window(&self, seconds: u64, now: SystemTime) -> impl Iterator<Item = &Slice> {
        let from = now
            .checked_sub(Duration::from_secs(seconds))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        self.slices.iter().filter(move |s| s.end > from)
    }

    /// Every slice kept.
    pub fn all(&self) -> impl Iterator<Item = &Slice> {
        self.slices.iter()
    }

    /// BPF loss counters summed since start.
    pub fn totals(&self) -> &StatDeltas {
        &self.totals
    }

    /// Number of distinct stacks held.
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
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
        ns: [0; 5],
        switches_voluntary: 0,
        switches_involuntary: 0,
        wakeups_received: 0,
        runq: [0; HIST_SLOTS],
        last_seen: slice.end,
    });
    if let Some(comm) = comm {
        e.comm = comm;
    }
    e.last_seen = slice.end;
    e
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::Arc};

    use super::*;
    use crate::{bpf::abi::State, profile::Sample};

    fn slice(end_s: u64, frames: &[&str]) -> Slice {
        let stack: Stack = frames.iter().map(|f| Arc::<str>::from(*f)).collect();
        Slice {
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(end_s - 1),
            end: SystemTime::UNIX_EPOCH + Duration::from_secs(end_s),
            samples: vec![Sample {
                pid: 1,
                tid: 1,
                state: State::Cpu,
                stack,
                ns: 10,
                count: 1,
            }],
            wakeups: Vec::new(),
            threads: HashMap::new(),
            thread_totals: Vec::new(),
            runq_hists: Vec::new(),
            processes: HashMap::new(),
            stats: [1; Stat::COUNT],
        }
    }

    #[test]
    fn retention_drops_old_slices_and_windows_select_recent_ones() {
        let mut store = Store::new(Duration::from_secs(10));
        for t in 1..=30 {
            store.push(slice(t, &["main", "work"]));
        }
        assert_eq!(store.all().count(), 11, "slices ending in [20, 30]");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(30);
        assert_eq!(store.window(3, now).count(), 3);
        assert_eq!(store.window(1000, now).count(), 11);
        assert_eq!(store.totals()[0], 30);
    }

    #[test]
    fn process_totals_only_grow_while_slices_expire() {
        let mut store = Store::new(Duration::from_secs(5));
        let mut last = 0;
        for t in 1..=20 {
            let mut s = slice(t, &["main"]);
            s.thread_totals.push(crate::collect::RawThread {
                tid: 1,
                pid: 1,
                comm: "app".into(),
                ns: [1_000, 0, 0, 0, 0],
                switches_voluntary: 1,
                switches_involuntary: 0,
                wakeups_sent: 0,
                wakeups_received: 2,
            });
            store.push(s);
            let p = &store.process_totals()[&1];
            assert!(p.ns[0] > last, "counter grows");
            last = p.ns[0];
        }
        let p = &store.process_totals()[&1];
        assert_eq!((p.ns[0], p.wakeups_received, &*p.comm), (20_000, 40, "app"));
        store.push(slice(100, &["main"]));
        assert!(
            store.process_totals().get(&1).is_none(),
            "no totals for longer than the retention: forgotten"
        );
    }

    #[test]
    fn equal_stacks_are_shared_and_unused_ones_swept() {
        let mut store = Store::new(Duration::from_secs(5));
        store.push(slice(1, &["main", "old"]));
        for t in 2..=(COMPACT_EVERY + 1) {
            store.push(slice(t, &["main", "new"]));
        }
        let stacks: Vec<_> = store.all().map(|s| s.samples[0].stack.clone()).collect();
        assert!(stacks.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
        assert_eq!(
            store.stack_count(),
            1,
            "the stack of the evicted slice is gone"
        );
    }
}
