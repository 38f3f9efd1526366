//! What the symbolizer remembers about processes and the files they map,
//! captured while they are alive so that exited processes still symbolize.

use rustc_hash::FxHashMap as HashMap;
use std::fs;

use super::{
    elf_files::Locator,
    maps::{Backing, Mapping, ProcMaps},
};

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
    /// How to reach the file (opened only when a frame needs it).
    locator: Locator,
    /// Base name, for `module+0xOFF` frames.
    display: String,
    /// Last batch a process was seen mapping it.
    seen: u64,
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
        self.files
            .retain(|_, f| batch - f.seen < FORGET_AFTER_BATCHES);
    }

    /// The process's name (`/proc/PID/comm`), if it was alive when first seen.
    pub fn name(&self, pid: u32) -> Option<&str> {
        self.procs.get(&pid)?.name.as_deref()
    }

    /// Whether `pid` is a HotSpot JVM, as far as its maps tell.
    pub fn is_jvm(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.jvm)
    }

    /// How to reach a mapped file.
    pub fn locator(&self, file: FileKey) -> Option<&Locator> {
        Some(&self.files.get(&file)?.locator)
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
                register_files(&mut self.files, pid, &maps, batch);
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
                register_files(&mut self.files, pid, &maps, batch);
                entry.jvm = crate::jvm::is_hotspot(&maps);
                entry.maps = maps;
            }
        }
        let mapping = self.procs.get(&pid)?.maps.find(addr)?;
        Some(classify(&mut self.files, mapping, addr, batch))
    }
}

fn classify(
    files: &mut HashMap<FileKey, FileEntry>,
    mapping: &Mapping,
    addr: u64,
    batch: u64,
) -> Found {
    match &mapping.backing {
        Backing::File { dev, inode, .. } => {
            let file = FileKey {
                dev: *dev,
                inode: *inode,
            };
            if let Some(entry) = files.get_mut(&file) {
                entry.seen = batch;
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

/// Records how to reach each file of `maps` that is not known yet. Files
/// are not opened here: most mapped files never get a sample.
fn register_files(files: &mut HashMap<FileKey, FileEntry>, pid: u32, maps: &ProcMaps, batch: u64) {
    for m in maps.iter() {
        let Backing::File { path, dev, inode } = &m.backing else {
            continue;
        };
        let key = FileKey {
            dev: *dev,
            inode: *inode,
        };
        let locator = Locator {
            pid,
            start: m.start,
            end: m.end,
            path: path.clone(),
        };
        if let Some(known) = files.get_mut(&key) {
            // The newest process to map it is the likeliest to be alive.
            known.locator = locator;
            known.seen = batch;
            continue;
        }
        let display = path
            .file_name()
            .map(|n| {
                n.to_string_lossy()
                    .trim_end_matches(" (deleted)")
                    .to_string()
            })
            .unwrap_or_else(|| path.display().to_string());
        files.insert(
            key,
            FileEntry {
                locator,
                display,
                seen: batch,
            },
        );
    }
}
