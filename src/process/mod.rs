//! The daemon's one table of processes, kept current by the kernel's
//! lifecycle events (fork, exec, exit, rename) rather than by polling
//! `/proc`, and the one place that parses a process's `/proc` files.
//!
//! A process is identified by its pid and start time; what it runs between
//! two execs is an [`Image`] (name, executable mappings, whether it is a
//! JVM). Images are snapshotted while the process lives — shortly after
//! exec, once the dynamic loader has mapped the libraries — and kept for a
//! while after it exits or execs again, so samples drained later still
//! symbolize with the maps and name they were taken under. A reused pid
//! gets a new entry and never the previous process's image.
//!
//! The host layer: every `/proc` path of the daemon is in this module (files
//! other users control are opened through [`crate::untrusted`]). Stages that
//! keep state per process subscribe to the table's [changes](Subscription)
//! instead of reading `/proc` themselves.

pub mod cgroups;
mod changes;
pub mod container;
pub mod files;
pub mod locks;
pub mod mapped;
pub mod maps;
pub mod own;
mod reader;
pub mod remote;
pub mod status;
mod table;
pub mod tasks;

pub use changes::{Change, ChangeKind, Due, ProcKey, Subscription};
pub use reader::spawn_reader;
pub use table::{Image, ProcessTable, TableStats, KEEP_ENDED, MAX_IMAGES};
