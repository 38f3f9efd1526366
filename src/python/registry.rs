//! Python interpreters for the walk: which registered processes run one
//! (its frame layout goes into their BPF entry), and the thread state of
//! each of their threads, kept in `python_threads` from the interpreter's
//! own thread list; with Python's thread names, published for the
//! symbolizer ([`Pythons`]) together with the interpreter that names the
//! code objects the walk records.
//!
//! The work done for a process is its own: a bounded number of reads per
//! scan, a scan a second at most, names every few seconds, and an
//! interpreter that cannot be read (not initialised yet, or not what it
//! claims) is tried again for a while, then given up, each failure
//! counted (`python`/`implausible`).

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};

use crate::{
    bpf::abi::{PyThreadKey, UnwindPython, PY_THREADS},
    budget::{cpu, shares::Shares},
    process::remote::{Budget, Remote},
    process::{files::ExecMapping, ProcKey, ProcessTable},
    python::{self, shares, Interpreter, PyError, PyThread},
    runtime::stats::PythonStats,
    untrusted::refusals::{self, Reason, What},
};

/// Threads are read again this often (a new thread's stacks show native
/// frames only until then).
const SCAN_EVERY: Duration = Duration::from_secs(1);
/// Python's thread names are read again this often.
const NAMES_EVERY: Duration = Duration::from_secs(5);
/// An interpreter that could not be read is tried again this often...
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// ... for this long after the process was first registered.
const RETRY_FOR: Duration = Duration::from_secs(30);
/// Processes remembered as given up (past it, newer ones are tried again
/// at their next registration).
const MAX_GIVEN_UP: usize = 4096;
/// Reads one scan may make of a process (threads, then names).
const SCAN_CALLS: u64 = 8 * python::MAX_THREADS as u64 + 256;
const SCAN_BYTES: u64 = 4 << 20;
/// Bytes of Python thread names kept per process, and in all: names past
/// them are left out (counted `python`/`budget`), the threads then keep
/// their kernel names.
const NAME_BYTES_PER_PROCESS: usize = 256 << 10;
const NAME_BYTES: usize = 16 << 20;
/// Where glibc's `struct pthread` keeps the thread's kernel tid (x86-64,
/// glibc 2.26+): names a thread of CPython 3.10, whose thread state has
/// no `native_thread_id`. Checked against the process's tids.
const GLIBC_PTHREAD_TID: u64 = 0x2d0;

/// A Python process as the symbolizer sees it.
#[derive(Debug)]
pub struct PyProc {
    pub key: ProcKey,
    /// Its effective uid when registered: whose CPU budget its reads take.
    pub uid: u32,
    pub interp: Interpreter,
    /// Python's thread names by tid.
    pub names: HashMap<u32, Arc<str>>,
}

/// The Python processes registered, by pid: written by the unwind
/// registry, read by the symbolizer.
#[derive(Debug, Clone, Default)]
pub struct Pythons(Arc<RwLock<HashMap<u32, Arc<PyProc>>>>);

impl Pythons {
    /// Process `pid`'s interpreter, if it runs a registered one.
    pub fn get(&self, pid: u32) -> Option<Arc<PyProc>> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&pid)
            .cloned()
    }

    fn set(&self, pid: u32, proc: Option<PyProc>) {
        let mut all = self.0.write().unwrap_or_else(|e| e.into_inner());
        match proc {
            Some(p) => all.insert(pid, Arc::new(p)),
            None => all.remove(&pid),
        };
    }
}

/// What the registry keeps of one Python process.
struct PyState {
    key: ProcKey,
    /// Its effective uid when registered: whose share its entries take.
    uid: u32,
    interp: Interpreter,
    /// Its entries in `python_threads`: thread id -> thread state.
    written: HashMap<u64, u64>,
    names: HashMap<u32, Arc<str>>,
    scanned: Option<Instant>,
    named: Option<Instant>,
}

/// The Python side of the unwind registry.
pub struct PythonThreads {
    map: BpfHashMap<MapData, PyThreadKey, u64>,
    procs: HashMap<u32, PyState>,
    /// Processes whose interpreter could not be read yet: when to try
    /// again, and until when.
    retry: HashMap<u32, (ProcKey, Instant, Instant)>,
    shared: Pythons,
    stats: PythonStats,
    /// Bytes of the thread names all processes' states hold.
    name_bytes: usize,
    /// Processes whose interpreter was tried for [`RETRY_FOR`] in vain.
    given_up: HashMap<u32, ProcKey>,
    /// The entries of `python_threads` each user holds.
    shares: Shares,
    /// Where a process's threads are listed.
    table: Arc<ProcessTable>,
}

impl PythonThreads {
    /// Keeps `map` (`python_threads`) and publishes the interpreters in
    /// `shared`; the processes are `table`'s.
    pub fn new(
        map: BpfHashMap<MapData, PyThreadKey, u64>,
        shared: Pythons,
        table: Arc<ProcessTable>,
    ) -> PythonThreads {
        PythonThreads {
            map,
            procs: HashMap::new(),
            retry: HashMap::new(),
            shared,
            stats: PythonStats::default(),
            name_bytes: 0,
            given_up: HashMap::new(),
            shares: shares::shares(PY_THREADS),
            table,
        }
    }

    fn refused(&mut self, pid: u32, err: &PyError) {
        tracing::debug!(pid, "python interpreter not read: {err}");
        let reason = match err {
            PyError::NotPython | PyError::Unsupported(_) => return,
            PyError::File(_) => Reason::WrongType,
            PyError::Read(_) => Reason::Budget,
            PyError::Implausible(_) => Reason::Implausible,
        };
        self.stats.refused += 1;
        refusals::count_for(What::Python, reason, pid);
    }

    /// Reads `pid`'s threads again; whether it wrote a thread that was not
    /// in `python_threads` before.
    fn scan_one(&mut self, pid: u32, now: Instant) -> bool {
        let Some(p) = self.procs.get_mut(&pid) else {
            return false;
        };
        p.scanned = Some(now);
        let mem = Remote::with_budget(pid, Budget::new(SCAN_CALLS, SCAN_BYTES));
        let threads = match p.interp.threads(&mem) {
            Ok(t) => t,
            Err(err) => {
                tracing::debug!(pid, "python threads not read: {err}");
                if mem.exhausted() {
                    refusals::count_for(What::Python, Reason::Budget, pid);
                }
                return false;
            }
        };
        let now_ids: HashMap<u64, u64> = threads.iter().map(|t| (t.thread_id, t.tstate)).collect();
        let gone: Vec<u64> = p
            .written
            .keys()
            .filter(|id| !now_ids.contains_key(id))
            .copied()
            .collect();
        for id in &gone {
            p.written.remove(id);
            let _ = self.map.remove(&thread_key(pid, *id));
        }
        let uid = p.uid;
        self.shares.remove(uid, gone.len());
        let fresh: Vec<PyThread> = threads
            .iter()
            .filter(|t| p.written.get(&t.thread_id) != Some(&t.tstate))
            .copied()
            .collect();
        let new = fresh
            .iter()
            .filter(|t| !p.written.contains_key(&t.thread_id))
            .count();
        let mut allowed = new.min(shares::room(&self.shares, uid, p.written.len()));
        if new > allowed {
            // Past its user's share (or its own): its other threads walk
            // without Python frames; the degraded marker names it.
            self.stats.threads_left_out += (new - allowed) as u64;
            refusals::count_for(What::Python, Reason::Budget, pid);
        }
        self.take_back(pid, uid, allowed);
        let Some(p) = self.procs.get_mut(&pid) else {
            return false;
        };
        let mut added = false;
        for t in &fresh {
            let is_new = !p.written.contains_key(&t.thread_id);
            if is_new && allowed == 0 {
                continue;
            }
            if self
                .map
                .insert(thread_key(pid, t.thread_id), t.tstate, 0)
                .is_err()
            {
                self.stats.threads_left_out += 1;
                continue;
            }
            if is_new {
                allowed -= 1;
                self.shares.add(uid, 1);
            }
            added |= p.written.insert(t.thread_id, t.tstate).is_none();
        }
        if p.named.is_none_or(|at| now >= at + NAMES_EVERY) {
            p.named = Some(now);
            let others: usize = self.name_bytes - names_bytes(&p.names);
            let room = NAME_BYTES_PER_PROCESS.min(NAME_BYTES.saturating_sub(others));
            let (names, cut) = thread_names(&p.interp, &mem, &threads, room, &self.table);
            if cut {
                refusals::count_for(What::Python, Reason::Budget, pid);
            }
            p.names = names;
            self.name_bytes = others + names_bytes(&p.names);
        }
        self.shared.set(
            pid,
            Some(PyProc {
                key: p.key,
                uid: p.uid,
                interp: p.interp.clone(),
                names: p.names.clone(),
            }),
        );
        added
    }

    /// Takes back from the users above their share (see [`Shares`]) the
    /// entries `want` more of `uid`'s need, from their processes holding
    /// most (each counted and named as degraded), but never `pid`'s.
    fn take_back(&mut self, pid: u32, uid: u32, want: usize) {
        for (victim, n) in self.shares.reclaim(uid, want) {
            let mut theirs: Vec<(usize, u32)> = self
                .procs
                .iter()
                .filter(|(&q, s)| s.uid == victim && q != pid)
                .map(|(&q, s)| (s.written.len(), q))
                .collect();
            theirs.sort_unstable_by(|a, b| b.cmp(a));
            let mut left = n;
            for (_, q) in theirs {
                let Some(s) = self.procs.get_mut(&q) else {
                    continue;
                };
                if left == 0 {
                    break;
                }
                let ids: Vec<u64> = s.written.keys().take(left).copied().collect();
                for id in &ids {
                    s.written.remove(id);
                    let _ = self.map.remove(&thread_key(q, *id));
                }
                left -= ids.len();
                self.shares.remove(victim, ids.len());
                self.stats.threads_taken_back += ids.len() as u64;
                refusals::count_for(What::Python, Reason::Budget, q);
            }
        }
    }

    /// Forgets `pid` and its threads: its program changed.
    fn forget(&mut self, pid: u32) {
        self.retry.remove(&pid);
        if let Some(p) = self.procs.remove(&pid) {
            self.shares.remove(p.uid, p.written.len());
            self.name_bytes -= names_bytes(&p.names);
            for id in p.written.keys() {
                let _ = self.map.remove(&thread_key(pid, *id));
            }
            self.shared.set(pid, None);
        }
    }
}

fn thread_key(pid: u32, thread_id: u64) -> PyThreadKey {
    PyThreadKey {
        pid,
        _pad: 0,
        thread_id,
    }
}

/// What a process's thread names hold, by the bound's count: their
/// bytes and a map entry each.
fn names_bytes(names: &HashMap<u32, Arc<str>>) -> usize {
    names.values().map(|n| n.len() + 32).sum()
}

/// Python's names of `threads`, by kernel tid, at most `room` bytes (by
/// [`names_bytes`]'s count); and whether some were left out for it.
fn thread_names(
    interp: &Interpreter,
    mem: &Remote,
    threads: &[PyThread],
    room: usize,
    table: &ProcessTable,
) -> (HashMap<u32, Arc<str>>, bool) {
    let names = match interp.thread_names(mem) {
        Ok(n) => n,
        Err(err) => {
            tracing::debug!(pid = interp.pid, "python thread names not read: {err}");
            return (HashMap::new(), false);
        }
    };
    let tids: HashSet<u32> = table.threads(interp.pid).into_iter().collect();
    // The interpreter and glibc write down tids of the process's own pid
    // namespace: in a container, not the host's the samples carry.
    let in_container = table.host_tids_in_container(interp.pid);
    let host_tid = |tid: u32| match &in_container {
        Some(by_ns) => by_ns.get(&tid).copied(),
        None => Some(tid),
    };
    let tid_of = |t: &PyThread| -> Option<u32> {
        if let Some(tid) = t.native_tid {
            return host_tid(tid);
        }
        let mut b = [0u8; 4];
        mem.read(t.thread_id.checked_add(GLIBC_PTHREAD_TID)?, &mut b)
            .ok()?;
        host_tid(u32::from_le_bytes(b)).filter(|tid| tids.contains(tid))
    };
    let by_id: HashMap<u64, u32> = threads
        .iter()
        .filter_map(|t| Some((t.thread_id, tid_of(t)?)))
        .collect();
    let mut kept = HashMap::new();
    let (mut bytes, mut cut) = (0, false);
    for (id, name) in names {
        let Some(&tid) = by_id.get(&id) else {
            continue;
        };
        if bytes + name.len() + 32 > room {
            cut = true;
            break;
        }
        bytes += name.len() + 32;
        kept.insert(tid, Arc::from(name));
    }
    (kept, cut)
}

/// Whether a mapping of `path` (as `/proc/PID/maps` shows it) may be a
/// CPython interpreter: `libpython3.X.so*`, or an executable `python3.X`
/// (a static build). Only a cheap first test: [`python::find`] checks.
fn maps_interpreter(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    let minor_follows = |rest: &str| rest.starts_with(|c: char| c.is_ascii_digit());
    name.strip_prefix("libpython3.").is_some_and(minor_follows)
        || name.strip_prefix("python3.").is_some_and(|rest| {
            minor_follows(rest)
                && rest
                    .chars()
                    .all(|c| c.is_ascii_digit() || c == 'd' || c == 't')
        })
}

const _: () = assert!(PY_THREADS >= python::MAX_THREADS);

/// The walk half of the Python runtime (see [`super::runtime`]).
impl PythonThreads {
    /// The walk layout of `pid`'s interpreter, if it runs one that can be
    /// read (registering it and its threads), else `None` (tried again
    /// later if it maps an interpreter).
    pub fn register(
        &mut self,
        pid: u32,
        key: ProcKey,
        uid: u32,
        mappings: &[ExecMapping],
        now: Instant,
    ) -> Option<UnwindPython> {
        if let Some(p) = self.procs.get(&pid).filter(|p| p.key == key) {
            return Some(p.interp.walk_layout());
        }
        if self.given_up.get(&pid) == Some(&key) {
            return None;
        }
        self.forget(pid);
        if !mappings.iter().any(|m| maps_interpreter(&m.path)) {
            return None;
        }
        match python::find(pid, mappings) {
            Ok(interp) => {
                self.retry.remove(&pid);
                let layout = interp.walk_layout();
                self.procs.insert(
                    pid,
                    PyState {
                        key,
                        uid,
                        interp,
                        written: HashMap::new(),
                        names: HashMap::new(),
                        scanned: None,
                        named: None,
                    },
                );
                self.scan_one(pid, now);
                Some(layout)
            }
            Err(err) => {
                self.refused(pid, &err);
                let until = match self.retry.get(&pid) {
                    Some(&(k, _, until)) if k == key => until,
                    _ => now + RETRY_FOR,
                };
                if now < until {
                    self.retry.insert(pid, (key, now + RETRY_EVERY, until));
                } else {
                    // Not again for this program: a process that keeps
                    // changing its maps must not buy a read each time.
                    self.retry.remove(&pid);
                    if self.given_up.len() < MAX_GIVEN_UP {
                        self.given_up.insert(pid, key);
                    }
                }
                None
            }
        }
    }
    /// Whether `pid`'s interpreter is due to be tried again.
    pub fn retry_due(&self, pid: u32, now: Instant) -> bool {
        self.retry
            .get(&pid)
            .is_some_and(|&(_, next, _)| now >= next)
    }
    /// Reads the threads of the Python processes among `pids` again (at
    /// most once per [`SCAN_EVERY`] each), until `deadline`.
    pub fn scan(&mut self, pids: &HashSet<u32>, now: Instant, deadline: Instant) -> Vec<u32> {
        let due: Vec<u32> = self
            .procs
            .iter()
            .filter(|(pid, p)| {
                pids.contains(pid) && p.scanned.is_none_or(|at| now >= at + SCAN_EVERY)
            })
            .map(|(pid, _)| *pid)
            .collect();
        let mut grown = Vec::new();
        for pid in due {
            if Instant::now() >= deadline {
                break;
            }
            // Reading its thread states is work its user pays for: past
            // their CPU budget, scanned again once it refilled.
            let uid = self.procs.get(&pid).map_or(cpu::UNKNOWN_USER, |p| p.uid);
            let Some(_unit) = cpu::admit(uid, pid, What::Python) else {
                continue;
            };
            if self.scan_one(pid, now) {
                grown.push(pid);
            }
        }
        grown
    }
    /// Forgets process `pid`: it ended.
    pub fn ended(&mut self, pid: u32) {
        self.given_up.remove(&pid);
        self.forget(pid);
    }
    pub fn stats(&self) -> PythonStats {
        PythonStats {
            interpreters: self.procs.len() as u64,
            threads: self.procs.values().map(|p| p.written.len() as u64).sum(),
            ..self.stats.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::maps_interpreter;

    #[test]
    fn interpreters_are_told_by_their_file_names() {
        for yes in [
            "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0",
            "/usr/bin/python3.11",
            "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
            "/opt/py/bin/python3.13t",
        ] {
            assert!(maps_interpreter(yes), "{yes}");
        }
        for no in [
            "/usr/bin/python3",
            "/usr/lib/libc.so.6",
            "/tmp/python3.x",
            "/x/python3.11-config",
        ] {
            assert!(!maps_interpreter(no), "{no}");
        }
    }
}
