//! What the registry knows of each process: its mappings, what its BPF
//! entry holds, and which of its files it walks without a table.

use std::{cmp::Reverse, collections::HashMap, sync::Arc, time::Instant};

use super::{
    files::{FileEntry, TablePlace, TableState},
    stats::{Lacking, Missing},
};
use crate::bpf::abi::{UnwindMapping, UNWIND_MAX_MAPPINGS};
use crate::process::{
    files::{ExecMapping, FileKey},
    maps::ProcMaps,
    ProcKey,
};
use crate::runtime::WalkEntry;

pub(super) struct ProcState {
    /// The process, as the table knows it.
    pub key: ProcKey,
    /// Its effective uid when registered: whose share of the row array
    /// tables only its user's processes map take.
    pub uid: u32,
    /// The table's maps it was registered with: when the table reads them
    /// again (a library loaded since), it is registered again.
    pub maps: Arc<ProcMaps>,
    pub name: String,
    pub seen: Instant,
    /// Executable file mappings, from `maps`.
    pub mappings: Vec<ExecMapping>,
    /// What its BPF entry holds: the file of each mapping.
    pub written: Vec<(FileKey, UnwindMapping)>,
    /// Loaded tables left out of the entry (too many mappings).
    pub left_out: Vec<FileKey>,
    /// The runtimes' part of its entry (a JVM's code, a Python
    /// interpreter's layout...), as last read and as written; `None` when
    /// no runtime wrote any.
    pub runtime: Option<WalkEntry>,
    pub written_runtime: Option<WalkEntry>,
    /// Tables in its entry evicted since its program started.
    pub tables_evicted: u32,
    /// Whether its entry says that some of its tables are pending (BPF
    /// then checks the walk's innermost frame and marks where it ends).
    pub written_pending: bool,
}

impl ProcState {
    /// Whether the process has a BPF entry.
    pub fn has_entry(&self) -> bool {
        !self.written.is_empty() || self.written_runtime.is_some() || self.written_pending
    }

    /// Whether some of its files' tables are not built yet.
    pub fn tables_pending(&self, files: &HashMap<FileKey, FileEntry>) -> bool {
        self.mappings.iter().any(|m| {
            files
                .get(&m.key)
                .is_some_and(|f| matches!(f.state, TableState::Pending))
        })
    }
}

/// Each file once.
pub(super) fn unique_keys(mappings: &[ExecMapping]) -> Vec<FileKey> {
    let mut keys: Vec<FileKey> = mappings.iter().map(|m| m.key).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// A mapping with a loaded table, ready for the entry.
pub(super) struct Candidate {
    pub users: u32,
    pub rows: u32,
    pub key: FileKey,
    pub mapping: UnwindMapping,
}

impl Candidate {
    pub fn new(users: u32, key: FileKey, m: &ExecMapping, delta: i64, place: TablePlace) -> Self {
        Candidate {
            users,
            rows: place.row_count,
            key,
            mapping: UnwindMapping {
                start: m.start,
                end: m.end,
                bias: m.start.wrapping_sub(m.offset).wrapping_sub(delta as u64),
                index_start: place.index_start,
                row_count: place.row_count,
                page_base: place.page_base,
                page_count: place.page_count,
            },
        }
    }
}

/// The mappings an entry holds, by address, and the files left out: with
/// more than [`UNWIND_MAX_MAPPINGS`], the most shared files (then the
/// largest) are kept, libc over a small plugin, whatever their addresses.
pub(super) fn choose(
    mut candidates: Vec<Candidate>,
) -> (Vec<(FileKey, UnwindMapping)>, Vec<FileKey>) {
    candidates.sort_by_key(|c| Reverse((c.users, c.rows)));
    let kept = candidates.len().min(UNWIND_MAX_MAPPINGS);
    let left_out = candidates.drain(kept..).map(|c| c.key).collect();
    candidates.sort_by_key(|c| c.mapping.start);
    let entry = candidates.into_iter().map(|c| (c.key, c.mapping)).collect();
    (entry, left_out)
}

impl ProcState {
    /// The files it walks without a table, and why.
    pub fn lacking(&self, pid: u32, files: &HashMap<FileKey, FileEntry>) -> Option<Lacking> {
        let lacking: Vec<(FileKey, Missing)> = unique_keys(&self.mappings)
            .into_iter()
            .filter_map(|k| {
                let f = files.get(&k)?;
                let why = match f.missing() {
                    Some(why) => why,
                    None if !matches!(f.state, TableState::Loaded { .. }) => return None,
                    None if self.written.iter().any(|(w, _)| *w == k) => return None,
                    None if self.left_out.contains(&k) => Missing::TooManyMappings,
                    // Loaded, but this process's mapping was unreadable.
                    None => Missing::Failed,
                };
                Some((k, why))
            })
            .collect();
        (!lacking.is_empty()).then_some(Lacking {
            seen: self.seen,
            pid,
            files: lacking,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_shared_files_are_kept_when_too_many() {
        let place = |rows| TablePlace {
            index_start: 0,
            row_count: rows,
            page_base: 0,
            page_count: 0,
        };
        let key = |inode| FileKey { dev: 1, inode };
        // Libraries at descending addresses, libc (300 users) last.
        let n = UNWIND_MAX_MAPPINGS as u64 + 3;
        let candidates = (0..n)
            .map(|i| {
                let m = ExecMapping {
                    start: 0x7000_0000 - i * 0x1000,
                    end: 0x7000_0000 - i * 0x1000 + 0x1000,
                    offset: 0,
                    key: key(i),
                    path: "lib".into(),
                };
                let users = if i == n - 1 { 300 } else { 1 };
                Candidate::new(users, key(i), &m, 0, place(10 + i as u32))
            })
            .collect();
        let (entry, left_out) = choose(candidates);
        assert_eq!(entry.len(), UNWIND_MAX_MAPPINGS);
        assert!(entry.iter().any(|(k, _)| *k == key(n - 1)), "libc kept");
        // Then the largest: the three smallest single-user ones go.
        assert_eq!(left_out.len(), 3);
        assert!(left_out.iter().all(|k| k.inode < 3), "{left_out:?}");
        assert!(entry.windows(2).all(|w| w[0].1.start < w[1].1.start));
    }
}
