//! The files processes map: one identity ([`FileKey`]), one way to reach
//! a mapped file ([`open_mapped`]), and a process's executable file
//! mappings as the unwinder and the JVM readers use them.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    mapped::hotspot_libjvm,
    maps::{Backing, ProcMaps},
};
use crate::untrusted::{self, Checked, Expect, Last, OpenError, What};

/// Largest ELF file read (symbolized, unwound, or a libjvm's symbols):
/// bigger ones (none seen in practice) show as `module+0xOFF` frames.
pub const MAX_ELF_BYTES: u64 = 2 << 30;

/// A file, by device and inode: what every cache of per-file work (unwind
/// tables, symbolizers, libjvm facts) is keyed by, so one file mapped by
/// many processes, or under many paths, is read once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u64,
    pub inode: u64,
}

/// How to reach a mapped file: the mapping of a process that maps it, and
/// the path that process sees.
#[derive(Debug, Clone)]
pub struct Locator {
    pub pid: u32,
    pub start: u64,
    pub end: u64,
    pub path: PathBuf,
}

/// Opens the file behind a mapping through [`crate::untrusted`]: by the
/// process's `/proc/PID/map_files` link while the mapping exists (the very
/// file mapped, whatever mount namespace or deleted state it is in), else
/// by path without following a final symlink, then by the same path under
/// the process's root (a container); always checked to be the file `key`
/// names, regular, and at most [`MAX_ELF_BYTES`].
pub fn open_mapped(key: FileKey, at: &Locator) -> Result<Checked, OpenError> {
    let expect = Expect {
        owner: None,
        max_bytes: MAX_ELF_BYTES,
        identity: Some((key.dev, key.inode)),
    };
    let map_file = PathBuf::from(format!(
        "/proc/{}/map_files/{:x}-{:x}",
        at.pid, at.start, at.end
    ));
    match untrusted::open_path(&map_file, Last::MagicLink, What::Elf, &expect) {
        Ok(f) => return Ok(f),
        Err(err @ OpenError::Refused { .. }) => return Err(err),
        Err(OpenError::Io(_)) => {}
    }
    let in_root = at
        .path
        .strip_prefix("/")
        .ok()
        .map(|rel| Path::new(&format!("/proc/{}/root", at.pid)).join(rel));
    let mut last = None;
    for path in std::iter::once(at.path.clone()).chain(in_root) {
        match untrusted::open_path(&path, Last::NoFollow, What::Elf, &expect) {
            Ok(f) => return Ok(f),
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| OpenError::Io(std::io::ErrorKind::NotFound.into())))
}

/// An executable file mapping of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub key: FileKey,
    /// As `/proc/PID/maps` shows it (for reports).
    pub path: Arc<str>,
}

impl ExecMapping {
    /// How to reach its file through `pid`.
    pub fn locator(&self, pid: u32) -> Locator {
        Locator {
            pid,
            start: self.start,
            end: self.end,
            path: PathBuf::from(&*self.path),
        }
    }

    /// Opens its file (see [`open_mapped`]); only headers and the sections
    /// needed are read from it, never the whole file.
    pub fn open(&self, pid: u32) -> Result<std::fs::File, OpenError> {
        open_mapped(self.key, &self.locator(pid)).map(|c| c.file)
    }
}

/// The file-backed mappings of a maps snapshot.
pub fn exec_mappings_in(maps: &ProcMaps) -> Vec<ExecMapping> {
    maps.iter()
        .filter_map(|m| match &m.backing {
            Backing::File { path, dev, inode } => Some(ExecMapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                key: FileKey {
                    dev: *dev,
                    inode: *inode,
                },
                path: path.to_string_lossy().into(),
            }),
            _ => None,
        })
        .collect()
}

/// Executable file mappings of `pid`, read now.
pub(in crate::process) fn exec_mappings(pid: u32) -> std::io::Result<Vec<ExecMapping>> {
    Ok(exec_mappings_in(&ProcMaps::read(pid)?))
}

/// HotSpot's `libjvm.so` among `mappings` (see [`hotspot_libjvm`]).
pub fn hotspot_libjvm_in(mappings: &[ExecMapping]) -> Option<&ExecMapping> {
    hotspot_libjvm(mappings.iter().map(|m| &*m.path)).map(|i| &mappings[i])
}

/// The key of the file at `path` (tests).
#[cfg(test)]
pub(crate) fn key_of(path: &Path) -> FileKey {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    FileKey {
        dev: m.dev(),
        inode: m.ino(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_mappings_reach_their_files_by_device_and_inode() {
        // Our own libc: the device and inode from /proc/PID/maps are what
        // stat says of the file behind the mapping.
        let me = std::process::id();
        let maps = exec_mappings(me).unwrap();
        let libc = maps
            .iter()
            .find(|m| m.path.contains("libc.so"))
            .expect("libc mapped");
        assert!(libc.open(me).is_ok(), "device and inode match the file");
    }

    #[test]
    fn a_file_replaced_by_another_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, "a").unwrap();
        std::fs::write(&b, "b").unwrap();
        let at = Locator {
            pid: std::process::id(),
            start: 1,
            end: 2,
            path: a,
        };
        let err = open_mapped(key_of(&b), &at).unwrap_err();
        assert_eq!(err.reason(), Some(untrusted::Reason::Replaced));
    }
}
