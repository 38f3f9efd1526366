//! Counts of what the daemon refused to open, read or talk to, by what it
//! was and why: reported in `/healthz` (`refused`) and `/metrics`
//! (`wallscope_refused_total{what,reason}`). Process-wide atomics: every
//! stage (symbolizer, unwind registry, JVM agent) refuses on its own thread.

use std::sync::atomic::{AtomicU64, Ordering};

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
}

impl What {
    /// Every kind, in report order.
    pub const ALL: [What; 4] = [
        What::PerfMap,
        What::Elf,
        What::AttachTrigger,
        What::AttachSocket,
    ];

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            What::PerfMap => "perf_map",
            What::Elf => "elf",
            What::AttachTrigger => "attach_trigger",
            What::AttachSocket => "attach_socket",
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
}

impl Reason {
    /// Every reason, in report order.
    pub const ALL: [Reason; 12] = [
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
}
