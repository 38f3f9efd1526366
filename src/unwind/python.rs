//! What the registry needs of Python interpreters, handed in (as the
//! JVM's code is, [`super::registry::JavaCodeOf`]) so that the unwind
//! layer does not depend on the readers of CPython's structures
//! (`crate::python::registry` implements it).

use std::{collections::HashSet, time::Instant};

pub use super::stats::PythonStats;
use crate::{
    bpf::abi::UnwindPython,
    process::{files::ExecMapping, ProcKey},
};

/// The Python side of the unwind registry: interpreters found when a
/// process is registered, and their threads kept in `python_threads`.
pub trait PythonSide: Send {
    /// The walk layout of `pid`'s interpreter, if it runs one that can be
    /// read (registering it and its threads, their reads paid by `uid`,
    /// the user the process table says it runs as).
    fn register(
        &mut self,
        pid: u32,
        key: ProcKey,
        uid: u32,
        mappings: &[ExecMapping],
        now: Instant,
    ) -> Option<UnwindPython>;
    /// Whether `pid`'s interpreter is due to be tried again.
    fn retry_due(&self, pid: u32, now: Instant) -> bool;
    /// Reads the threads of the Python processes among `pids` again, until
    /// `deadline`; returns the processes that gained threads (walks made
    /// before lack their Python frames: see [`super::registry::Registry`]).
    fn scan(&mut self, pids: &HashSet<u32>, now: Instant, deadline: Instant) -> Vec<u32>;
    /// Forgets process `pid`: it ended.
    fn ended(&mut self, pid: u32);
    /// What it did so far.
    fn stats(&self) -> PythonStats;
}
