//! The symbolizer's view of processes (read from the process table, which
//! snapshots them while they are alive) and of the files they map.

use rustc_hash::FxHashMap as HashMap;
use std::{collections::hash_map::Entry, path::Path, sync::Arc, time::Instant};

use crate::process::{
    container::Container,
    files::{FileKey, Locator},
    mapped::MappedPath,
    maps::{Backing, Mapping},
    Image, ProcessTable,
};

/// Batches after which a file no process was seen mapping is forgotten.
const FORGET_AFTER_BATCHES: u64 = 120;

/// Where an address points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    File { file: FileKey, offset: u64 },
    Vdso,
    Anon,
}

/// This batch's view of a process: the image its records are read with.
struct Chosen {
    image: Arc<Image>,
    /// Whether the image's maps were already re-read after a miss.
    refreshed: bool,
}

struct FileEntry {
    /// How to reach the file (opened only when a frame needs it).
    locator: Locator,
    /// Base name, for `module+0xOFF` frames.
    display: String,
    /// Last batch a process was seen mapping it.
    seen: u64,
}

/// The processes of the batch being symbolized, read from the process
/// table, and the files they map.
pub struct Procs {
    table: Arc<ProcessTable>,
    /// By pid and thread name (a pid that exec'd or was reused within the
    /// batch has two images); cleared every batch.
    chosen: HashMap<u32, Vec<(String, Chosen)>>,
    files: HashMap<FileKey, FileEntry>,
    /// Records of the batch are at most this old.
    since: Instant,
    batch: u64,
}

impl Procs {
    /// Reads processes from `table`.
    pub fn new(table: Arc<ProcessTable>) -> Procs {
        Procs {
            table,
            chosen: HashMap::default(),
            files: HashMap::default(),
            since: Instant::now(),
            batch: 0,
        }
    }

    /// Starts a new batch whose records were taken since `since`.
    pub fn begin_batch(&mut self, since: Instant) {
        self.batch += 1;
        self.since = since;
        self.chosen.clear();
    }

    /// Forgets files not mapped by a process seen for a while.
    pub fn end_batch(&mut self) {
        let batch = self.batch;
        self.files
            .retain(|_, f| batch - f.seen < FORGET_AFTER_BATCHES);
    }

    /// The process's newest name in the batch (after an exec in the batch,
    /// the new program's).
    pub fn name(&mut self, pid: u32) -> Option<String> {
        // No thread is called this: the lookup falls back to the newest.
        const NO_THREAD: &str = "\0";
        Some(self.choose(pid, NO_THREAD)?.image.name.clone())
    }

    /// The container of `pid`'s newest image in the batch.
    pub fn container(&mut self, pid: u32) -> Option<Arc<Container>> {
        const NO_THREAD: &str = "\0";
        self.choose(pid, NO_THREAD)?.image.container.clone()
    }

    /// The parent, cgroups and identity of `pid`'s newest image in the
    /// batch (its facts read now if it lives and they were not yet).
    pub fn origin(&mut self, pid: u32) -> Option<crate::profile::model::Origin> {
        const NO_THREAD: &str = "\0";
        let image = self.choose(pid, NO_THREAD)?.image.clone();
        // An ended image keeps what was read while it ran: never the
        // facts of whatever process holds its pid now.
        let facts = match image.ended {
            Some(_) => image.facts.clone(),
            None => self.table.facts(image.key()),
        };
        Some(crate::profile::model::Origin {
            parent: image.parent,
            cgroup: image.cgroup.clone(),
            cgroups_v1: image.cgroups_v1.clone(),
            identity: facts.and_then(|f| f.identity.clone()),
        })
    }

    /// The table's image of `pid` as thread `comm` saw it.
    pub fn image(&mut self, pid: u32, comm: &str) -> Option<Arc<Image>> {
        Some(self.choose(pid, comm)?.image.clone())
    }

    /// How to reach a mapped file.
    pub fn locator(&self, file: FileKey) -> Option<&Locator> {
        Some(&self.files.get(&file)?.locator)
    }

    /// Short name of a mapped file.
    pub fn display_name(&self, file: FileKey) -> Option<&str> {
        Some(&self.files.get(&file)?.display)
    }

    /// Locates `addr` in the executable mappings of `pid` as thread
    /// `comm` saw them, re-reading a live process's maps once on a miss
    /// (it may have loaded a library).
    pub fn find(&mut self, pid: u32, comm: &str, addr: u64) -> Option<Found> {
        let chosen = choose(&mut self.chosen, &self.table, self.since, pid, comm)?;
        if !chosen.refreshed && chosen.image.maps.find(addr).is_none() {
            chosen.refreshed = true;
            if let Some(image) = self.table.refresh(&chosen.image) {
                chosen.image = image;
            }
        }
        let mapping = chosen.image.maps.find(addr)?;
        Some(classify(
            &mut self.files,
            &chosen.image,
            mapping,
            addr,
            self.batch,
        ))
    }

    fn choose(&mut self, pid: u32, comm: &str) -> Option<&mut Chosen> {
        choose(&mut self.chosen, &self.table, self.since, pid, comm)
    }
}

/// The image of `pid` for records of thread `comm` (looked up once
/// per batch; a pid has one or two names in a batch, so a short list).
fn choose<'a>(
    chosen: &'a mut HashMap<u32, Vec<(String, Chosen)>>,
    table: &ProcessTable,
    since: Instant,
    pid: u32,
    comm: &str,
) -> Option<&'a mut Chosen> {
    let known = chosen.entry(pid).or_default();
    // An entry named "" stands for every thread: the pid had one image.
    let at = match known.iter().position(|(c, _)| c.is_empty() || c == comm) {
        Some(at) => at,
        None => {
            let (image, rivals) = table.lookup_with_rivals(pid, comm, since)?;
            let name = if rivals {
                comm.to_string()
            } else {
                String::new()
            };
            let chosen = Chosen {
                image,
                refreshed: false,
            };
            known.push((name, chosen));
            known.len() - 1
        }
    };
    Some(&mut known[at].1)
}

fn classify(
    files: &mut HashMap<FileKey, FileEntry>,
    image: &Image,
    mapping: &Mapping,
    addr: u64,
    batch: u64,
) -> Found {
    match &mapping.backing {
        Backing::File { path, dev, inode } => {
            let file = FileKey {
                dev: *dev,
                inode: *inode,
            };
            let locator = || Locator {
                pid: image.pid,
                start: mapping.start,
                end: mapping.end,
                path: path.clone(),
            };
            match files.entry(file) {
                Entry::Occupied(mut known) => {
                    let known = known.get_mut();
                    known.seen = batch;
                    // A live process is the likeliest way to reach it.
                    if image.ended.is_none() && known.locator.pid != image.pid {
                        known.locator = locator();
                    }
                }
                Entry::Vacant(slot) => {
                    slot.insert(FileEntry {
                        locator: locator(),
                        display: display_name(path),
                        seen: batch,
                    });
                }
            }
            Found::File {
                file,
                offset: mapping.file_offset(addr),
            }
        }
        Backing::Vdso => Found::Vdso,
        Backing::Anon { .. } => Found::Anon,
    }
}

/// Base name of a mapped file, for `module+0xOFF` frames.
fn display_name(path: &Path) -> String {
    let shown = path.to_string_lossy();
    MappedPath::parse(&shown)
        .file_name()
        .map_or_else(|| path.display().to_string(), str::to_string)
}
