//! Counts of what the daemon refused to open, read, write or do for a
//! process, by what it was and why: reported in `/healthz` (`refused`) and
//! `/metrics` (`wallscope_refused_total{what,reason}`). Process-wide
//! atomics: every stage (symbolizer, unwind registry, JVM agent, API)
//! refuses on its own thread.
//!
//! A refusal for a [`Reason::Budget`] (one process used up its share of
//! some work), a [`Reason::UserCpu`] (its user did) or
//! [`Reason::Unverified`] also marks the daemon *degraded*
//! for [`DEGRADED_FOR`]: `/healthz` then says which process and what, so
//! an operator sees that some frames are worse than they could be, and
//! whose fault it is.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

/// What was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// A JIT perf map (`/tmp/perf-PID.map`).
    PerfMap,
    /// An ELF file a process maps (symbols, unwind tables).
    Elf,
    /// The JVM attach trigger file (`.attach_pidN`).
    AttachTrigger,
    /// The JVM attach socket (`/tmp/.java_pidN`).
    AttachSocket,
    /// Reads of a JVM's memory (its VM structures, code heaps, methods).
    JvmMemory,
    /// The one byte wallscope writes into a JVM (`DebugNonSafepoints`).
    JvmWrite,
    /// Attaching to a JVM (`jcmd` requests and their replies).
    JvmAttach,
    /// Frame and thread names a process brings (symbols, perf maps, Java
    /// thread names).
    Names,
    /// Room in the store (history), report slots (`/metrics`, push) and
    /// turns of the `/trace` recorder (a user's second request, a wait
    /// past its bound).
    Share,
    /// HTTP clients asking for data they have no authority over.
    Client,
    /// Reads of a CPython interpreter's memory (its runtime, threads,
    /// frames' code objects and thread names).
    Python,
    /// What one query over the store may hold and answer (its fold
    /// table, its stacks, its lines).
    Query,
    /// HTTP answers: refused past the answer budget, or closed when their
    /// client stopped reading (`api::answers`, `api::server`).
    Answers,
}

impl What {
    /// Every kind, in report order.
    pub const ALL: [What; 13] = [
        What::PerfMap,
        What::Elf,
        What::AttachTrigger,
        What::AttachSocket,
        What::JvmMemory,
        What::JvmWrite,
        What::JvmAttach,
        What::Names,
        What::Share,
        What::Client,
        What::Python,
        What::Query,
        What::Answers,
    ];

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            What::PerfMap => "perf_map",
            What::Elf => "elf",
            What::AttachTrigger => "attach_trigger",
            What::AttachSocket => "attach_socket",
            What::JvmMemory => "jvm_memory",
            What::JvmWrite => "jvm_write",
            What::JvmAttach => "jvm_attach",
            What::Names => "names",
            What::Share => "share",
            What::Client => "client",
            What::Python => "python",
            What::Query => "query",
            What::Answers => "answers",
        }
    }
}

/// Why it was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The last path component is a symbolic link.
    Symlink,
    /// A directory on the way is a symbolic link or not a directory.
    BadDirectory,
    /// Not a regular file (FIFO, device, directory...) or not a socket.
    WrongType,
    /// Owned by neither the process's user nor root.
    Owner,
    /// Larger than the documented cap.
    TooBig,
    /// Not the file the process maps (device or inode differ).
    Replaced,
    /// Older than the process: left behind by an earlier one with its pid.
    Stale,
    /// A line longer than the cap (skipped).
    LongLine,
    /// More entries than the cap (the rest skipped).
    TooManyEntries,
    /// A file wallscope must create already exists.
    Exists,
    /// The peer of a socket is not the process we meant to reach.
    WrongPeer,
    /// Did not answer in time.
    Timeout,
    /// The process used up its budget of this work for now; its own
    /// frames or history degrade, nobody else's.
    Budget,
    /// The process's user used up its CPU budget for work done on its
    /// processes' behalf ([`crate::budget::cpu`]): that user's frames
    /// degrade, nobody else's.
    UserCpu,
    /// What the process showed could not be checked against what its own
    /// files fix (a layout read from memory that its libjvm contradicts).
    Unverified,
    /// The client may not see what it asked for.
    Forbidden,
    /// Not what the program it claims to be can hold (a JVM code heap
    /// with no segment map or a segment size HotSpot never uses).
    Implausible,
}

impl Reason {
    /// Every reason, in report order.
    pub const ALL: [Reason; 17] = [
        Reason::Symlink,
        Reason::BadDirectory,
        Reason::WrongType,
        Reason::Owner,
        Reason::TooBig,
        Reason::Replaced,
        Reason::Stale,
        Reason::LongLine,
        Reason::TooManyEntries,
        Reason::Exists,
        Reason::WrongPeer,
        Reason::Timeout,
        Reason::Budget,
        Reason::UserCpu,
        Reason::Unverified,
        Reason::Forbidden,
        Reason::Implausible,
    ];

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Symlink => "symlink",
            Reason::BadDirectory => "bad_directory",
            Reason::WrongType => "wrong_type",
            Reason::Owner => "owner",
            Reason::TooBig => "too_big",
            Reason::Replaced => "replaced",
            Reason::Stale => "stale",
            Reason::LongLine => "long_line",
            Reason::TooManyEntries => "too_many_entries",
            Reason::Exists => "exists",
            Reason::WrongPeer => "wrong_peer",
            Reason::Timeout => "timeout",
            Reason::Budget => "budget",
            Reason::UserCpu => "user_cpu",
            Reason::Unverified => "unverified",
            Reason::Forbidden => "forbidden",
            Reason::Implausible => "implausible",
        }
    }
}

const CELLS: usize = What::ALL.len() * Reason::ALL.len();

static COUNTS: [AtomicU64; CELLS] = [const { AtomicU64::new(0) }; CELLS];

fn cell(what: What, reason: Reason) -> usize {
    what as usize * Reason::ALL.len() + reason as usize
}

/// Counts one refusal.
pub fn count(what: What, reason: Reason) {
    COUNTS[cell(what, reason)].fetch_add(1, Ordering::Relaxed);
}

/// How long one budget exhausted (or one unverified layout) keeps the
/// daemon `degraded` in `/healthz`.
pub const DEGRADED_FOR: Duration = Duration::from_secs(60);

/// How many processes each (what, reason) cell names in `degraded`.
const PAYERS: usize = 4;

/// One process refused in a cell within the last [`DEGRADED_FOR`]: how
/// often since it was first named, and when last.
#[derive(Clone, Copy)]
struct Payer {
    pid: u32,
    times: u64,
    last: Instant,
}

/// Per (what, reason) cell, the processes refused there lately, the one
/// refused most first. A fixed few, so a crowd of pids costs no memory;
/// the one refused least (then longest ago) gives way to a newcomer, so
/// the process that paid most stays named however many others follow it.
static PAYERS_BY_CELL: Mutex<[[Option<Payer>; PAYERS]; CELLS]> =
    Mutex::new([[None; PAYERS]; CELLS]);

/// Notes `pid` as refused in `payers` at `now`, forgetting those refused
/// longer than [`DEGRADED_FOR`] ago.
fn note_payer(payers: &mut [Option<Payer>; PAYERS], pid: u32, now: Instant) {
    for slot in payers.iter_mut() {
        if slot.is_some_and(|p| now.duration_since(p.last) >= DEGRADED_FOR) {
            *slot = None;
        }
    }
    if let Some(p) = payers.iter_mut().flatten().find(|p| p.pid == pid) {
        p.times += 1;
        p.last = now;
        return;
    }
    let slot = payers
        .iter_mut()
        .min_by_key(|s| s.map(|p| (p.times, p.last)))
        .expect("PAYERS > 0");
    *slot = Some(Payer {
        pid,
        times: 1,
        last: now,
    });
}

/// Counts one refusal made on process `pid`'s behalf; a [`Reason::Budget`],
/// [`Reason::UserCpu`] or [`Reason::Unverified`] one marks the daemon degraded for
/// [`DEGRADED_FOR`], naming `pid` (with the others refused most there;
/// see [`degrades`] for the one exception).
pub fn count_for(what: What, reason: Reason, pid: u32) {
    count(what, reason);
    if degrades(what, reason, pid) {
        let mut payers = PAYERS_BY_CELL.lock().unwrap_or_else(|e| e.into_inner());
        note_payer(&mut payers[cell(what, reason)], pid, Instant::now());
    }
}

/// Whether a refusal for `pid` marks the daemon degraded: a budget, a
/// user's CPU or an unverified layout, except the ELF budget of the daemon
/// itself. Its own binary (a release build with debuginfo is ~90 MB) is
/// past the per-process ELF budget by design: the budget is sized for the
/// processes it profiles, and raising it for ours would map that much
/// into our own RSS only to name our own frames. Counted, it would leave
/// every install that profiles itself `degraded` for good, naming itself.
fn degrades(what: What, reason: Reason, pid: u32) -> bool {
    let own_elf = what == What::Elf && pid == std::process::id();
    matches!(
        reason,
        Reason::Budget | Reason::UserCpu | Reason::Unverified
    ) && !own_elf
}

/// One (what, reason) refused in the last [`DEGRADED_FOR`].
#[derive(Debug, Clone)]
pub struct Degradation {
    pub what: What,
    pub reason: Reason,
    /// Since the last refusal.
    pub ago: Duration,
    /// The processes refused most there, most first: pid, how often, and
    /// when last.
    pub payers: Vec<(u32, u64, SystemTime)>,
}

impl Degradation {
    /// Its `/healthz` line, naming `whose` (as [`named`] gives them, and
    /// what stands for those left unnamed).
    pub fn line(&self, whose: &[String]) -> String {
        let whose = if whose.is_empty() {
            String::new()
        } else {
            format!(" for {}", whose.join(", "))
        };
        format!(
            "{} {}{whose} {}s ago ({} in all)",
            self.what.name(),
            self.reason.name(),
            self.ago.as_secs(),
            get(self.what, self.reason)
        )
    }
}

/// A payer as [`Degradation::line`] names it.
pub fn named(pid: u32, times: u64) -> String {
    format!("pid {pid} ({times}x)")
}

/// What the daemon is degraded by now, one entry per (what, reason)
/// refused in the last [`DEGRADED_FOR`]; none when it is not. Who may
/// read which process is the API's to decide (`api::disclosed`).
pub fn degradations() -> Vec<Degradation> {
    let payers = *PAYERS_BY_CELL.lock().unwrap_or_else(|e| e.into_inner());
    let now = SystemTime::now();
    What::ALL
        .iter()
        .flat_map(|&w| Reason::ALL.iter().map(move |&r| (w, r)))
        .filter_map(|(what, reason)| {
            let mut recent: Vec<Payer> = payers[cell(what, reason)]
                .iter()
                .flatten()
                .filter(|p| p.last.elapsed() < DEGRADED_FOR)
                .copied()
                .collect();
            let ago = recent.iter().map(|p| p.last.elapsed()).min()?;
            recent.sort_by_key(|p| (std::cmp::Reverse(p.times), p.last.elapsed()));
            let payers = recent
                .iter()
                .filter(|p| p.pid != 0)
                .map(|p| {
                    let at = now.checked_sub(p.last.elapsed()).unwrap_or(now);
                    (p.pid, p.times, at)
                })
                .collect();
            Some(Degradation {
                what,
                reason,
                ago,
                payers,
            })
        })
        .collect()
}

/// Why the daemon is degraded now, every process named: one line per
/// [`Degradation`].
pub fn degraded() -> Vec<String> {
    degradations()
        .iter()
        .map(|d| {
            let whose: Vec<String> = d.payers.iter().map(|&(p, n, _)| named(p, n)).collect();
            d.line(&whose)
        })
        .collect()
}

/// How often `what` was refused for `reason`.
pub fn get(what: What, reason: Reason) -> u64 {
    COUNTS[cell(what, reason)].load(Ordering::Relaxed)
}

/// Every (what, reason, count), zeros included, so that reports show
/// every counter from the start.
pub fn all() -> Vec<(What, Reason, u64)> {
    What::ALL
        .iter()
        .flat_map(|&w| Reason::ALL.iter().map(move |&r| (w, r, get(w, r))))
        .collect()
}

/// `{what: {reason: count}}` for JSON reports.
pub fn report() -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for what in What::ALL {
        let reasons: serde_json::Map<String, serde_json::Value> = Reason::ALL
            .iter()
            .map(|&r| (r.name().to_string(), get(what, r).into()))
            .collect();
        out.insert(what.name().to_string(), reasons.into());
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_distinct_and_counted() {
        let before = get(What::AttachSocket, Reason::Timeout);
        count(What::AttachSocket, Reason::Timeout);
        assert_eq!(get(What::AttachSocket, Reason::Timeout), before + 1);
        let mut cells: Vec<usize> = What::ALL
            .iter()
            .flat_map(|&w| Reason::ALL.iter().map(move |&r| cell(w, r)))
            .collect();
        cells.sort_unstable();
        cells.dedup();
        assert_eq!(cells.len(), CELLS);
        assert!(report()["perf_map"]["fifo"].is_null());
        assert!(report()["perf_map"]["wrong_type"].is_u64());
    }

    #[test]
    fn a_budget_exhausted_degrades_and_names_the_process() {
        count_for(What::Names, Reason::Timeout, 7);
        assert!(!degraded().iter().any(|d| d.starts_with("names timeout")));
        count_for(What::Names, Reason::Budget, 4242);
        let why = degraded();
        assert!(
            // Other tests of this process may be named there too.
            why.iter().any(|d| d.starts_with("names budget for ")
                && d.contains("pid 4242 (1x)")
                && d.contains(" 0s ago")),
            "{why:?}"
        );
    }

    #[test]
    fn the_daemons_own_elf_budget_is_counted_but_no_degradation() {
        let me = std::process::id();
        assert!(!degrades(What::Elf, Reason::Budget, me));
        assert!(degrades(What::Elf, Reason::Budget, me + 1));
        assert!(degrades(What::Names, Reason::Budget, me));
        let before = get(What::Elf, Reason::Budget);
        count_for(What::Elf, Reason::Budget, me);
        assert_eq!(get(What::Elf, Reason::Budget), before + 1);
        let named = format!("pid {me} (");
        let why = degraded();
        assert!(
            !why.iter()
                .any(|d| d.starts_with("elf budget") && d.contains(&named)),
            "{why:?}"
        );
    }

    #[test]
    fn the_process_refused_most_stays_named_behind_a_crowd() {
        let now = Instant::now();
        let mut payers = [None; PAYERS];
        for _ in 0..96 {
            note_payer(&mut payers, 7, now);
        }
        for pid in 100..200 {
            note_payer(&mut payers, pid, now);
        }
        let named: Vec<u32> = payers.iter().flatten().map(|p| p.pid).collect();
        assert!(named.contains(&7), "{named:?}");
        assert_eq!(named.len(), PAYERS);
        // A minute later the old ones are forgotten.
        let later = now + DEGRADED_FOR;
        note_payer(&mut payers, 300, later);
        let named: Vec<u32> = payers.iter().flatten().map(|p| p.pid).collect();
        assert_eq!(named, [300]);
    }
}
