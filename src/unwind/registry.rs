//! Which processes use which unwind tables, kept in the BPF maps.
//!
//! Tables are built once per file (device and inode), so one table serves
//! every process that maps it, and only for files without frame pointers
//! (a frame-pointer walk is cheaper and as good there). They share one row
//! array of fixed capacity (`--unwind-table-mb`): when a table does not fit,
//! the least recently used ones are evicted, and the processes that used
//! them fall back to frame pointers for those files.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt,
    path::PathBuf,
    time::{Duration, Instant},
};

use serde::Serialize;

use super::table::{load_bias_of, UnwindTable};
use crate::bpf::{
    abi::{UnwindMapping, UnwindProc, UnwindRow, UNWIND_MAX_MAPPINGS},
    UnwindMaps,
};
use crate::{
    symbolize::{
        maps::{Backing, ProcMaps},
        MAX_ELF_BYTES,
    },
    untrusted::{self, Expect, Last, OpenError, What},
};

/// A process's mappings are re-read this often while it runs (dlopen).
const REREAD_AFTER: Duration = Duration::from_secs(10);
/// An evicted table waits this long before it may be loaded again.
const EVICTED_COOLDOWN: Duration = Duration::from_secs(60);
/// No table may take more than this share of the row array: one huge
/// module (a compiler's shared library) would evict every other table.
const MAX_TABLE_SHARE: u32 = 4;

/// A process not seen for this long is dropped from the BPF map.
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// What the registry did, for `/healthz` and `/metrics`.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct UnwindStats {
    /// Tables built and loaded.
    pub tables_loaded: u64,
    /// Files that keep frame pointers (no table needed).
    pub tables_not_needed: u64,
    /// Files whose table could not be built (no `.eh_frame`, not x86-64...).
    pub tables_failed: u64,
    /// Tables evicted to make room.
    pub tables_evicted: u64,
    /// Tables larger than a quarter of the row array (not loaded).
    pub tables_too_big: u64,
    /// Rows of the array in use, and its capacity.
    pub rows_in_use: u64,
    pub rows_capacity: u64,
    /// Processes walked with tables.
    pub processes: u64,
    /// Mappings left out because a process had more than fit.
    pub mappings_dropped: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct FileKey {
    dev: u64,
    inode: u64,
}

enum FileTable {
    Loaded {
        /// Slots in the row array: the page index, then the rows.
        start: u32,
        len: u32,
        place: TablePlace,
        last_used: Instant,
    },
    NotNeeded,
    Failed,
    /// Evicted at this time: not loaded again before [`EVICTED_COOLDOWN`],
    /// so that tables competing for too little room do not thrash.
    Evicted(Instant),
}

struct ProcState {
    /// The executable, to notice an exec (new mappings, same pid).
    exe: Option<FileKey>,
    read: Instant,
    seen: Instant,
    files: Vec<FileKey>,
}

/// Keeps `unwind_procs` and `unwind_rows` up to date with the processes seen.
pub struct Registry {
    maps: UnwindMaps,
    files: HashMap<FileKey, FileTable>,
    /// `p_vaddr - p_offset` of the segment mapped at each (file, offset).
    deltas: HashMap<(FileKey, u64), i64>,
    procs: HashMap<u32, ProcState>,
    free: RowSpace,
    stats: UnwindStats,
    /// Registrations so far (each process entry carries its own).
    epoch: u32,
}

/// Where a loaded table is, as BPF needs it.
#[derive(Debug, Clone, Copy)]
struct TablePlace {
    index_start: u32,
    row_count: u32,
    page_base: u32,
    page_count: u32,
}

/// The page index of `rows` (sorted by pc): entry k is the number of the
/// last row with pc <= (base + k) * 4096 (0 if none), k in 0..=count.
fn page_index(rows: &[UnwindRow]) -> (u32, Vec<u32>) {
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return (0, Vec::new());
    };
    let base = first.pc >> 12;
    let count = (last.pc >> 12) - base + 1;
    let index = (0..=count)
        .map(|k| {
            let page_start = u64::from(base + k) << 12;
            let after = rows.partition_point(|r| u64::from(r.pc) <= page_start);
            after.saturating_sub(1) as u32
        })
        .collect();
    (base, index)
}

/// Free ranges of the row array: first fit, neighbours merged on release.
#[derive(Debug)]
struct RowSpace {
    /// (start, len), sorted by start.
    free: Vec<(u32, u32)>,
}

impl RowSpace {
    fn new(capacity: u32) -> RowSpace {
        RowSpace {
            free: vec![(0, capacity)],
        }
    }

    fn allocate(&mut self, len: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (start, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (start + len, l - len);
        }
        Some(start)
    }

    fn release(&mut self, start: u32, len: u32) {
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, len));
        // Merge neighbours.
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(self.free.len());
        for &(s, l) in &self.free {
            match merged.last_mut() {
                Some((ps, pl)) if *ps + *pl == s => *pl += l,
                _ => merged.push((s, l)),
            }
        }
        self.free = merged;
    }
}

/// An executable file mapping of a process.
struct ExecMapping {
    start: u64,
    end: u64,
    offset: u64,
    key: FileKey,
    path: PathBuf,
}

impl Registry {
    /// A registry writing to `maps`.
    pub fn new(maps: UnwindMaps) -> Registry {
        let capacity = maps.capacity;
        Registry {
            maps,
            files: HashMap::new(),
            deltas: HashMap::new(),
            procs: HashMap::new(),
            free: RowSpace::new(capacity),
            epoch: 0,
            stats: UnwindStats {
                rows_capacity: u64::from(capacity),
                ..UnwindStats::default()
            },
        }
    }

    /// What has been done so far.
    pub fn stats(&self) -> UnwindStats {
        self.stats.clone()
    }

    /// Registers the processes seen in a drain (new ones, and known ones
    /// whose mappings are due for a re-read), and forgets the gone ones.
    pub fn update(&mut self, pids: impl IntoIterator<Item = u32>) {
        let now = Instant::now();
        for pid in pids {
            if pid == 0 {
                continue;
            }
            // BPF drops a process's entry when it execs (even into the same
            // binary): one map lookup tells. A process without tables has no
            // entry to drop; its executable tells instead.
            let current = |p: &ProcState| {
                now - p.read < REREAD_AFTER
                    && if p.files.is_empty() {
                        p.exe == exe_of(pid)
                    } else {
                        self.maps.procs.get(&pid, 0).is_ok()
                    }
            };
            match self.procs.get(&pid) {
                Some(p) if current(p) => {
                    if let Some(p) = self.procs.get_mut(&pid) {
                        p.seen = now;
                    }
                }
                _ => self.register(pid, now),
            }
        }
        let gone: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| now - p.seen > FORGET_AFTER)
            .map(|(pid, _)| *pid)
            .collect();
        for pid in gone {
            self.procs.remove(&pid);
            let _ = self.maps.procs.remove(&pid);
        }
        self.stats.processes = self.procs.values().filter(|p| !p.files.is_empty()).count() as u64;
    }

    fn register(&mut self, pid: u32, now: Instant) {
        let Ok(mappings) = exec_mappings(pid) else {
            return;
        };
        self.epoch = self.epoch.wrapping_add(1);
        let mut entry = UnwindProc {
            epoch: self.epoch,
            ..UnwindProc::default()
        };
        let mut files = Vec::new();
        for m in &mappings {
            let Some(place) = self.table_for(pid, m, now) else {
                continue;
            };
            let Some(delta) = self.delta(pid, m) else {
                continue;
            };
            let i = entry.count as usize;
            if i == UNWIND_MAX_MAPPINGS {
                self.stats.mappings_dropped += 1;
                continue;
            }
            entry.mappings[i] = UnwindMapping {
                start: m.start,
                end: m.end,
                bias: m.start.wrapping_sub(m.offset).wrapping_sub(delta as u64),
                index_start: place.index_start,
                row_count: place.row_count,
                page_base: place.page_base,
                page_count: place.page_count,
            };
            entry.count += 1;
            files.push(m.key);
        }
        if entry.count > 0 {
            if let Err(err) = self.maps.procs.insert(pid, entry, 0) {
                tracing::debug!(pid, "registering unwind tables: {err}");
            }
        } else {
            let _ = self.maps.procs.remove(&pid);
        }
        self.procs.insert(
            pid,
            ProcState {
                exe: exe_of(pid),
                read: now,
                seen: now,
                files,
            },
        );
    }

    /// The rows of the file behind `m`, building and loading them first if
    /// needed; `None` for files that need no table or have none.
    fn table_for(&mut self, pid: u32, m: &ExecMapping, now: Instant) -> Option<TablePlace> {
        match self.files.get_mut(&m.key) {
            Some(FileTable::Loaded {
                place, last_used, ..
            }) => {
                *last_used = now;
                return Some(*place);
            }
            Some(FileTable::Evicted(at)) if now - *at >= EVICTED_COOLDOWN => {}
            Some(_) => return None,
            None => {}
        }
        // A process that exits while its mappings are read leaves nothing
        // to open: that says nothing of the file, which another process
        // may map (glibc, libjvm), so it is not marked failed.
        let file = match open_mapped(pid, m) {
            Ok(file) => Some(file),
            Err(OpenError::Io(err)) => {
                tracing::debug!(pid, file = %m.path.display(), "unwind: {err}");
                return None;
            }
            Err(refused) => {
                tracing::debug!(pid, "unwind: {refused}");
                None
            }
        };
        let table = file.and_then(|file| {
            let delta = load_bias_of(&file, m.start, m.offset)
                .ok()
                .map(|bias| m.start.wrapping_sub(m.offset).wrapping_sub(bias) as i64);
            if let Some(delta) = delta {
                self.deltas.insert((m.key, m.offset), delta);
            }
            UnwindTable::from_file(&file)
                .map_err(|err| tracing::debug!(file = %m.path.display(), "no unwind table: {err}"))
                .ok()
        });
        if let Some(t) = &table {
            tracing::debug!(
                pid,
                file = %m.path.display(),
                rows = t.rows.len(),
                frame_pointer_share = t.frame_pointer_share,
                "unwind table"
            );
        }
        let state = match table {
            None => {
                self.stats.tables_failed += 1;
                FileTable::Failed
            }
            Some(t) if t.uses_frame_pointers() || t.rows.is_empty() => {
                self.stats.tables_not_needed += 1;
                FileTable::NotNeeded
            }
            Some(t) => match self.load(&t, now) {
                Some(state) => state,
                None => FileTable::Failed,
            },
        };
        let loaded = match &state {
            FileTable::Loaded { place, .. } => Some(*place),
            _ => None,
        };
        self.files.insert(m.key, state);
        loaded
    }

    /// Copies a table's rows into the array, evicting the least recently
    /// used tables while it does not fit.
    fn load(&mut self, table: &UnwindTable, now: Instant) -> Option<FileTable> {
        let (page_base, index) = page_index(&table.rows);
        let index_rows = index.iter().map(|&n| UnwindRow {
            pc: n,
            ..UnwindRow::default()
        });
        let slots: Vec<UnwindRow> = index_rows.chain(table.rows.iter().copied()).collect();
        let len = u32::try_from(slots.len()).ok()?;
        if len > self.maps.capacity / MAX_TABLE_SHARE {
            self.stats.tables_too_big += 1;
            return None;
        }
        let start = loop {
            if let Some(start) = self.free.allocate(len) {
                break start;
            }
            if !self.evict_oldest() {
                return None;
            }
        };
        for (i, slot) in slots.iter().enumerate() {
            if let Err(err) = self.maps.rows.set(start + i as u32, slot, 0) {
                tracing::warn!("writing unwind rows: {err}");
                self.free.release(start, len);
                return None;
            }
        }
        self.stats.tables_loaded += 1;
        self.stats.rows_in_use += u64::from(len);
        Some(FileTable::Loaded {
            start,
            len,
            place: TablePlace {
                index_start: start,
                row_count: table.rows.len() as u32,
                page_base,
                page_count: (index.len() as u32).saturating_sub(1),
            },
            last_used: now,
        })
    }

    /// Evicts the least recently used table; the processes using it are
    /// re-registered without it. False when nothing is left to evict.
    fn evict_oldest(&mut self) -> bool {
        let oldest = self
            .files
            .iter()
            .filter_map(|(k, t)| match t {
                FileTable::Loaded { last_used, .. } => Some((*last_used, *k)),
                _ => None,
            })
            .min();
        let Some((_, key)) = oldest else {
            return false;
        };
        if let Some(FileTable::Loaded { start, len, .. }) = self.files.remove(&key) {
            self.free.release(start, len);
            self.stats.rows_in_use -= u64::from(len);
            self.stats.tables_evicted += 1;
        }
        self.files.insert(key, FileTable::Evicted(Instant::now()));
        // Stale entries would point at rows that now hold another table.
        let users: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| p.files.contains(&key))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in users {
            let _ = self.maps.procs.remove(&pid);
            if let Some(p) = self.procs.get_mut(&pid) {
                p.files.clear();
                // Re-read at the next update.
                p.read = Instant::now() - REREAD_AFTER;
            }
        }
        true
    }

    fn delta(&mut self, pid: u32, m: &ExecMapping) -> Option<i64> {
        if let Some(d) = self.deltas.get(&(m.key, m.offset)) {
            return Some(*d);
        }
        let file = open_mapped(pid, m).ok()?;
        let bias = load_bias_of(&file, m.start, m.offset).ok()?;
        let delta = m.start.wrapping_sub(m.offset).wrapping_sub(bias) as i64;
        self.deltas.insert((m.key, m.offset), delta);
        Some(delta)
    }
}

/// The file behind a mapping, opened through `/proc/PID/map_files`, which
/// reaches it whatever mount namespace or deleted state it is in, and
/// checked (regular, the mapped file, at most [`MAX_ELF_BYTES`]). Only its
/// headers and `.eh_frame` are read from it, never the whole file.
fn open_mapped(pid: u32, m: &ExecMapping) -> Result<fs::File, OpenError> {
    let path = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    let expect = Expect {
        owner: None,
        max_bytes: MAX_ELF_BYTES,
        identity: Some((m.key.dev, m.key.inode)),
    };
    untrusted::open_path(&path, Last::MagicLink, What::Elf, &expect).map(|c| c.file)
}

/// The file `pid` executes.
fn exe_of(pid: u32) -> Option<FileKey> {
    let meta = fs::metadata(format!("/proc/{pid}/exe")).ok()?;
    Some(FileKey {
        dev: meta.dev(),
        inode: meta.ino(),
    })
}

/// Executable file mappings of `pid`, from the symbolizer's parser.
fn exec_mappings(pid: u32) -> std::io::Result<Vec<ExecMapping>> {
    let maps = ProcMaps::read(pid)?;
    Ok(maps
        .iter()
        .filter_map(|m| match &m.backing {
            Backing::File { path, dev, inode } => Some(ExecMapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                key: FileKey {
                    dev: *dev,
                    inode: *inode,
                },
                path: path.clone(),
            }),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_index_brackets_each_page_rows() {
        let row = |pc| UnwindRow {
            pc,
            ..UnwindRow::default()
        };
        let rows = [row(0x1010), row(0x1800), row(0x3004), row(0x3100)];
        let (base, index) = page_index(&rows);
        assert_eq!(base, 1);
        // Pages 1, 2, 3 and the end of page 3.
        assert_eq!(index, vec![0, 1, 1, 3]);
        // Every address's row lies in [index[k], index[k + 1]].
        for addr in [0x1010u32, 0x1fff, 0x2500, 0x3004, 0x3050, 0x3fff] {
            let k = ((addr >> 12) - base) as usize;
            let want = rows.partition_point(|r| r.pc <= addr) - 1;
            assert!(
                index[k] as usize <= want && want <= index[k + 1] as usize,
                "{addr:#x}"
            );
        }
    }

    #[test]
    fn row_space_reuses_released_ranges_and_merges_them() {
        let mut space = RowSpace::new(100);
        assert_eq!(space.allocate(40), Some(0));
        assert_eq!(space.allocate(40), Some(40));
        assert_eq!(space.allocate(30), None, "20 rows left");
        space.release(0, 40);
        assert_eq!(space.allocate(30), Some(0), "first fit");
        space.release(0, 30);
        space.release(40, 40);
        assert_eq!(space.free, vec![(0, 100)], "merged back into one range");
        assert_eq!(space.allocate(100), Some(0));
        assert_eq!(space.allocate(1), None);
    }

    #[test]
    fn exec_mappings_reach_their_files_by_device_and_inode() {
        // Our own libc: the device and inode from /proc/PID/maps are what
        // stat says of the file behind the mapping.
        let maps = exec_mappings(std::process::id()).unwrap();
        let libc = maps
            .iter()
            .find(|m| m.path.to_string_lossy().contains("libc.so"))
            .expect("libc mapped");
        let file = open_mapped(std::process::id(), libc);
        assert!(file.is_ok(), "device and inode match the file");
    }
}
