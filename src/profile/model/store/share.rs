//! Fair shares of the store. When the store is over its bound, the process
//! holding the most pays first, before whole slices are dropped for
//! everyone: its per-thread rows and totals are folded into per-pool ones,
//! oldest slice first (its per-process and per-pool time stays exact, so a
//! process of 10,000 sleeping threads keeps its history at pool
//! resolution); only once all of it is folded are its rows dropped, oldest
//! first. A small process beside it keeps its history whole.
//! (Water-filling: the largest holder is trimmed until it is no longer the
//! largest; one arriving with more rows in one slice than anyone holds
//! loses even its newest rows: the history already held is not the
//! newcomer's to take.)

use rustc_hash::{FxHashMap, FxHashSet};

use super::{merge, Store};
use crate::{
    profile::model::state::is_merged_tid,
    profile::model::Slice,
    untrusted::refusals::{self, Reason, What},
};

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
            let Some((&pid, _)) = self.pid_bytes.iter().max_by_key(|(_, b)| **b) else {
                break;
            };
            // Its oldest rows; the newest slice's too when it has no
            // other (a process arriving with more rows than anyone holds).
            let Some(i) = self.slices.iter().position(|h| h.by_pid.contains_key(&pid)) else {
                break;
            };
            self.count_share(pid, &mut counted);
            let has = |j: usize| self.slices[j].by_pid.contains_key(&pid);
            if let Some(j) =
                (i..self.slices.len()).find(|&j| has(j) && foldable(&self.open(j), pid))
            {
                self.fold_part(j, pid);
            } else if i == 0 && self.slices[0].by_pid.len() == 1 && self.slices.len() > 1 {
                // Nothing of anyone else's: the whole slice goes.
                self.evict_oldest();
            } else {
                self.shed(i, pid);
            }
            // What the rows alone held goes too: counted before the next.
            self.sweep_stacks();
        }
    }

    /// Counts (`share`/`budget`, naming it, once per pass: `counted`) a
    /// process paying for the store's bound when that is its own doing:
    /// it holds more than a quarter of what all processes hold. A store
    /// merely full of like processes, or of one process alone, is
    /// nobody's fault; pid 0 (wakeups sent by interrupts) is no process:
    /// its rows pay like any, but it is not named.
    pub(super) fn count_share(&self, pid: u32, counted: &mut FxHashSet<u32>) {
        let held = self.pid_bytes.get(&pid).copied().unwrap_or(0);
        let total: usize = self.pid_bytes.values().sum();
        if pid != 0 && held > total / 4 && self.pid_bytes.len() > 1 && counted.insert(pid) {
            refusals::count_for(What::Share, Reason::Budget, pid);
        }
    }

    /// Folds `pid`'s part of slice `i` into pools (see [`merge::merge`]):
    /// its rows, thread totals and blocked intervals summed per pool under
    /// `<pool> (folded)`, the wakeups of its threads by others folded with
    /// them. Threads with no pool (no name) keep their own rows.
    pub(super) fn fold_part(&mut self, i: usize, pid: u32) {
        let fold = self.slices[i].folded.with([pid]);
        let slice = merge::merge(&[&self.open(i)], &fold);
        // Sealed anew: the wakers' rows folded with it cost them less too.
        self.replace(i, &slice, fold, None);
        self.folded_parts += 1;
    }

    /// Drops `pid`'s rows, thread totals and thread names from slice `i`
    /// (a copy when a query's snapshot holds it).
    fn shed(&mut self, i: usize, pid: u32) {
        let mut slice = self.open(i);
        let rows = slice.samples.len() + slice.wakeups.len();
        slice.samples.retain(|s| s.pid != pid);
        slice.wakeups.retain(|w| w.charged_to() != pid);
        slice.thread_totals.retain(|t| t.pid != pid);
        slice.sleeps.retain(|s| s.pid != pid);
        slice.threads.retain(|_, t| t.pid != pid);
        self.shed_rows += (rows - slice.samples.len() - slice.wakeups.len()) as u64;
        let folded = self.slices[i].folded.clone();
        self.replace(i, &slice, folded, Some(pid));
    }
}

/// Whether `slice` holds per-thread rows or totals of `pid` that a pool
/// could take: a named thread's, not a pool's already.
fn foldable(slice: &Slice, pid: u32) -> bool {
    let named = |tid: u32| {
        !merge::is_pool_tid(tid)
            && !is_merged_tid(tid)
            && slice.threads.get(&tid).is_some_and(|t| t.pid == pid)
    };
    slice
        .thread_totals
        .iter()
        .any(|t| t.pid == pid && named(t.tid))
        || slice.samples.iter().any(|r| r.pid == pid && named(r.tid))
}

#[cfg(test)]
mod tests {
    use std::{
        collections::HashMap,
        time::{Duration, SystemTime},
    };

    use std::sync::Arc;

    use super::*;
    use crate::profile::model::{counters::ThreadCounters, Sleeps};
    use crate::{
        profile::model::state::{State, STAT_COUNTERS},
        profile::model::{Sample, Slice, ThreadInfo},
    };

    /// A slice ending at `end_s` with `threads` sleeping threads of pid 2
    /// (each its own name) and one thread of pid 1.
    fn slice(end_s: u64, threads: u32) -> Slice {
        let stack: crate::profile::model::Stack = ["main", "sleep"].map(Arc::<str>::from).into();
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
            origins: Default::default(),
            kept_off: Default::default(),
            sleeps: Default::default(),
            stats: [0; STAT_COUNTERS],
            spans: Default::default(),
        }
    }

    /// A store bounded to `slices` times what `make(1)` costs alone, fed
    /// `make(1..=pushes)` and within its bound after every push; with what
    /// one slice costs.
    fn fed(make: impl Fn(u64) -> Slice, slices: usize, pushes: u64) -> (Store, usize) {
        let one = {
            let mut probe = Store::new(Duration::from_secs(600));
            probe.push(make(1));
            probe.bytes()
        };
        let mut store = Store::new(Duration::from_secs(600)).with_max_bytes(one * slices);
        for t in 1..=pushes {
            store.push(make(t));
            assert!(
                store.bytes() <= one * slices,
                "within the bound after push {t}"
            );
        }
        (store, one)
    }

    #[test]
    fn many_threads_of_one_process_do_not_cut_another_processes_history() {
        let before = refusals::get(What::Share, Reason::Budget);
        let (store, one) = fed(|t| slice(t, 1000), 5, 60);
        let stats = store.stats();
        assert_eq!(stats.evicted_slices, 0, "{stats:?}");
        assert!(stats.shed_rows > 50 * 1000, "{stats:?}");
        // Rows of a process, summed (compaction merges slices, not rows).
        let rows = |pid| -> u64 {
            let rows = store.all().flat_map(|s| s.samples);
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
            let stack: crate::profile::model::Stack = (0..50)
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
        let (store, one) = fed(named, 5, 40);
        // Rows of pid 1, summed (compaction merges slices, not rows).
        let small: u64 = store
            .all()
            .flat_map(|s| s.samples)
            .filter(|r| r.pid == 1)
            .map(|r| r.count)
            .sum();
        assert_eq!(small, 40, "pid 1's history whole: {:?}", store.stats());
        assert!(store.stats().name_bytes < one * 5);
    }

    /// A slice ending at `end_s`: pid 1's one thread and `threads`
    /// sleeping threads of pid 2 in one pool (`worker-N`), each with its
    /// exact total (1 s asleep) and woken by a timer interrupt.
    fn pooled(end_s: u64, threads: u32) -> Slice {
        let mut s = slice(end_s, threads);
        let timer: crate::profile::model::Stack = ["hrtimer_wakeup"].map(Arc::<str>::from).into();
        s.wakeups = (s.samples.iter().filter(|r| r.pid == 2))
            .map(|r| crate::profile::model::Wakeup {
                pid: 0,
                tid: crate::profile::model::state::INTERRUPT_TID,
                interrupt: Some(crate::profile::model::Interrupt::Hard),
                peer_pid: 2,
                peer_tid: r.tid,
                stack: timer.clone(),
                ns: 1_000_000_000,
                count: 1,
            })
            .collect();
        for (tid, info) in s.threads.iter_mut() {
            if info.pid == 2 {
                info.name = Arc::from(format!("worker-{tid}"));
            }
        }
        // Four 0.5-1 s naps each.
        let mut naps = [0; crate::profile::model::state::SLEEP_SLOTS];
        naps[20] = 4;
        s.sleeps = (s.samples.iter().filter(|r| r.pid == 2))
            .map(|r| Sleeps {
                pid: 2,
                tid: r.tid,
                slots: naps,
            })
            .collect();
        s.thread_totals = s
            .samples
            .iter()
            .map(|r| {
                let mut ns = [0; State::COUNT];
                ns[State::Sleep as usize] = 1_000_000_000;
                crate::profile::model::counters::RawThread {
                    tid: r.tid,
                    pid: r.pid,
                    comm: "worker".into(),
                    counters: ThreadCounters {
                        ns,
                        switches_voluntary: 4,
                        switches_involuntary: 0,
                        wakeups_sent: 0,
                        wakeups_received: 4,
                    },
                }
            })
            .collect();
        s
    }

    #[test]
    fn the_largest_process_is_folded_into_pools_before_anything_is_shed() {
        use crate::profile::{model::window::Window, report::threads};
        let (store, _) = fed(|t| pooled(t, 2000), 4, 60);
        let stats = store.stats();
        assert!(stats.folded_parts > 0, "{stats:?}");
        assert_eq!(stats.shed_rows, 0, "{stats:?}");
        assert_eq!(stats.evicted_slices, 0, "{stats:?}");
        // Every second of both processes, exact: pid 2's per thread where
        // it was not folded, per pool where it was.
        let asleep = |pid: u32| -> u64 {
            let totals = store.all().flat_map(|s| s.thread_totals);
            totals
                .filter(|t| t.pid == pid)
                .map(|t| t.counters.ns[State::Sleep as usize])
                .sum()
        };
        assert_eq!(asleep(1), 60 * 1_000_000_000);
        assert_eq!(asleep(2), 60 * 2000 * 1_000_000_000);
        // The thread report: the process's wall time whole, one pool.
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(60);
        let report = threads::report(&store.snapshot(), 2, Window::last(600, now));
        let report = report.expect("pid 2 recorded");
        assert_eq!(report.process.wall_us, 60 * 2000 * 1_000_000);
        let pools: Vec<&str> = report.pools.iter().map(|p| p.pool.as_str()).collect();
        assert_eq!(pools, ["worker-*"]);
        assert!(report.threads.iter().any(|t| t.name == "worker-* (folded)"));
        // The newest slice stays per thread; folded ones keep no thread's
        // name, the interrupts' wakeups of its threads folded with it.
        let newest = store.all().last().expect("a slice");
        assert!(newest.thread_totals.iter().filter(|t| t.pid == 2).count() == 2000);
        let oldest = store.all().next().expect("a slice");
        let names = oldest.threads.values().filter(|t| t.pid == 2).count();
        assert!(
            names <= 2,
            "{names} thread names of pid 2 in a folded slice"
        );
        assert!(
            oldest.wakeups.len() <= 2,
            "{} wakeups",
            oldest.wakeups.len()
        );
        let woken: u64 = store.all().flat_map(|s| s.wakeups).map(|w| w.count).sum();
        assert_eq!(woken, 60 * 2000, "every wakeup kept");
    }

    #[test]
    fn folding_a_process_folds_the_wakeups_of_its_threads_and_frees_their_names() {
        let mut store = Store::new(Duration::from_secs(600));
        store.push(pooled(1, 500));
        let before = |store: &Store, pid| store.pid_bytes.get(&pid).copied().unwrap_or(0);
        let (waker, owner) = (before(&store, 0), before(&store, 2));
        store.fold_part(0, 2);
        let slice = &store.open(0);
        // One interrupt row for the pool, every wakeup in it.
        assert_eq!(slice.wakeups.len(), 1, "{:?}", slice.wakeups.len());
        assert_eq!(slice.wakeups[0].count, 500);
        assert!(merge::is_pool_tid(slice.wakeups[0].peer_tid));
        // One row of blocked intervals for the pool, every one in it.
        assert_eq!(slice.sleeps.len(), 1);
        assert_eq!(slice.sleeps[0].slots[20], 500 * 4);
        assert!(merge::is_pool_tid(slice.sleeps[0].tid));
        let names: Vec<&str> = (slice.threads.values())
            .filter(|t| t.pid == 2)
            .map(|t| &*t.name)
            .collect();
        assert_eq!(names, ["worker-* (folded)"]);
        assert!(!foldable(slice, 2));
        // The interrupts' rows are the owner's (no process raised them),
        // and its share falls.
        assert_eq!((waker, before(&store, 0)), (0, 0));
        assert!(
            before(&store, 2) < owner / 2,
            "{} of {owner}",
            before(&store, 2)
        );
        let held: usize = store.slices.iter().map(|h| h.bytes).sum();
        assert_eq!(held, store.slice_bytes);
    }
}
