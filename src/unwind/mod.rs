//! Stack unwinding through code without frame pointers: compact tables
//! built from `.eh_frame` ([`table`]) and kept in BPF maps for the
//! processes that need them ([`registry`], which reports in [`stats`]);
//! `bpf/unwind.bpf.h` walks them.

mod accounts;
mod batch;
mod elf;
mod fair;
mod files;
mod held;
mod procs;
pub mod registry;
pub mod sizing;
mod space;
pub mod stats;
pub mod table;

pub use held::entries_bound as registry_bytes_bound;
