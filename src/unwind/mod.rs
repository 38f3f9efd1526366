//! Stack unwinding through code without frame pointers: compact tables
//! built from `.eh_frame` ([`table`]) and kept in BPF maps for the
//! processes that need them ([`registry`]); `bpf/unwind.bpf.h` walks them.

mod elf;
pub mod registry;
pub mod table;
