//! The deliberate live re-checks of a process, made right before the
//! daemon acts on it rather than reports on it: before it attaches to a
//! JVM or reads its memory (is it still the process it prepared for?),
//! before it opens a file as the process's owner (a perf map), before it
//! trusts a caller's credentials, while it waits for a process to end.
//! The table's [facts](super::Facts) may be a moment old; these are read
//! from `/proc` at the call. Every other question goes to the table
//! (`tests/e2e/architecture.rs` admits this module's readers only here
//! and in `src/process/`).

use std::io;

use super::{
    files::{self, ExecMapping},
    maps::{self, ProcMaps, Region},
};

pub use super::status::{sole_uid, start_ticks, start_time, Status};
pub use super::tasks::{exists, host_tids_by_ns_tid};

/// `pid`'s mappings now (the table's may be a moment old).
pub fn maps(pid: u32) -> io::Result<ProcMaps> {
    ProcMaps::read(pid)
}

/// `pid`'s executable file mappings now.
pub fn exec_mappings(pid: u32) -> io::Result<Vec<ExecMapping>> {
    files::exec_mappings(pid)
}

/// Every mapping of `pid` now (not only executable ones), by address.
pub fn regions(pid: u32) -> io::Result<Vec<Region>> {
    maps::regions(pid)
}

/// The mappings of `pid` now whose name starts with one of `names`.
pub fn regions_named(pid: u32, names: &[&str]) -> io::Result<Vec<Region>> {
    maps::regions_named(pid, names)
}
