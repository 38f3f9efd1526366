//! Merging slices: several consecutive slices into one that spans them
//! (equal rows summed), and folding the per-thread rows of chosen
//! processes into per-pool rows. Pure functions over slices; the store
//! decides when, and which processes ([`FoldedPids`]).
//!
//! What stays exact: per-process state totals are the same at every age
//! (a folded process's thread totals are summed per pool, never dropped);
//! every process not folded keeps its per-thread totals and rows;
//! runqueue histograms are summed per owner; loss counters are summed.
//! What merging loses: when within the merged span a row happened (the
//! merged slice has one start and one end), and, for a folded process,
//! which thread of a pool a row was.

use std::{collections::HashMap, hash::Hash, sync::Arc};

use rustc_hash::{FxHashMap, FxHasher};

use super::super::{
    counters::RawThread,
    kind::{pool_name, FOLDED_SUFFIX},
    HistOwner, KeptOff, Sample, Sleeps, Slice, ThreadInfo, Wakeup,
};
use crate::profile::model::state::{Hist, State};

/// Tids with these bits set stand for a pool of a process's threads, not a
/// thread: Linux tids stay below 2^22 (`pid_max`), and the collector's
/// merged rows ([`crate::profile::model::state::MERGED_TID`] | pid) set only the top bit.
pub const POOL_TID: u32 = 0xC000_0000;

/// Whether `tid` stands for a pool (rows folded by [`merge`]).
pub fn is_pool_tid(tid: u32) -> bool {
    tid & POOL_TID == POOL_TID
}

/// The tid standing for `pool` of process `pid`: a hash of both with
/// [`POOL_TID`] set, the same in every slice so folded slices merge. Two
/// pools of one process with the same hash (a chance of 1 in 2^30) would
/// show as one.
pub(super) fn pool_tid(pid: u32, pool: &str) -> u32 {
    use std::hash::Hasher;
    let mut h = FxHasher::default();
    pid.hash(&mut h);
    pool.hash(&mut h);
    POOL_TID | (h.finish() as u32 & !POOL_TID)
}

/// The tid standing for the pool `tid` was folded into in `slice`; `tid`
/// itself when the slice has no such pool (not folded, or no name).
pub fn pool_of(slice: &Slice, pid: u32, tid: u32) -> u32 {
    let Some(info) = slice.threads.get(&tid).filter(|t| t.pid == pid) else {
        return tid;
    };
    let pool = pool_tid(pid, &pool_name(&info.name));
    match slice.threads.contains_key(&pool) {
        true => pool,
        false => tid,
    }
}

/// The processes whose rows a slice holds folded into pools: none for
/// most slices, the largest one or few when the store needed room. Sorted;
/// cheap to clone (a snapshot copies it per slice).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FoldedPids(Option<Arc<[u32]>>);

impl FoldedPids {
    /// `pids` folded.
    pub fn of(pids: impl IntoIterator<Item = u32>) -> FoldedPids {
        let mut v: Vec<u32> = pids.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        FoldedPids((!v.is_empty()).then(|| v.into()))
    }

    /// Whether any process is folded.
    pub fn any(&self) -> bool {
        self.0.is_some()
    }

    /// Whether `pid`'s rows are folded.
    pub fn contains(&self, pid: u32) -> bool {
        self.0
            .as_deref()
            .is_some_and(|v| v.binary_search(&pid).is_ok())
    }

    /// The processes folded, in order.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().flat_map(|v| v.iter().copied())
    }

    /// These and `more`.
    pub fn with(&self, more: impl IntoIterator<Item = u32>) -> FoldedPids {
        FoldedPids::of(self.pids().chain(more))
    }

    /// Only `pid`, if folded here (a snapshot narrowed to it).
    pub fn only(&self, pid: u32) -> FoldedPids {
        FoldedPids::of(self.contains(pid).then_some(pid))
    }
}

/// Maps tids to their pool's tid (with the pool's name) when folding.
struct Folder<'a> {
    threads: &'a HashMap<u32, ThreadInfo>,
    pools: FxHashMap<u32, u32>,
    names: HashMap<u32, ThreadInfo>,
}

impl Folder<'_> {
    /// `tid`'s pool tid; `tid` itself when it is a pool already, a
    /// merged row, an interrupt, or has no name in the slice (nothing to
    /// pool it by).
    fn tid(&mut self, pid: u32, tid: u32) -> u32 {
        if crate::profile::model::state::is_merged_tid(tid) {
            return tid;
        }
        if let Some(&p) = self.pools.get(&tid) {
            return p;
        }
        let Some(info) = self.threads.get(&tid).filter(|t| t.pid == pid) else {
            return tid;
        };
        let pool = pool_name(&info.name);
        let p = pool_tid(pid, &pool);
        self.pools.insert(tid, p);
        self.names.entry(p).or_insert_with(|| ThreadInfo {
            pid,
            name: Arc::from(format!("{pool}{FOLDED_SUFFIX}")),
        });
        p
    }
}

/// The comm a pool's thread total carries: its `<pool> (folded)` name.
fn folder_name(names: &HashMap<u32, ThreadInfo>, pool: u32, comm: &str) -> String {
    names
        .get(&pool)
        .map_or_else(|| comm.to_string(), |p| p.name.to_string())
}

/// Sums rows with equal keys, keeping the first row of each key.
struct Summed<K, R> {
    index: FxHashMap<K, usize>,
    rows: Vec<R>,
}

impl<K: Hash + Eq, R> Summed<K, R> {
    fn new() -> Self {
        Summed {
            index: FxHashMap::default(),
            rows: Vec::new(),
        }
    }

    fn add(&mut self, key: K, row: R, sum: impl FnOnce(&mut R, &R)) {
        match self.index.get(&key) {
            Some(&i) => sum(&mut self.rows[i], &row),
            None => {
                self.index.insert(key, self.rows.len());
                self.rows.push(row);
            }
        }
    }

    fn done(mut self) -> Vec<R> {
        self.rows.shrink_to_fit();
        self.rows
    }
}

fn stack_key(stack: &super::super::Stack) -> usize {
    // The store interns stacks: equal stacks are one allocation.
    stack.as_ptr() as *const u8 as usize
}

/// One slice spanning `parts` (consecutive, oldest first, at least one):
/// equal rows summed (samples by pid, tid, state and stack; wakeups by
/// their whole key; thread totals per thread; runqueue histograms per
/// owner), names and containers united (the newest wins), loss counters
/// summed. The rows of named threads of the processes in `fold` (samples,
/// wakeups on either side, thread totals, blocked intervals, culprit
/// times) are merged into one row per pool of their process (see
/// [`pool_name`]), under a thread named `<pool> (folded)`, and those
/// threads' own names dropped; a single part with `fold` is that slice
/// with those processes folded.
pub fn merge(parts: &[&Slice], fold: &FoldedPids) -> Slice {
    let first = parts.first().expect("at least one slice to merge");
    let last = parts.last().expect("at least one slice to merge");
    let mut out = Slice::empty(first.start, last.end);
    let mut samples: Summed<(u32, u32, State, usize), Sample> = Summed::new();
    let mut wakeups: Summed<(u32, u32, u8, u32, u32, usize), Wakeup> = Summed::new();
    let mut totals: Summed<(u32, u32), RawThread> = Summed::new();
    let mut hists: Summed<HistOwner, (HistOwner, Hist)> = Summed::new();
    let mut pool_names = HashMap::new();
    let mut kept_off: HashMap<(u32, u32, u32), u64> = HashMap::new();
    let mut sleeps: Summed<(u32, u32), Sleeps> = Summed::new();
    for part in parts {
        let mut folder = Folder {
            threads: &part.threads,
            pools: FxHashMap::default(),
            names: HashMap::new(),
        };
        let tid = |folder: &mut Folder, pid, tid| match fold.contains(pid) {
            true => folder.tid(pid, tid),
            false => tid,
        };
        for s in &part.samples {
            let t = tid(&mut folder, s.pid, s.tid);
            let key = (s.pid, t, s.state, stack_key(&s.stack));
            let row = Sample {
                tid: t,
                ..s.clone()
            };
            samples.add(key, row, |a, b| {
                a.ns += b.ns;
                a.count += b.count;
            });
        }
        for w in &part.wakeups {
            let t = tid(&mut folder, w.pid, w.tid);
            let peer = tid(&mut folder, w.peer_pid, w.peer_tid);
            let irq = w.interrupt.map_or(0, |i| i as u8 + 1);
            let key = (w.pid, t, irq, w.peer_pid, peer, stack_key(&w.stack));
            let row = Wakeup {
                tid: t,
                peer_tid: peer,
                ..w.clone()
            };
            wakeups.add(key, row, |a, b| {
                a.ns += b.ns;
                a.count += b.count;
            });
        }
        for t in &part.thread_totals {
            let pooled = tid(&mut folder, t.pid, t.tid);
            let row = match pooled == t.tid {
                true => t.clone(),
                false => RawThread {
                    tid: pooled,
                    comm: folder_name(&folder.names, pooled, &t.comm),
                    ..t.clone()
                },
            };
            totals.add((t.pid, pooled), row, |a, b| {
                a.counters += &b.counters;
                a.comm.clone_from(&b.comm);
            });
        }
        for k in &part.kept_off {
            let t = tid(&mut folder, k.pid, k.tid);
            *kept_off.entry((k.pid, t, k.by)).or_default() += k.ns;
        }
        for s in &part.sleeps {
            let row = Sleeps {
                tid: tid(&mut folder, s.pid, s.tid),
                ..*s
            };
            sleeps.add((s.pid, row.tid), row, |a, b| {
                for (x, y) in a.slots.iter_mut().zip(b.slots) {
                    *x = x.saturating_add(y);
                }
            });
        }
        pool_names.extend(folder.names);
        for h in &part.runq_hists {
            hists.add(h.0, *h, |a, b| {
                for (x, y) in a.1.slots.iter_mut().zip(b.1.slots) {
                    *x += y;
                }
                a.1.ns += b.1.ns;
            });
        }
        // A folded process's threads are its pools now (those with no
        // name, and merged rows, keep their tid and have none to drop).
        let named = part.threads.iter().filter(|(tid, t)| {
            !fold.contains(t.pid)
                || is_pool_tid(**tid)
                || crate::profile::model::state::is_merged_tid(**tid)
        });
        out.threads.extend(named.map(|(k, v)| (*k, v.clone())));
        out.processes
            .extend(part.processes.iter().map(|(k, v)| (*k, v.clone())));
        out.containers
            .extend(part.containers.iter().map(|(k, v)| (*k, v.clone())));
        out.origins
            .extend(part.origins.iter().map(|(k, v)| (*k, v.clone())));
        for (a, b) in out.stats.iter_mut().zip(part.stats) {
            *a += b;
        }
    }
    out.threads.extend(pool_names);
    out.samples = samples.done();
    out.wakeups = wakeups.done();
    out.thread_totals = totals.done();
    out.runq_hists = hists.done();
    out.sleeps = sleeps.done();
    out.kept_off = kept_off
        .into_iter()
        .map(|((pid, tid, by), ns)| KeptOff { pid, tid, by, ns })
        .collect();
    out.threads.shrink_to_fit();
    out.processes.shrink_to_fit();
    out.containers.shrink_to_fit();
    out.origins.shrink_to_fit();
    out
}
