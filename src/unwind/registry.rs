//! Which processes use which unwind tables, kept in the BPF maps.
//!
//! Tables are built once per file (device and inode), so one table serves
//! every process that maps it, and only for files without frame pointers
//! (a frame-pointer walk is cheaper and as good there). They share one row
//! array of fixed capacity (`--unwind-table-mb`), split among users by
//! [`super::fair`]: when a table does not fit, only tables it may claim
//! (unused ones, its users' own worth less, other users' past their share)
//! make room, the cheapest adjacent ones, else the new table waits
//! outside. So one user's churn evicts only that user's tables, and the
//! files every user's processes map (libc, the loader) keep theirs. Each
//! eviction is counted against the user whose table needed the room
//! ([`super::accounts`]). Each update has a time budget: new processes are registered
//! first (cheap: their mappings, and the tables already loaded), then
//! tables are built, most shared first.
//!
//! Processes come from the process table: their mappings are the table's
//! (read once there for every stage), a process is registered again when
//! the table has re-read its maps (a library loaded since) or it exec'd,
//! and forgotten by the table's rule (see [`crate::process::Subscription`]).

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

pub use super::stats::UnwindStats;
use super::{
    accounts::Accounts,
    fair::vital_keys,
    files::{delta_of, FileEntry, TableState},
    held,
    procs::{choose, unique_keys, Candidate, ProcState},
    space::RowSpace,
    stats::{top_missing, Lacking},
};
use crate::bpf::{
    abi::{UnwindProc, UNWIND_MAX_MAPPINGS},
    UnwindMaps,
};
use crate::budget::shares::Shares;
use crate::process::{
    files::{exec_mappings_in, ExecMapping, FileKey},
    ProcessTable, Subscription,
};
use crate::runtime::{Attach, Runtimes, WalkEntry};

mod by_user;
mod place;
mod slots;

/// A table left out for lack of room, or that no process could open, is
/// tried again after this long, if room may be made for it by then.
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// An evicted table waits this long before it may come back, so that
/// tables competing for too little room do not take turns every update.
const EVICTED_COOLDOWN: Duration = Duration::from_secs(60);
/// No table may take more than this share of the row array: one huge
/// module (a compiler's shared library) would evict every other table.
const MAX_TABLE_SHARE: u32 = 4;
/// Work per update: once spent, the rest waits for the next update (one
/// table build may overrun it, since a build is not split).
const UPDATE_BUDGET: Duration = Duration::from_millis(100);
/// Processes registered at most: the capacity of `unwind_procs`.
pub(super) const MAX_PROCS: usize = crate::bpf::abi::UNWIND_PROCS;
/// Files no registered process maps whose verdict (no table needed,
/// failed...) is kept, so that short-lived programs run again and again
/// are not parsed again; the least recently used go first.
pub(super) const MAX_IDLE_FILES: usize = 4096;

/// Keeps `unwind_procs` and `unwind_rows` up to date with the processes seen.
pub struct Registry {
    maps: UnwindMaps,
    files: HashMap<FileKey, FileEntry>,
    procs: HashMap<u32, ProcState>,
    /// The processes each user has in `procs` (see [`slots`]).
    shares: Shares,
    /// When `unwind_procs` was last swept of stale entries (see [`slots`]).
    swept: Option<Instant>,
    /// Processes seen but not registered yet (new, or after an exec).
    queue: VecDeque<u32>,
    queued: HashSet<u32>,
    space: RowSpace,
    stats: UnwindStats,
    /// Evictions by user (see [`super::fair`] for who may evict whose).
    accounts: Accounts,
    /// Registrations so far (each process entry carries its own).
    epoch: u32,
    changes: Subscription,
    /// The language runtimes whose walk entries go with a process's
    /// tables (see [`crate::runtime`]).
    runtimes: Runtimes,
}

impl Registry {
    /// A registry writing to `maps` for the processes of `table`.
    pub fn new(maps: UnwindMaps, table: Arc<ProcessTable>) -> Registry {
        let capacity = maps.capacity;
        Registry {
            changes: table.subscribe(),
            maps,
            files: HashMap::new(),
            procs: HashMap::new(),
            shares: Shares::new(MAX_PROCS, slots::FLOOR),
            swept: None,
            queue: VecDeque::new(),
            queued: HashSet::new(),
            space: RowSpace::new(capacity),
            accounts: Accounts::default(),
            epoch: 0,
            runtimes: Runtimes::default(),
            stats: UnwindStats {
                rows_capacity: u64::from(capacity),
                ..UnwindStats::default()
            },
        }
    }

    /// Also writes what `runtimes` need of each process into its entry.
    pub fn with_runtimes(mut self, runtimes: Runtimes) -> Registry {
        self.runtimes = runtimes;
        self
    }

    /// What has been done so far.
    pub fn stats(&self) -> UnwindStats {
        UnwindStats {
            runtimes: self.runtimes.walk_stats(),
            ..self.stats.clone()
        }
    }

    /// Takes note of the processes seen (in a drain), registers new ones
    /// and those whose maps changed, builds tables, within a time budget;
    /// forgets the processes the table says ended.
    pub fn update(&mut self, pids: impl IntoIterator<Item = u32>) {
        let now = Instant::now();
        let deadline = now + UPDATE_BUDGET;
        let pids: HashSet<u32> = pids.into_iter().collect();
        self.forget(now);
        self.see(pids.iter().copied(), now);
        while Instant::now() < deadline {
            let Some(pid) = self.queue.pop_front() else {
                break;
            };
            self.queued.remove(&pid);
            self.register(pid, now);
        }
        let grown: Vec<u32> = (self.runtimes.iter())
            .flat_map(|r| r.synchronize(&pids, now, deadline))
            .collect();
        for pid in grown {
            self.new_epoch(pid);
        }
        // At least one build per update, so that a flood of new processes
        // does not starve the tables; the newest file and the most shared
        // one in turn, so that neither a backlog nor a flood holds the
        // other back.
        let mut builds = 0;
        while builds == 0 || Instant::now() < deadline {
            let Some(key) = self.next_build(now, builds % 2 == 0) else {
                break;
            };
            self.build(key, now);
            builds += 1;
        }
        self.report(now);
    }

    /// Marks the processes seen and their files used; queues the new ones,
    /// those that exec'd (or whose pid was reused) and those whose maps
    /// the table has read again.
    fn see(&mut self, pids: impl IntoIterator<Item = u32>, now: Instant) {
        let mut fresh = HashSet::new();
        for pid in pids {
            if pid == 0 || !fresh.insert(pid) {
                continue;
            }
            let Some(image) = self.changes.table().live(pid) else {
                continue;
            };
            let replaced = match self.procs.get_mut(&pid) {
                Some(p) => {
                    p.seen = now;
                    for m in &p.mappings {
                        if let Some(f) = self.files.get_mut(&m.key) {
                            f.used = now;
                        }
                    }
                    p.key != image.key()
                        || !Arc::ptr_eq(&p.maps, &image.maps)
                        || self.runtimes.retry_due(pid, now)
                }
                None => true,
            };
            if replaced && self.queued.len() < MAX_PROCS && self.queued.insert(pid) {
                self.queue.push_back(pid);
            }
        }
    }

    /// Forgets the processes whose program ended (see
    /// [`crate::process::Subscription`]), and files nobody maps.
    fn forget(&mut self, now: Instant) {
        let due = self.changes.poll(now);
        let gone = self.changes.gone(due, self.procs.values().map(|p| p.key));
        for key in gone {
            if self.procs.get(&key.pid).is_none_or(|p| p.key != key) {
                continue;
            }
            self.unregister(key.pid);
        }
        // Nothing to build for a file nobody maps; keep a bounded number of
        // verdicts on idle files; loaded tables stay (the cheapest to evict).
        self.files
            .retain(|_, f| f.users > 0 || !matches!(f.state, TableState::Pending));
        let mut idle: Vec<(Instant, FileKey)> = self
            .files
            .iter()
            .filter(|(_, f)| f.users == 0 && !matches!(f.state, TableState::Loaded { .. }))
            .map(|(k, f)| (f.used, *k))
            .collect();
        if idle.len() > MAX_IDLE_FILES {
            idle.sort_unstable();
            for (_, key) in &idle[..idle.len() - MAX_IDLE_FILES] {
                self.files.remove(key);
            }
        }
    }

    fn attach(&mut self, mappings: &[ExecMapping], uid: u32, now: Instant) {
        let vital = vital_keys(mappings);
        for key in unique_keys(mappings) {
            let Some(m) = mappings.iter().find(|m| m.key == key) else {
                continue;
            };
            let f = self
                .files
                .entry(key)
                .or_insert_with(|| FileEntry::new(m.path.clone(), now));
            f.attach(uid, vital.contains(&key));
            f.used = now;
        }
    }

    fn detach(&mut self, mappings: &[ExecMapping], uid: u32) {
        let vital = vital_keys(mappings);
        for key in unique_keys(mappings) {
            if let Some(f) = self.files.get_mut(&key) {
                f.detach(uid, vital.contains(&key));
            }
        }
    }

    /// Takes a process's mappings from the table (again) and writes its
    /// entry with the tables already loaded; files without one yet are
    /// left to [`Registry::build`].
    fn register(&mut self, pid: u32, now: Instant) {
        let Some(image) = self.changes.table().live(pid) else {
            return;
        };
        // Gone already if its facts cannot be read.
        let Some(uid) = self.changes.table().user_of(pid) else {
            return;
        };
        let old = self.take(pid);
        if old.is_none() && self.procs.len() >= MAX_PROCS && !self.make_slot(pid, uid) {
            return;
        }
        let mappings = exec_mappings_in(&image.maps);
        let mut seen = now;
        let mut written = Vec::new();
        let mut written_runtime = None;
        let mut tables_evicted = 0;
        // The entry BPF writes at an exec (epoch 0: all tables pending, no
        // table) stays until `write_entry` replaces or removes it. Removed
        // here first, it left a moment with no entry, when BPF walked by
        // frame pointers unmarked: a CI run caught a sample in a leaf
        // without a frame pointer whose caller was lost silently.
        let (ours, exec_entry) = match self.maps.procs.get(&pid, 0) {
            Ok(entry) if entry.epoch == 0 => (false, true),
            found => (found.is_ok(), false),
        };
        let mut written_pending = exec_entry;
        if let Some(old) = old {
            self.detach(&old.mappings, old.uid);
            seen = old.seen;
            if old.key == image.key() {
                tables_evicted = old.tables_evicted;
            }
            // An entry still there need not be written again if unchanged
            // (a new epoch would empty BPF's cache of its rules).
            if ours {
                written = old.written;
                written_runtime = old.written_runtime;
                written_pending = old.written_pending;
            }
        }
        let attach = Attach {
            pid,
            key: image.key(),
            uid,
            image: &image,
            mappings: &mappings,
            now,
        };
        let mut part = WalkEntry::default();
        self.runtimes.each(|r| r.walk_entry(&attach, &mut part));
        let runtime = (part != WalkEntry::default()).then_some(part);
        self.attach(&mappings, uid, now);
        self.keep(
            pid,
            ProcState {
                key: image.key(),
                uid,
                maps: image.maps.clone(),
                name: image.name.clone(),
                seen,
                mappings,
                written,
                left_out: Vec::new(),
                runtime,
                written_runtime,
                tables_evicted,
                written_pending,
            },
        );
        self.write_entry(pid);
    }

    /// Writes `pid`'s entry again under a new epoch, so that BPF walks
    /// again the stacks of its threads that blocked before their runtime's
    /// thread state was known (a thread blocked for hours would otherwise
    /// keep its native-only stack).
    fn new_epoch(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.written_runtime = None;
        }
        self.write_entry(pid);
    }

    /// Writes `pid`'s BPF entry from the tables loaded now, if it changed
    /// (see [`choose`] for processes with too many mappings).
    fn write_entry(&mut self, pid: u32) {
        let Some(p) = self.procs.get(&pid) else {
            return;
        };
        let mut candidates = Vec::new();
        for m in &p.mappings {
            let Some(f) = self.files.get_mut(&m.key) else {
                continue;
            };
            let TableState::Loaded { place, .. } = f.state else {
                continue;
            };
            let Some(delta) = f.delta(m.offset).or_else(|| delta_of(pid, m)) else {
                continue;
            };
            if f.delta(m.offset).is_none() {
                f.deltas.push((m.offset, delta));
            }
            candidates.push(Candidate::new(f.users, m.key, m, delta, place));
        }
        let dropped = candidates.len().saturating_sub(UNWIND_MAX_MAPPINGS);
        let (entry, left_out) = choose(candidates);
        let pending = p.tables_pending(&self.files);
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        p.left_out = left_out;
        if p.written == entry && p.written_runtime == p.runtime && p.written_pending == pending {
            return;
        }
        self.stats.mappings_dropped += dropped as u64;
        // Never 0: that is the entry BPF writes at an exec.
        self.epoch = self.epoch.wrapping_add(1).max(1);
        let runtime = p.runtime;
        let mut proc = UnwindProc {
            epoch: self.epoch,
            count: entry.len() as u32,
            pending: u32::from(pending),
            ..UnwindProc::default()
        };
        for (slot, (_, m)) in proc.mappings.iter_mut().zip(&entry) {
            *slot = *m;
        }
        runtime.unwrap_or_default().write_into(&mut proc);
        if entry.is_empty() && runtime.is_none() && !pending {
            let _ = self.maps.procs.remove(&pid);
        } else if let Err(err) = self.insert_entry(pid, proc) {
            tracing::debug!(pid, "registering unwind tables: {err}");
            if let Some(p) = self.procs.get_mut(&pid) {
                p.written.clear();
            }
            return;
        }
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        p.written = entry;
        p.written_runtime = runtime;
        p.written_pending = pending;
    }

    /// Processes mapping `key` (`in_entry`: whose entry holds its table).
    fn users_of(&self, key: FileKey, in_entry: bool) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|(_, p)| {
                if in_entry {
                    p.written.iter().any(|(k, _)| *k == key)
                } else {
                    p.mappings.iter().any(|m| m.key == key)
                }
            })
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// Gauges, and which processes walk without which table.
    fn report(&mut self, now: Instant) {
        let files = &self.files;
        let lacking: Vec<Lacking> = self
            .procs
            .iter()
            .filter_map(|(pid, p)| p.lacking(*pid, files))
            .collect();
        self.report_users(&lacking);
        let files = &self.files;
        let s = &mut self.stats;
        s.processes_missing_tables = lacking.len() as u64;
        let procs = &self.procs;
        s.missing = top_missing(
            lacking,
            |pid| procs.get(&pid).map(|p| p.name.clone()).unwrap_or_default(),
            |k| files.get(k).map(|f| f.path.to_string()).unwrap_or_default(),
        );
        s.tables_pending = files
            .values()
            .filter(|f| f.users > 0 && matches!(f.state, TableState::Pending))
            .count() as u64;
        s.processes = self
            .procs
            .values()
            .filter(|p| !p.written.is_empty())
            .count() as u64;
        s.processes_pending = self.queue.len() as u64;
        s.processes_tables_pending = procs.values().filter(|p| p.written_pending).count() as u64;
        let max_rows = held::max_build_rows((self.maps.capacity / MAX_TABLE_SHARE) as usize);
        held::publish(files.len(), procs.len(), max_rows);
        s.last_update_us = now.elapsed().as_micros() as u64;
        s.max_update_us = s.max_update_us.max(s.last_update_us);
    }
}
