//! Native frames by file and offset, kept across batches: a return address
//! named last second is not looked up again, and a library that many
//! processes map is looked up once for all of them. Only what is new needs
//! the file's symbolizer (mapping, parsing and inflating the file).
//!
//! Entries of a file are kept with its [`Version`] (size, modification and
//! change times, read from the open file): the file is checked once per
//! batch that uses it, and a file rewritten in place, or deleted and its
//! device and inode numbers reused by another, has another version, so its
//! old names go rather than be served for the new code.
//!
//! Bounded in bytes (hash tables counted by what they allocated, their
//! growth checked before an entry is added): past the bound the least recently used
//! entries go, a quarter of them at a time (by the batch each was last
//! used in), never those of the current batch; when the current batch's
//! own entries fill it, new frames are named for this batch only
//! (`refused`). A file whose frames were not used for [`IDLE_BATCHES`]
//! batches is forgotten (no process runs in it any more).

use std::mem::size_of;

use hashbrown::HashMap;
use rustc_hash::FxBuildHasher;
use serde::Serialize;

use crate::{process::files::FileKey, profile::model::Frame};

/// Batches after which the frames of a file that none was used from go.
pub const IDLE_BATCHES: u32 = 60;
/// Ages (in batches) told apart when choosing what to evict; older ones
/// count as this old.
const AGES: usize = 64;

/// What a file was when its frames were named: another version at the
/// same device and inode is another file (or the same one rewritten).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Version {
    /// The version of the open `file` (an `fstat`: no path involved).
    pub fn of(file: &std::fs::File) -> Option<Version> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata().ok()?;
        Some(Version {
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// Counters of the cache since start, and what it holds now (`/healthz`).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct FrameCacheStats {
    /// Frames found in the cache.
    pub hits: u64,
    /// Frames that had to be looked up in their file.
    pub misses: u64,
    /// Entries let go for room, least recently used first.
    pub evicted: u64,
    /// Entries dropped because their file changed or went unused for
    /// [`IDLE_BATCHES`] batches.
    pub invalidated: u64,
    /// Frames named for their batch only: the bound was full of the
    /// batch's own entries, or the file's version could not be read.
    pub refused: u64,
    pub entries: u64,
    /// Files with entries.
    pub files: u64,
    pub bytes: u64,
    pub max_bytes: u64,
    /// ELF files parsed anew (their symbolizer created: the file mapped,
    /// its tables read, compressed sections inflated).
    pub elf_parses: u64,
    /// Lookups into ELF files' symbolizers (one per file per batch that
    /// missed, two when DWARF is read for what the symbol table lacks).
    pub elf_lookups: u64,
}

struct Slot {
    frame: Frame,
    /// Batch it was last used in.
    used: u32,
}

/// Offsets are chosen by whoever maps the file and writes the stack (a
/// frame-pointer walk reads the process's own memory), and no per-process
/// budget bounds how many: they are hashed with a seed random to the
/// daemon (hashbrown's default, foldhash), not with Fx, whose collisions
/// can be computed ahead.
type Offsets = HashMap<u64, Slot>;

struct FileFrames {
    version: Version,
    frames: Offsets,
    /// Batch any of its frames was last used in.
    used: u32,
    /// Batch its version was last checked in.
    checked: u32,
}

/// The cache. File keys (device and inode, from the kernel's maps) are
/// hashed with Fx: a process cannot choose them, and each file with
/// entries has at least one, within the bound.
pub struct FrameCache {
    files: HashMap<FileKey, FileFrames, FxBuildHasher>,
    /// Bytes of the files' offset tables (the files table's own are
    /// counted from its capacity).
    frame_bytes: usize,
    max_bytes: usize,
    batch: u32,
    /// An eviction this batch could not make room: no more until the next.
    full: bool,
    stats: FrameCacheStats,
}

/// Bytes that adding an entry to `map` may allocate: none while it has
/// room, else as much as it holds (it doubles), or a first small table.
fn growth<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(map: &HashMap<K, V, S>) -> usize {
    if map.len() < map.capacity() {
        0
    } else if map.allocation_size() == 0 {
        // Four buckets, their control bytes and a group's worth more.
        4 * (size_of::<(K, V)>() + 1) + 32
    } else {
        map.allocation_size()
    }
}

fn file_bytes(f: &FileFrames) -> usize {
    f.frames.allocation_size()
}

impl FrameCache {
    /// An empty cache of at most `max_bytes`.
    pub fn new(max_bytes: usize) -> FrameCache {
        FrameCache {
            files: HashMap::default(),
            frame_bytes: 0,
            max_bytes,
            batch: 0,
            full: false,
            stats: FrameCacheStats::default(),
        }
    }

    /// Starts a batch.
    pub fn begin_batch(&mut self) {
        self.batch = self.batch.wrapping_add(1);
        self.full = false;
    }

    /// Ends a batch: forgets the files unused for [`IDLE_BATCHES`].
    pub fn end_batch(&mut self) {
        let batch = self.batch;
        let mut gone = 0;
        self.files.retain(|_, f| {
            let keep = batch.wrapping_sub(f.used) < IDLE_BATCHES;
            if !keep {
                gone += f.frames.len();
            }
            keep
        });
        if gone > 0 {
            self.stats.invalidated += gone as u64;
            self.files.shrink_to_fit();
            self.recount();
        }
    }

    /// Whether `file`'s entries, if any, need their version checked this
    /// batch (see [`FrameCache::check`]).
    pub fn unchecked(&self, file: FileKey) -> bool {
        self.files
            .get(&file)
            .is_some_and(|f| f.checked != self.batch)
    }

    /// Keeps `file`'s entries if it is still at `version`, drops them if
    /// not or if its version could not be read.
    pub fn check(&mut self, file: FileKey, version: Option<Version>) {
        let batch = self.batch;
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        if version == Some(f.version) {
            f.checked = batch;
            return;
        }
        if let Some(f) = self.files.remove(&file) {
            self.stats.invalidated += f.frames.len() as u64;
            self.frame_bytes = self.frame_bytes.saturating_sub(file_bytes(&f));
        }
    }

    /// The frame at `offset` of `file` (checked this batch), counted as a
    /// hit or a miss.
    pub fn get(&mut self, file: FileKey, offset: u64) -> Option<Frame> {
        let batch = self.batch;
        let found = self.files.get_mut(&file).and_then(|f| {
            let slot = f.frames.get_mut(&offset)?;
            slot.used = batch;
            f.used = batch;
            Some(slot.frame.clone())
        });
        match found {
            Some(_) => self.stats.hits += 1,
            None => self.stats.misses += 1,
        }
        found
    }

    /// Keeps `frame` for `offset` of `file` at `version` if the bound lets
    /// it (evicting the least recently used first); false if refused.
    pub fn insert(&mut self, file: FileKey, version: Version, offset: u64, frame: Frame) -> bool {
        if self.files.get(&file).is_some_and(|f| f.version != version) {
            self.check(file, Some(version));
        }
        if !self.room_for(file) {
            self.stats.refused += 1;
            return false;
        }
        let batch = self.batch;
        let f = self.files.entry(file).or_insert_with(|| FileFrames {
            version,
            frames: Offsets::default(),
            used: batch,
            checked: batch,
        });
        let before = file_bytes(f);
        f.used = batch;
        f.frames.insert(offset, Slot { frame, used: batch });
        self.frame_bytes = self.frame_bytes + file_bytes(f) - before;
        true
    }

    /// Counts a frame named for its batch only.
    pub fn refuse(&mut self) {
        self.stats.refused += 1;
    }

    /// Whether one more entry of `file` fits, evicting once if not.
    fn room_for(&mut self, file: FileKey) -> bool {
        if self.bytes() + self.growth(file) <= self.max_bytes {
            return true;
        }
        if self.full {
            return false;
        }
        // A quarter evicted may not give back enough (a table shrinks only
        // below half full): evict again while older entries are left.
        while self.evict() > 0 {
            if self.bytes() + self.growth(file) <= self.max_bytes {
                return true;
            }
        }
        let fits = self.bytes() + self.growth(file) <= self.max_bytes;
        self.full = !fits;
        fits
    }

    /// Bytes adding an entry of `file` allocates (its table's growth and,
    /// for a new file, the files table's).
    fn growth(&self, file: FileKey) -> usize {
        match self.files.get(&file) {
            Some(f) => growth(&f.frames),
            None => growth(&self.files) + growth(&Offsets::default()),
        }
    }

    /// Drops the least recently used quarter of the entries (at least),
    /// none of the current batch, and gives their tables' room back; how
    /// many it dropped.
    fn evict(&mut self) -> usize {
        let batch = self.batch;
        let age = |used: u32| (batch.wrapping_sub(used) as usize).min(AGES);
        let mut by_age = [0usize; AGES + 1];
        for slot in self.files.values().flat_map(|f| f.frames.values()) {
            by_age[age(slot.used)] += 1;
        }
        let entries: usize = by_age.iter().sum();
        // The youngest age evicted: from the oldest down, until a quarter.
        let mut cut = AGES + 1;
        let mut taken = 0;
        while cut > 1 && taken < entries.div_ceil(4) {
            cut -= 1;
            taken += by_age[cut];
        }
        let mut evicted = 0;
        for f in self.files.values_mut() {
            let before = f.frames.len();
            f.frames.retain(|_, slot| age(slot.used) < cut);
            if f.frames.len() < before {
                evicted += before - f.frames.len();
                f.frames.shrink_to_fit();
            }
        }
        self.files.retain(|_, f| !f.frames.is_empty());
        self.files.shrink_to_fit();
        self.stats.evicted += evicted as u64;
        self.recount();
        evicted
    }

    /// Drops every entry (the names they hold must go).
    pub fn clear(&mut self) {
        self.stats.evicted += self
            .files
            .values()
            .map(|f| f.frames.len() as u64)
            .sum::<u64>();
        self.files = HashMap::default();
        self.recount();
    }

    fn recount(&mut self) {
        self.frame_bytes = self.files.values().map(file_bytes).sum();
    }

    /// Bytes held now (what the tables allocated).
    pub fn bytes(&self) -> usize {
        self.frame_bytes + self.files.allocation_size()
    }

    /// The bound on [`FrameCache::bytes`].
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Counters since start, and what is held now.
    pub fn stats(&self) -> FrameCacheStats {
        FrameCacheStats {
            entries: self.files.values().map(|f| f.frames.len() as u64).sum(),
            files: self.files.len() as u64,
            bytes: self.bytes() as u64,
            max_bytes: self.max_bytes as u64,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn version(size: u64) -> Version {
        Version {
            size,
            mtime: (1, 0),
            ctime: (1, 0),
        }
    }

    fn file(inode: u64) -> FileKey {
        FileKey { dev: 1, inode }
    }

    #[test]
    fn the_byte_bound_holds_and_the_least_recently_used_go_first() {
        let max = 64 << 10;
        let mut cache = FrameCache::new(max);
        let frame: Frame = Arc::from("f");
        let v = version(1);
        cache.begin_batch();
        assert!(cache.insert(file(0), v, 0, frame.clone()));
        for batch in 0..50u64 {
            cache.begin_batch();
            assert!(cache.get(file(0), 0).is_some(), "used every batch: kept");
            for i in 0..200 {
                assert!(cache.insert(file(1 + i % 7), v, batch << 20 | i, frame.clone()));
                assert!(cache.bytes() <= max, "{} > {max}", cache.bytes());
            }
            // This batch's entries are all there.
            for i in 0..200 {
                assert!(cache.get(file(1 + i % 7), batch << 20 | i).is_some());
            }
            cache.end_batch();
        }
        let stats = cache.stats();
        assert!(stats.evicted > 0 && stats.bytes <= max as u64, "{stats:?}");
        assert!(cache.get(file(1), 0).is_none(), "the oldest went");
        // One batch alone larger than the bound: the rest is refused.
        cache.begin_batch();
        let refused = (0..100_000).find(|&i| {
            let kept = cache.insert(file(99), v, i, frame.clone());
            assert!(cache.bytes() <= max);
            !kept
        });
        assert!(refused.is_some());
        assert!(cache.stats().refused > 0);
    }

    #[test]
    fn another_version_or_disuse_drops_a_files_frames() {
        let mut cache = FrameCache::new(1 << 20);
        let frame: Frame = Arc::from("old");
        cache.begin_batch();
        cache.insert(file(1), version(1), 0x10, frame.clone());
        cache.insert(file(2), version(1), 0x10, frame.clone());
        cache.end_batch();
        cache.begin_batch();
        assert!(cache.unchecked(file(1)));
        cache.check(file(1), Some(version(1)));
        assert!(!cache.unchecked(file(1)), "checked once a batch");
        assert!(cache.get(file(1), 0x10).is_some());
        cache.check(file(2), Some(version(2)));
        assert!(cache.get(file(2), 0x10).is_none(), "rewritten: not served");
        assert_eq!(cache.stats().invalidated, 1);
        cache.check(file(1), None);
        assert!(cache.get(file(1), 0x10).is_none(), "unreadable: not served");
        cache.insert(file(3), version(1), 0x10, frame.clone());
        for _ in 0..=IDLE_BATCHES {
            cache.end_batch();
            cache.begin_batch();
        }
        assert_eq!(cache.stats().files, 0, "unused files are forgotten");
        assert_eq!(cache.bytes(), cache.files.allocation_size());
    }
}
