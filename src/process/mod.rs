//! The daemon's one table of processes, kept current by the kernel's
//! lifecycle events (fork, exec, exit, rename) rather than by polling
//! `/proc`, and the one place that parses a process's `/proc` files.
//!
//! A process is identified by its pid and start time; what it runs between
//! two execs is an [`Image`] (name, executable mappings, whether it is a
//! JVM, container and cgroups, and its [`Facts`]: user, namespace pid,
//! kernel thread, executable, identity, a JVM's command line). Images are snapshotted while the process lives — shortly after
//! exec, once the dynamic loader has mapped the libraries — and kept for a
//! while after it exits or execs again, so samples drained later still
//! symbolize with the maps and name they were taken under. A reused pid
//! gets a new entry and never the previous process's image.
//!
//! The host layer: every `/proc` path of the daemon is in this module (files
//! other users control are opened through [`crate::untrusted`]). Stages ask
//! the table for a process's [`Facts`] and subscribe to its
//! [changes](Subscription) instead of reading `/proc` themselves; the few
//! deliberate re-checks before acting on a process are in [`live`].

pub mod cgroups;
mod changes;
pub mod container;
pub mod cpu_cgroup;
mod facts;
pub mod files;
pub mod identity;
pub mod live;
pub mod locks;
pub mod mapped;
pub mod maps;
pub mod own;
mod reader;
pub mod remote;
mod status;
mod table;
mod tasks;

pub use changes::{Change, ChangeKind, Due, ProcKey, Subscription};
pub use facts::{Facts, MAX_CMDLINE};
pub use reader::{spawn_reader, ProcEvents};
pub use table::{image::Image, ProcessTable, TableStats, KEEP_ENDED, MAX_IMAGES};
