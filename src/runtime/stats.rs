//! What the runtimes' walk halves did, for `/healthz`
//! (`pipeline.unwind`): one field per runtime that reports.

use serde::Serialize;

/// The runtimes' walk figures, flattened into the unwind registry's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RuntimeStats {
    /// Python interpreters and threads registered for the walk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonStats>,
}

/// Python interpreters the walk reads (`/healthz` `pipeline.unwind.python`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PythonStats {
    /// Processes whose interpreter the walk reads.
    pub interpreters: u64,
    /// Threads in `python_threads`.
    pub threads: u64,
    /// Interpreters that could not be read (each attempt).
    pub refused: u64,
    /// Threads left out: `python_threads` full, or past the thread bound
    /// or their user's share of the map (`python::shares`), at each scan.
    pub threads_left_out: u64,
    /// Entries taken back from users above their share, for a user within
    /// theirs.
    pub threads_taken_back: u64,
}
