//! ELF files held open for symbolization, each with its own blazesym
//! symbolizer, in a bounded cache.
//!
//! blazesym caches every file it ever opened, for the life of its
//! symbolizer: on a host that runs many short-lived binaries that is one
//! descriptor per binary for ever, deleted files included. Here each file
//! gets a symbolizer of its own that is dropped with the file: at most
//! [`MAX_OPEN`] files are open (least recently used closed first), a file
//! unused for [`IDLE_BATCHES`] batches is closed, and a deleted file as
//! soon as a batch passes without it. Each open file costs two
//! descriptors (ours, checked, and blazesym's reopening of it).
//!
//! Files are opened through [`crate::untrusted`]: by the process's
//! `/proc/PID/map_files` link when the mapping still exists (the very file
//! mapped, whatever namespace or deleted state it is in), else by path
//! without following a final symlink, and always checked to be the
//! mapped file (device and inode), regular, and at most
//! [`MAX_ELF_BYTES`](crate::process::files::MAX_ELF_BYTES).
//! blazesym then reads it through `/proc/self/fd/N`, which no user can
//! redirect.
//!
//! Memory: blazesym maps each file it symbolizes whole and keeps what it
//! parsed of it, so the files with a symbolizer alive are bounded by their
//! size: at most [`max_mapped_bytes`] together, enforced before a
//! symbolizer is created (other files' symbolizers are dropped first,
//! least recently used first; a file larger than the bound alone is
//! refused, counted as `elf`/`budget`). Their resident pages count in the
//! daemon's RSS (15 MB of `libLLVM` while a `cargo build` ran): files
//! larger than [`KEEP_MAPPED_BYTES`] drop their symbolizer, so unmap, once
//! [`KEEP_LARGE_BATCHES`] batches passed without a lookup in them; smaller
//! ones once unused for [`KEEP_IDLE_BATCHES`] (mapping a file is not free
//! for the daemon: see there). The frame cache
//! ([`super::frame_cache`]) asks a file only for addresses it has not
//! named yet, so a large file is parsed again only when new code of it
//! runs after a few quiet batches, not at every batch that runs it.

use std::path::Path;

use blazesym::symbolize::{source::Elf, source::Source, Input, Symbolized, Symbolizer as Blaze};
use rustc_hash::FxHashMap;

use super::frame_cache::Version;
use crate::{
    process::files::{open_mapped, FileKey, Locator},
    untrusted::{refusals, Checked, Reason, What},
};

/// Most ELF files open at once.
pub const MAX_OPEN: usize = 64;
/// Batches (seconds) after which an unused file is closed.
pub const IDLE_BATCHES: u64 = 60;
/// Bytes of the files with a symbolizer alive (mapped, and what blazesym
/// parsed of them, at most as much), together: the budget's `elf_symbols`
/// part less the kernel's symbols (parsed at the first kernel frame).
pub fn max_mapped_bytes() -> u64 {
    static KSYMS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let ksyms = *KSYMS.get_or_init(crate::process::own::kallsyms_bytes);
    let part = crate::budget::bytes(crate::budget::Part::ElfSymbols) as u64;
    part.saturating_sub(ksyms).max(part / 2)
}
/// Files larger than this are unmapped after [`KEEP_LARGE_BATCHES`]
/// batches without a lookup.
pub const KEEP_MAPPED_BYTES: u64 = 16 << 20;
/// Batches a large file stays mapped without a lookup: one in use batch
/// after batch (new code of it runs) is not parsed and inflated again each
/// time, and it stays within [`max_mapped_bytes`] all the same. It is
/// mapped for the whole batch that looks it up anyway: keeping it a few
/// batches more raises the time it is resident, not the peak.
pub const KEEP_LARGE_BATCHES: u64 = 3;
/// Batches a smaller file stays mapped unused. Mapping a file takes the
/// daemon's own mmap lock for writing and, under it, the file's rmap lock,
/// which every process mapping or unmapping the file (libc: every exec and
/// exit on the host) takes too: on a saturated host one of them, preempted
/// with it held, kept the daemon's threads from faulting in a page for
/// 60 s (`/healthz` timed out, the collector stalled). Remapping libc each
/// batch it was needed in made that wait likely; once a minute, rare.
pub const KEEP_IDLE_BATCHES: u64 = 60;

struct OpenFile {
    file: Checked,
    /// Created when a batch needs the file, dropped at the end of a batch
    /// that did not: blazesym maps the whole file and keeps what it parsed
    /// (symbol tables, DWARF) in memory, which is most of the daemon's RSS
    /// when it is kept (hundreds of MB for binaries with debug info). The
    /// frame caches mean a file is rarely needed two batches in a row.
    blaze: Option<Blaze>,
    /// Last batch it was needed in (a lookup, or its frames' version
    /// checked: the held descriptor keeps its inode from being reused).
    used: u64,
    /// Last batch its symbolizer was looked up in.
    looked_up: u64,
    /// The file's size: what its symbolizer maps.
    size: u64,
    /// What the file was when last checked.
    version: Option<Version>,
}

fn new_blaze() -> Blaze {
    Blaze::builder()
        .enable_code_info(false)
        .enable_inlined_fns(false)
        .build()
}

/// The open files, by device and inode.
#[derive(Default)]
pub struct ElfFiles {
    open: FxHashMap<FileKey, OpenFile>,
    batch: u64,
    /// Symbolizers created (files parsed anew) since start.
    parses: u64,
    /// Lookups into symbolizers since start.
    lookups: u64,
}

impl ElfFiles {
    /// The version of `key`'s file now, opening it if it is not open
    /// (`None` if it cannot be); a file changed since it was parsed is
    /// parsed again.
    pub fn version(&mut self, key: FileKey, at: &Locator) -> Option<Version> {
        if !self.open_file(key, at) {
            return None;
        }
        let batch = self.batch;
        let open = self.open.get_mut(&key)?;
        open.used = batch;
        let now = Version::of(&open.file.file);
        if now != open.version {
            open.blaze = None;
            open.version = now;
        }
        now
    }

    /// Opens `key`'s file unless it is open; false if it cannot be.
    fn open_file(&mut self, key: FileKey, at: &Locator) -> bool {
        if self.open.contains_key(&key) {
            return true;
        }
        match open_mapped(key, at) {
            Ok(file) => {
                self.make_room();
                let size = file.stat.st_size.max(0) as u64;
                let version = Version::of(&file.file);
                self.open.insert(
                    key,
                    OpenFile {
                        file,
                        blaze: None,
                        used: self.batch,
                        looked_up: self.batch,
                        size,
                        version,
                    },
                );
                true
            }
            Err(err) => {
                tracing::debug!(file = %at.path.display(), "not symbolized: {err}");
                false
            }
        }
    }

    /// Symbol names at `offsets` (file offsets) of `key`'s file, `None` for
    /// each when the file cannot be opened or read.
    pub fn symbolize(
        &mut self,
        key: FileKey,
        at: &Locator,
        offsets: &[u64],
    ) -> Vec<Option<String>> {
        if !self.open_file(key, at) {
            return vec![None; offsets.len()];
        }
        if !self.map_room(key) {
            refusals::count_for(What::Elf, Reason::Budget, at.pid);
            return vec![None; offsets.len()];
        }
        let batch = self.batch;
        let Some(open) = self.open.get_mut(&key) else {
            return vec![None; offsets.len()];
        };
        open.used = batch;
        open.looked_up = batch;
        if open.blaze.is_none() {
            self.parses += 1;
        }
        let blaze = open.blaze.get_or_insert_with(new_blaze);
        let path = open.file.fd_path();
        self.lookups += 1;
        // Symbol tables first: DWARF is read only for what they miss (a
        // stripped library with a separate debug file). Parsing a binary's
        // DWARF when its symbol table would do costs memory and time
        // proportional to the debug info (hundreds of MB for some).
        let mut names = lookup(blaze, &path, false, offsets);
        let missed: Vec<usize> = (0..offsets.len()).filter(|&i| names[i].is_none()).collect();
        if !missed.is_empty() {
            self.lookups += 1;
            let retry: Vec<u64> = missed.iter().map(|&i| offsets[i]).collect();
            for (i, name) in missed.into_iter().zip(lookup(blaze, &path, true, &retry)) {
                names[i] = name;
            }
        }
        if names.iter().all(Option::is_none) {
            tracing::debug!(file = %at.path.display(), "no symbols for {} offsets", offsets.len());
        }
        names
    }

    /// Ends a batch: closes idle files and deleted ones not used in it,
    /// and lets go of the parsed contents of files without a lookup for
    /// [`KEEP_LARGE_BATCHES`] (large ones) or [`KEEP_IDLE_BATCHES`].
    pub fn end_batch(&mut self) {
        let batch = self.batch;
        self.open.retain(|_, f| {
            let idle = batch - f.used;
            idle < IDLE_BATCHES && (idle == 0 || !deleted(&f.file))
        });
        for f in self.open.values_mut() {
            let keep = if f.size > KEEP_MAPPED_BYTES {
                KEEP_LARGE_BATCHES
            } else {
                KEEP_IDLE_BATCHES
            };
            if batch - f.looked_up >= keep {
                f.blaze = None;
            }
        }
        self.batch += 1;
        self.publish();
    }

    /// Bytes of the files with a symbolizer alive.
    pub fn mapped_bytes(&self) -> u64 {
        self.open
            .values()
            .filter(|f| f.blaze.is_some())
            .map(|f| f.size)
            .sum()
    }

    /// Makes room within [`max_mapped_bytes`] for `key`'s symbolizer
    /// before it is created, dropping the least recently used others;
    /// false if the file alone is larger than the bound.
    fn map_room(&mut self, key: FileKey) -> bool {
        let Some(me) = self.open.get(&key) else {
            return false;
        };
        if me.blaze.is_some() {
            return true;
        }
        let size = me.size;
        let max = max_mapped_bytes();
        if size > max {
            return false;
        }
        while self.mapped_bytes() + size > max {
            let Some(f) = self
                .open
                .iter_mut()
                .filter(|(k, f)| **k != key && f.blaze.is_some())
                .min_by_key(|(_, f)| f.looked_up)
                .map(|(_, f)| f)
            else {
                return false;
            };
            f.blaze = None;
        }
        true
    }

    /// Tells [`crate::held`] which files are mapped and their bytes.
    fn publish(&self) {
        let files = self.open.iter().filter(|(_, f)| f.blaze.is_some());
        crate::held::set_mapped_files(files.map(|(k, _)| (k.dev, k.inode)).collect());
        crate::held::set(
            crate::held::Holder::ElfSymbols,
            self.mapped_bytes(),
            Some(max_mapped_bytes()),
        );
    }

    /// Files parsed anew (symbolizers created) and lookups into them,
    /// since start.
    pub fn work(&self) -> (u64, u64) {
        (self.parses, self.lookups)
    }

    /// Files open now.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// True when no file is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    fn make_room(&mut self) {
        while self.open.len() >= MAX_OPEN {
            let Some(oldest) = self
                .open
                .iter()
                .min_by_key(|(_, f)| f.used)
                .map(|(k, _)| *k)
            else {
                return;
            };
            self.open.remove(&oldest);
        }
    }
}

/// Whether the file has no name left (unlinked while open).
fn deleted(file: &Checked) -> bool {
    file.file.metadata().map_or(true, |m| {
        use std::os::unix::fs::MetadataExt;
        m.nlink() == 0
    })
}

/// Names at `offsets` of the file at `path`, with or without DWARF.
fn lookup(blaze: &Blaze, path: &Path, debug_syms: bool, offsets: &[u64]) -> Vec<Option<String>> {
    let mut elf = Elf::new(path);
    elf.debug_syms = debug_syms;
    match blaze.symbolize(&Source::Elf(elf), Input::FileOffset(offsets)) {
        Ok(syms) => syms.into_iter().map(sym_name).collect(),
        Err(err) => {
            tracing::debug!(file = %path.display(), "ELF symbolization failed: {err}");
            vec![None; offsets.len()]
        }
    }
}

fn sym_name(sym: Symbolized<'_>) -> Option<String> {
    sym.into_sym().map(|s| s.name.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::files::key_of;

    /// Descriptors of this test process open on files under `dir` (other
    /// tests run in parallel and open their own, so only these count).
    fn open_fds_under(dir: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.starts_with(dir))
            .count()
    }

    #[test]
    fn files_are_bounded_and_deleted_ones_released() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let mut files = ElfFiles::default();
        let mut paths = Vec::new();
        for i in 0..MAX_OPEN + 8 {
            // Distinct inodes (copies), found by path: no such mapping.
            let path = dir.path().join(format!("copy{i}"));
            if i < 3 {
                std::fs::copy(&exe, &path).unwrap();
            } else {
                std::fs::write(&path, b"\x7fELF not really").unwrap();
            }
            let at = Locator {
                pid: std::process::id(),
                start: 1,
                end: 2,
                path: path.clone(),
            };
            let names = files.symbolize(key_of(&path), &at, &[0x1000]);
            assert_eq!(names.len(), 1);
            paths.push(path);
        }
        files.end_batch();
        assert_eq!(files.len(), MAX_OPEN, "least recently used closed");
        for p in &paths {
            std::fs::remove_file(p).unwrap();
        }
        files.end_batch();
        assert!(files.is_empty(), "deleted files released");
        let held = open_fds_under(dir.path());
        assert_eq!(held, 0, "{held} descriptors still open on deleted files");
    }

    /// Symbolizes one offset of a sparse file `name` of `size` bytes in
    /// `dir` (the size is what counts, not what the disk holds); the
    /// mapped bytes after.
    fn symbolize_sized(files: &mut ElfFiles, dir: &Path, name: &str, size: u64) -> u64 {
        let path = dir.join(name);
        std::fs::File::create(&path).unwrap().set_len(size).unwrap();
        let at = Locator {
            pid: std::process::id(),
            start: 1,
            end: 2,
            path: path.clone(),
        };
        files.symbolize(key_of(&path), &at, &[0x10]);
        files.mapped_bytes()
    }

    #[test]
    fn mapped_bytes_are_bounded_before_a_file_is_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = ElfFiles::default();
        let mut symbolize =
            |name: &str, size: u64| symbolize_sized(&mut files, dir.path(), name, size);
        // Two fit, a third does not: whatever the budget's part.
        let half = max_mapped_bytes() / 2;
        assert_eq!(symbolize("a", half), half);
        assert_eq!(symbolize("b", half), 2 * half);
        assert_eq!(symbolize("c", half), 2 * half, "`a` was dropped first");
        let refused = refusals::get(What::Elf, Reason::Budget);
        assert_eq!(symbolize("huge", max_mapped_bytes() + 1), 2 * half);
        assert_eq!(refusals::get(What::Elf, Reason::Budget), refused + 1);
        // Alone, a file over KEEP_MAPPED_BYTES stays parsed while looked
        // up now and then, and is let go a few batches after the last.
        let mut files = ElfFiles::default();
        let large = KEEP_MAPPED_BYTES + 1;
        for _ in 0..2 * KEEP_LARGE_BATCHES {
            let mapped = symbolize_sized(&mut files, dir.path(), "large", large);
            assert_eq!(mapped, large);
            files.end_batch();
        }
        assert_eq!(files.work().0, 1, "parsed once while in use");
        for _ in 1..KEEP_LARGE_BATCHES {
            files.end_batch();
            assert_eq!(files.mapped_bytes(), large, "kept a few batches");
        }
        files.end_batch();
        assert_eq!(files.mapped_bytes(), 0, "large files are let go soon");
        // A small file stays mapped while it is used now and then.
        symbolize_sized(&mut files, dir.path(), "small", 4096);
        for _ in 0..=KEEP_IDLE_BATCHES {
            assert_eq!(files.mapped_bytes(), 4096, "remapped while idle");
            files.end_batch();
        }
        assert_eq!(files.mapped_bytes(), 0, "unmapped once idle");
    }
}
