//! What the symbolizer remembers about processes and the files they map,
//! captured while they are alive so that exited processes still symbolize.

use rustc_hash::FxHashMap as HashMap;
use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::maps::{Backing, Mapping, ProcMaps};

/// Batches after which a process that sent nothing is forgotten.
const FORGET_AFTER_BATCHES: u64 = 120;
/// Batches between two re-reads of a process's maps after a miss.
const REFRESH_EVERY_BATCHES: u64 = 10;

/// A mapped file, by device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u64,
    pub inode: u64,
}

/// Where an address points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    File { file: FileKey, offset: u64 },
    Vdso,
    Anon,
}

struct ProcEntry {
    name: Option<String>,
    /// A HotSpot JVM ([`crate::jvm::is_hotspot`]).
    jvm: bool,
    maps: ProcMaps,
    last_seen: u64,
    refreshed: u64,
}

struct FileEntry {
    /// A path that opens this very file from our mount namespace.
    open_path: PathBuf,
    /// Base name, for `module+0xOFF` frames.
    display: String,
}

/// Per-process maps and names, and the table of mapped files.
#[derive(Default)]
pub struct Procs {
    procs: HashMap<u32, ProcEntry>,
    files: HashMap<FileKey, FileEntry>,
    batch: u64,
}

impl Procs {
    /// Starts a new batch: maps may be re-read once per process per batch.
    pub fn begin_batch(&mut self) {
        self.batch += 1;
    }

    /// Forgets processes not seen for a while.
    pub fn end_batch(&mut self) {
        let batch = self.batch;
        self.procs
            .retain(|_, p| batch - p.last_seen < FORGET_AFTER_BATCHES);
    }

    /// The process's name (`/proc/PID/comm`), if it was alive when first seen.
    pub fn name(&self, pid: u32) -> Option<&str> {
        self.procs.get(&pid)?.name.as_deref()
    }

    /// Whether `pid` is a HotSpot JVM, as far as its maps tell.
    pub fn is_jvm(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.jvm)
    }

    /// Path to open a mapped file with.
    pub fn open_path(&self, file: FileKey) -> Option<&Path> {
        Some(&self.files.get(&file)?.open_path)
    }

    /// Short name of a mapped file.
    pub fn display_name(&self, file: FileKey) -> Option<&str> {
        Some(&self.files.get(&file)?.display)
    }

    /// Locates `addr` in `pid`'s executable mappings, re-reading them once
    /// per batch on a miss (the process may have loaded a library).
    pub fn find(&mut self, pid: u32, addr: u64) -> Option<Found> {
        let batch = self.batch;
        let entry = match self.procs.get_mut(&pid) {
            Some(e) => e,
            None => {
                let name = fs::read_to_string(format!("/proc/{pid}/comm"))
                    .ok()
                    .map(|s| s.trim_end().to_string());
                let maps = ProcMaps::read(pid).unwrap_or_default();
                register_files(&mut self.files, pid, &maps);
                self.procs.entry(pid).or_insert(ProcEntry {
                    name,
                    jvm: crate::jvm::is_hotspot(&maps),
                    maps,
                    last_seen: batch,
                    refreshed: batch,
                })
            }
        };
        entry.last_seen = batch;
        // Frame-pointer walks through code without frame pointers yield
        // junk addresses that never resolve: re-read at most every few
        // batches, not on every miss.
        if entry.maps.find(addr).is_none() && batch - entry.refreshed >= REFRESH_EVERY_BATCHES {
            entry.refreshed = batch;
            if let Ok(maps) = ProcMaps::read(pid) {
                register_files(&mut self.files, pid, &maps);
                entry.jvm = crate::jvm::is_hotspot(&maps);
                entry.maps = maps;
            }
        }
        let mapping = self.procs.get(&pid)?.maps.find(addr)?;
        Some(self.classify(mapping, addr))
    }

    fn classify(&self, mapping: &Mapping, addr: u64) -> Found {
        match &mapping.backing {
            Backing::File { dev, inode, .. } => {
                let file = FileKey {
                    dev: *dev,
                    inode: *inode,
                };
                if self.files.contains_key(&file) {
                    Found::File {
                        file,
                        offset: mapping.file_offset(addr),
                    }
                } else {
                    Found::Anon
                }
            }
            Backing::Vdso => Found::Vdso,
            Backing::Anon { .. } => Found::Anon,
        }
    }
}

/// Records how to open each file of `maps` that is not known yet.
fn register_files(files: &mut HashMap<FileKey, FileEntry>, pid: u32, maps: &ProcMaps) {
    for m in maps.iter() {
        let Backing::File { path, dev, inode } = &m.backing else {
            continue;
        };
        let key = FileKey {
            dev: *dev,
            inode: *inode,
        };
        if files.contains_key(&key) {
            continue;
        }
        if let Some(open_path) = openable_path(pid, m, path, key) {
            let display = path
                .file_name()
                .map(|n| {
                    n.to_string_lossy()
                        .trim_end_matches(" (deleted)")
                        .to_string()
                })
                .unwrap_or_else(|| path.display().to_string());
            files.insert(key, FileEntry { open_path, display });
        }
    }
}

/// A path from our mount namespace that reaches the very file mapped:
/// the path itself for host processes, through `/proc/PID/root` for
/// containers, through `/proc/PID/map_files` for deleted files.
fn openable_path(pid: u32, m: &Mapping, path: &Path, key: FileKey) -> Option<PathBuf> {
    let same_file = |p: &Path| {
        // symlink_metadata: a path that is a link now is not the mapped file.
        fs::symlink_metadata(p)
            .map(|md| md.dev() == key.dev && md.ino() == key.inode)
            .unwrap_or(false)
    };
    let in_root = PathBuf::from(format!("/proc/{pid}/root")).join(path.strip_prefix("/").ok()?);
    let map_file = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    [path.to_path_buf(), in_root]
        .into_iter()
        .find(|p| same_file(p))
        .or_else(|| {
            fs::metadata(&map_file)
                .map(|md| md.dev() == key.dev && md.ino() == key.inode)
                .unwrap_or(false)
                .then_some(map_file)
        })
}
