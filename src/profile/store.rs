//! The in-memory store: the last `retention` of slices, bounded.

use std::{
    collections::{HashSet, VecDeque},
    time::{Duration, SystemTime},
};

use super::{Slice, Stack};
use crate::{bpf::abi::Stat, collect::StatDeltas};

/// Pushes between two sweeps of the stack table.
const COMPACT_EVERY: u64 = 60;

/// Slices of recent history, oldest first. Memory is bounded by the
/// retention (one slice per drain) and by the BPF map sizes (rows per slice).
pub struct Store {
    slices: VecDeque<Slice>,
    retention: Duration,
    /// Every distinct stack once; slices share them.
    stacks: HashSet<Stack>,
    pushes: u64,
    totals: StatDeltas,
}

impl Store {
    /// An empty store that keeps `retention` of history.
    pub fn new(retention: Duration) -> Self {
        Store {
            slices: VecDeque::new(),
            retention,
            stacks: HashSet::new(),
            pushes: 0,
            totals: [0; Stat::COUNT],
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
