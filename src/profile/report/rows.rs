//! The rows a profile query selects, before they are rendered: one per
//! (process, thread, state, stack), with the wall-graph scaling and the
//! `[unattributed]` rest already applied, so that folded text and pprof
//! built from them add up to the same total.

use std::{collections::HashMap, sync::Arc};

use rustc_hash::FxHashMap;

use super::filter::Filter;
use crate::{
    process::container::Container,
    profile::model::state::{is_merged_tid, State},
    profile::model::{
        kind::{thread_frame, Group, Kind, MERGED_THREADS},
        store::{merge, Snapshot},
        Frame, Interrupt, Slice, Stack,
    },
};

/// The frame that closes a wall row no stack explains.
pub const UNATTRIBUTED: &str = "[unattributed]";

/// Time of one thread (or, merged, one process) with one stack.
#[derive(Debug, Clone)]
pub struct Row {
    /// 0 for wakeups raised in interrupt context.
    pub pid: u32,
    /// The process's name in the slices the row's time comes from: a pid
    /// reused within the window keeps each process's time under its own
    /// name. `None` when no slice recorded one.
    pub process: Option<Arc<str>>,
    /// 0 when rows were merged per process.
    pub tid: u32,
    /// The state the time was spent in; `None` for wakeups.
    pub state: Option<State>,
    /// Set for wakeups raised in interrupt context: the interrupt, not a
    /// process, is the waker.
    pub interrupt: Option<Interrupt>,
    /// Outermost first.
    pub stack: Stack,
    /// A frame below the stack: `[wakes NAME [tid N]]` or `[unattributed]`.
    pub leaf: Option<Frame>,
    pub ns: u64,
    /// Samples (on CPU), intervals (off CPU) or wakeups; 0 for the
    /// `[unattributed]` rest.
    pub count: u64,
}

impl Row {
    /// Whether the row stands for a process the asking user may not see
    /// ([`OTHER_PROCESS`], see [`Filter::others_hidden`]).
    pub fn is_other_process(&self) -> bool {
        self.pid == 0 && self.interrupt.is_none() && self.process.as_deref() == Some(OTHER_PROCESS)
    }
}

/// The latest names of processes and threads in a window: a thread that
/// renames itself (pools do, right after start) is one thread, not two.
#[derive(Default)]
pub struct Names {
    processes: HashMap<u32, Arc<str>>,
    threads: HashMap<u32, Arc<str>>,
    containers: HashMap<u32, Arc<Container>>,
}

impl Names {
    /// The names in `slices`, the newest winning.
    pub fn of(slices: impl Iterator<Item = impl std::ops::Deref<Target = Slice>>) -> Names {
        let mut names = Names::default();
        for slice in slices {
            names.add(&slice);
        }
        names
    }

    /// The names of `slice`, newer than those held.
    fn add(&mut self, slice: &Slice) {
        let processes = slice.processes.iter().map(|(k, v)| (*k, v.clone()));
        self.processes.extend(processes);
        let threads = slice.threads.iter().map(|(k, v)| (*k, v.name.clone()));
        self.threads.extend(threads);
        let containers = slice.containers.iter().map(|(k, v)| (*k, v.clone()));
        self.containers.extend(containers);
    }

    /// A process's name, `[unknown]` if none was recorded.
    pub fn process(&self, pid: u32) -> &str {
        self.processes.get(&pid).map_or("[unknown]", |n| n)
    }

    /// The name of `row`'s process: the one it had in the row's slices,
    /// else the latest.
    pub fn process_of<'a>(&'a self, row: &'a Row) -> &'a str {
        row.process
            .as_deref()
            .unwrap_or_else(|| self.process(row.pid))
    }

    /// A thread's name, `[unknown]` if none was recorded.
    pub fn thread(&self, tid: u32) -> &str {
        self.threads.get(&tid).map_or("[unknown]", |n| n)
    }

    /// The container `pid` ran in, if any.
    pub fn container(&self, pid: u32) -> Option<&Arc<Container>> {
        self.containers.get(&pid)
    }

    /// Whether a name was recorded for `pid`.
    pub fn has_process(&self, pid: u32) -> bool {
        self.processes.contains_key(&pid)
    }
}

/// Samples that merge into one row: pid, tid (0 when merged), state,
/// the stack's address (the store interns stacks, so the address stands
/// for its frames and the window's many rows fold at the cost of a hash of
/// a few integers each) and the process name's (see [`ProcessNames`]).
type RowKey = (u32, u32, State, usize, usize);

/// A process name a row carries (see [`Row::process`]).
type Name = Option<Arc<str>>;

/// A thread's exact time in one state: pid, nanoseconds, process name.
type Total = (u32, u64, Name);

/// Process names of one query, one `Arc` per distinct name, so that a
/// name's address identifies it across slices (0: no name).
#[derive(Default)]
struct ProcessNames {
    names: FxHashMap<Arc<str>, ()>,
    /// The current slice's pid -> name.
    slice: FxHashMap<u32, Arc<str>>,
}

impl ProcessNames {
    /// Takes the names of `slice` as the current ones.
    fn enter(&mut self, slice: &Slice) {
        self.slice.clear();
        for (pid, name) in &slice.processes {
            let name = match self.names.get_key_value(name) {
                Some((n, ())) => n.clone(),
                None => {
                    self.names.insert(name.clone(), ());
                    name.clone()
                }
            };
            self.slice.insert(*pid, name);
        }
    }

    /// `pid`'s name in the current slice and its identifying address.
    fn of(&self, pid: u32) -> (usize, Option<&Arc<str>>) {
        let name = self.slice.get(&pid);
        (
            name.map_or(0, |n| Arc::as_ptr(n) as *const u8 as usize),
            name,
        )
    }
}

/// The rows `filter` selects, with the names of the window. Rows keep
/// their thread when `per_thread` or when the filter groups by thread or
/// pool; wall rows always do until they are scaled to their thread's
/// exact totals.
pub fn select(store: &Snapshot, filter: &Filter, per_thread: bool) -> (Vec<Row>, Names) {
    // Names as rows, in one pass: a window over the disk history decodes
    // each block once (an hour is 3,600 of them).
    let mut names = Names::default();
    let keep_tid = per_thread || filter.group != Group::Process;
    let wall = filter.kind == Kind::Wall;
    let mut out = Vec::new();
    // Per (tid, state): exact totals (pid alongside) and what stack rows
    // explain (wall only).
    // Keyed by the process name too: a reused pid's threads are not
    // scaled by another process's totals.
    let mut explained: HashMap<(u32, State, usize), u64> = HashMap::new();
    let mut totals: HashMap<(u32, State, usize), Total> = HashMap::new();
    let mut rows: FxHashMap<RowKey, (Stack, u64, u64, Name)> = FxHashMap::default();
    let mut process_names = ProcessNames::default();
    for slice in store.within(filter.window) {
        names.add(&slice);
        process_names.enter(&slice);
        for s in &slice.samples {
            if !filter.matches(s.pid, s.tid) || !filter.kind.includes(s.state) {
                continue;
            }
            let (name_id, name) = process_names.of(s.pid);
            if wall {
                *explained.entry((s.tid, s.state, name_id)).or_default() += s.ns;
            }
            let tid = if keep_tid || wall { s.tid } else { 0 };
            let stack = Arc::as_ptr(&s.stack) as *const Frame as usize;
            let row = rows
                .entry((s.pid, tid, s.state, stack, name_id))
                .or_insert_with(|| (s.stack.clone(), 0, 0, name.cloned()));
            row.1 += s.ns;
            row.2 += s.count;
        }
        if filter.kind == Kind::Wakeup {
            wakeups(&slice, filter, keep_tid, &mut out);
        }
        if wall {
            // In a slice whose rows were folded into pools, a thread's
            // exact time scales and completes its pool's rows.
            let folded = slice.threads.keys().any(|t| merge::is_pool_tid(*t));
            for t in slice
                .thread_totals
                .iter()
                .filter(|t| filter.matches(t.pid, t.tid))
            {
                let (name_id, name) = process_names.of(t.pid);
                let tid = match folded {
                    true => merge::pool_of(&slice, t.pid, t.tid),
                    false => t.tid,
                };
                for state in State::ALL {
                    let entry = totals
                        .entry((tid, state, name_id))
                        .or_insert_with(|| (t.pid, 0, name.cloned()));
                    entry.1 += t.counters.ns_in(state);
                }
            }
        }
    }
    // Off-CPU rows are estimates (stacks sampled by interval length): where
    // a thread's rows of a state exceed its exact time in it, they are
    // scaled down to it, so a wall graph never outgrows the thread.
    let scale = |key: (u32, State, usize)| {
        let total = totals.get(&key).map_or(0, |t| t.1);
        let rows = explained.get(&key).copied().unwrap_or(0);
        if total > 0 && rows > total {
            total as f64 / rows as f64
        } else {
            1.0
        }
    };
    for ((pid, tid, state, _, name_id), (stack, ns, count, process)) in rows {
        let ns = if wall {
            (ns as f64 * scale((tid, state, name_id))).round() as u64
        } else {
            ns
        };
        out.push(Row {
            pid,
            process,
            tid,
            state: Some(state),
            interrupt: None,
            stack,
            leaf: None,
            ns,
            count,
        });
    }
    // Wall graphs add up to each thread's wall time: what no stack row
    // explains (short intervals, sampling error) shows as [unattributed].
    let unattributed: Frame = Arc::from(UNATTRIBUTED);
    for (key, (pid, total, process)) in totals {
        let rest = total.saturating_sub(explained.get(&key).copied().unwrap_or(0));
        let (tid, state, _) = key;
        out.push(Row {
            pid,
            process,
            tid,
            state: Some(state),
            interrupt: None,
            stack: Arc::from([]),
            leaf: Some(unattributed.clone()),
            ns: rest,
            count: 0,
        });
    }
    out.retain(|r| r.ns > 0);
    (out, names)
}

pub use super::disclosure::OTHER_PROCESS;

/// The wakeups of one slice that `filter` selects: those the process or
/// thread sent, and those it received.
fn wakeups(slice: &Slice, filter: &Filter, keep_tid: bool, out: &mut Vec<Row>) {
    for w in &slice.wakeups {
        if !filter.matches(w.pid, w.tid) && !filter.matches(w.peer_pid, w.peer_tid) {
            continue;
        }
        let hidden = |pid: u32| filter.others_hidden && filter.pid != Some(pid);
        // A merged wakee row stands for many threads, none of them named.
        let wakee = match slice.threads.get(&w.peer_tid) {
            _ if hidden(w.peer_pid) => OTHER_PROCESS.to_string(),
            Some(t) => thread_frame(&t.name, w.peer_tid),
            None if is_merged_tid(w.peer_tid) => thread_frame(MERGED_THREADS, w.peer_tid),
            None => thread_frame("[unknown]", w.peer_tid),
        };
        // Another process's waker: that it woke the thread, not who or how.
        let waker_hidden = w.interrupt.is_none() && hidden(w.pid);
        out.push(Row {
            pid: if w.interrupt.is_some() || waker_hidden {
                0
            } else {
                w.pid
            },
            process: if waker_hidden {
                Some(Arc::from(OTHER_PROCESS))
            } else {
                slice.processes.get(&w.pid).cloned()
            },
            tid: if keep_tid && w.interrupt.is_none() && !waker_hidden {
                w.tid
            } else {
                0
            },
            state: None,
            interrupt: w.interrupt,
            stack: if waker_hidden {
                Stack::from([])
            } else {
                w.stack.clone()
            },
            leaf: Some(Arc::from(format!("[wakes {wakee}]"))),
            ns: w.ns,
            count: w.count,
        });
    }
}
