//! What the registry reports in `/healthz` (`pipeline.unwind`): counters,
//! and which processes walk without which table, and why.

use crate::runtime::RuntimeStats;
use serde::Serialize;

pub use super::accounts::{PartialProcess, UserTables};

/// Processes listed in [`UnwindStats::missing`].
pub const MISSING_PROCESSES: usize = 20;
/// Files listed per process there.
pub const MISSING_FILES: usize = 8;

/// What the registry did, for `/healthz` and `/metrics`.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct UnwindStats {
    /// Tables built and loaded.
    pub tables_loaded: u64,
    /// Files that keep frame pointers (no table needed).
    pub tables_not_needed: u64,
    /// Files whose table could not be built (no `.eh_frame`, not x86-64...).
    pub tables_failed: u64,
    /// Tables evicted to make room for one more processes use.
    pub tables_evicted: u64,
    /// Tables not loaded because the array was full of tables that more
    /// processes (or as many, more lately) use.
    pub tables_no_room: u64,
    /// Tables larger than a quarter of the row array (not loaded).
    pub tables_too_big: u64,
    /// Tables some process of another user still mapped, evicted for a
    /// user's table while each of their users was over its share of the
    /// array (see `unwind::fair`).
    pub tables_taken_back: u64,
    /// Files waiting for their table to be built (most shared first).
    pub tables_pending: u64,
    /// Rows of the array in use, and its capacity.
    pub rows_in_use: u64,
    pub rows_capacity: u64,
    /// Processes walked with tables.
    pub processes: u64,
    /// Processes seen but not registered yet (first come, first served,
    /// ahead of any table build or re-read).
    pub processes_pending: u64,
    /// Registered processes some of whose tables are not built yet: BPF
    /// checks their stacks' innermost frame and ends a walk it cannot
    /// vouch for with a `[tables pending]` frame (`unwind_tables_pending`).
    pub processes_tables_pending: u64,
    /// New processes not registered because as many as `unwind_procs`
    /// holds (8192) already were and their user held its share of it
    /// (each attempt).
    pub processes_over_limit: u64,
    /// Registered processes dropped (the least recently active of a user
    /// above its share of `unwind_procs`) for a new process of a user
    /// within theirs.
    pub procs_taken_back: u64,
    /// Entries of `unwind_procs` deleted because no registered process
    /// owned them and their process had ended (copies BPF made at fork
    /// for children that ended before they were registered).
    pub procs_stale_removed: u64,
    /// Mappings left out because a process had more than fit (counted at
    /// each registration; the most shared are kept).
    pub mappings_dropped: u64,
    /// Time the last and the longest update took (a budget bounds each).
    pub last_update_us: u64,
    pub max_update_us: u64,
    /// Processes that walk some of their files without a table.
    pub processes_missing_tables: u64,
    /// Up to [`MISSING_PROCESSES`] of them, the ones seen last first (see
    /// `top_missing`).
    pub missing: Vec<ProcessMissing>,
    /// Processes walking some file without its table because the table was
    /// evicted or found no room: their stacks stop early there.
    pub processes_partial: u64,
    /// Up to 20 of them, those that lost the most tables first.
    pub partial: Vec<PartialProcess>,
    /// By user: rows charged and share, evictions caused (charged to the
    /// user whose table needed the room) and suffered, processes with
    /// partial stacks; the users charged the most rows first.
    pub users: Vec<UserTables>,
    /// What the runtimes' walk halves did (`python`, ...).
    #[serde(flatten)]
    pub runtimes: RuntimeStats,
}

/// A process walking some of its files without their table.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProcessMissing {
    pub pid: u32,
    /// Its `comm`.
    pub name: String,
    /// Up to [`MISSING_FILES`] files.
    pub files: Vec<MissingFile>,
    /// Files left out of `files`.
    pub more_files: usize,
}

/// A file a process walks without its table.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct MissingFile {
    pub path: String,
    pub reason: Missing,
}

/// Why a process walks one of its files without its table (with frame
/// pointers, which stop at the first function that keeps none).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Missing {
    /// Not built yet: tables are built most shared first, within a time
    /// budget per update.
    Pending,
    /// Evicted to make room for a table more processes use.
    Evicted,
    /// The array is full of tables more processes use.
    NoRoom,
    /// Larger than a quarter of the array.
    TooBig,
    /// Could not be built or read (no `.eh_frame`, refused file...).
    Failed,
    /// The process has more files with tables than its BPF entry holds
    /// (`UNWIND_MAX_MAPPINGS`); the most shared ones are kept.
    TooManyMappings,
}

/// A process lacking tables, before the report is cut to its top.
pub(super) struct Lacking {
    pub seen: std::time::Instant,
    pub pid: u32,
    pub files: Vec<(crate::process::files::FileKey, Missing)>,
}

/// The [`MISSING_PROCESSES`] processes to list: the ones seen last, then
/// those lacking the most tables, then the newest (highest pid): the
/// process one just started is the one whose short stacks need explaining.
pub(super) fn top_missing(
    mut all: Vec<Lacking>,
    name: impl Fn(u32) -> String,
    path: impl Fn(&crate::process::files::FileKey) -> String,
) -> Vec<ProcessMissing> {
    all.sort_by_key(|l| std::cmp::Reverse((l.seen, l.files.len(), l.pid)));
    all.into_iter()
        .take(MISSING_PROCESSES)
        .map(|l| ProcessMissing {
            pid: l.pid,
            name: name(l.pid),
            more_files: l.files.len().saturating_sub(MISSING_FILES),
            files: l
                .files
                .iter()
                .take(MISSING_FILES)
                .map(|(k, reason)| MissingFile {
                    path: path(k),
                    reason: *reason,
                })
                .collect(),
        })
        .collect()
}
