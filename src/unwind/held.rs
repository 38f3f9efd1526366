//! What the registry holds in user space, for [`crate::held`]: the rows of
//! a table live in the BPF row array once loaded, and the registry keeps
//! only what re-registers it (the file's identity and its place in the
//! array, [`super::files::TableState`]); a table evicted or left out is
//! built again from its file when it may come back. So the registry holds
//! its file and process entries, and a table only while it is built.

use crate::budget::{self, Part};
use crate::held::{set, Holder};

use super::registry::{MAX_IDLE_FILES, MAX_PROCS};
use super::{files::FileEntry, procs::ProcState};
use crate::bpf::abi::{UnwindRow, UNWIND_MAX_MAPPINGS};
use crate::process::files::ExecMapping;

/// Bytes a table build may hold per row it may yield: `.eh_frame` read
/// (refused past 12 bytes a row), the FDEs' rows (refused past 1.5 times
/// the rows), the merged rows and the array slots.
pub(super) const BUILD_BYTES_PER_ROW: usize = 12 + 18 + 12 + 12;
const _: () = assert!(std::mem::size_of::<UnwindRow>() == 12);

/// Bytes of one process entry, at most (its mappings, its written entry).
const fn proc_bytes() -> usize {
    std::mem::size_of::<ProcState>()
        + 64
        + UNWIND_MAX_MAPPINGS * (std::mem::size_of::<ExecMapping>() + 64)
}

/// Bytes of one file entry with its path.
const fn file_bytes() -> usize {
    std::mem::size_of::<FileEntry>() + 128
}

/// Bytes the registry's entries hold at most: [`MAX_PROCS`] processes,
/// the files they map plus [`MAX_IDLE_FILES`] idle ones. Fixed by the BPF
/// maps' sizes, so taken off the memory budget before it is split (the
/// base of its `unwind_tables` part).
pub const fn entries_bound() -> usize {
    MAX_PROCS * proc_bytes() + (MAX_PROCS * UNWIND_MAX_MAPPINGS + MAX_IDLE_FILES) * file_bytes()
}

const _: () = assert!(entries_bound() as u64 <= budget::UNWIND_REGISTRY_BYTES);

/// Rows one table build may yield: at most `share_rows` (its share of the
/// row array), and what the budget's `unwind_tables` part leaves after the
/// entries.
pub(super) fn max_build_rows(share_rows: usize) -> usize {
    let part = budget::bytes(Part::UnwindTables);
    share_rows.min(part.saturating_sub(entries_bound()) / BUILD_BYTES_PER_ROW)
}

/// Publishes what `files` and `procs` entries hold, at most, and the
/// bound: [`entries_bound`] and one build of at most `max_rows` rows.
pub(super) fn publish(files: usize, procs: usize, max_rows: usize) {
    let bytes = files * file_bytes() + procs * proc_bytes();
    let bound = entries_bound() + max_rows * BUILD_BYTES_PER_ROW;
    set(Holder::UnwindTables, bytes as u64, Some(bound as u64));
}
