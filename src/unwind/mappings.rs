//! What the registry reads of a process: its executable file mappings,
//! the files behind them, its executable and name.

use std::{fs, os::unix::fs::MetadataExt, path::PathBuf, sync::Arc};

use crate::{
    symbolize::{
        maps::{Backing, ProcMaps},
        MAX_ELF_BYTES,
    },
    untrusted::{self, Expect, Last, OpenError, What},
};

/// A file, by device and inode: one table serves every process mapping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct FileKey {
    pub dev: u64,
    pub inode: u64,
}

/// An executable file mapping of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExecMapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub key: FileKey,
    /// As `/proc/PID/maps` shows it (for reports).
    pub path: Arc<str>,
}

/// Executable file mappings of `pid`, from the symbolizer's parser.
pub(crate) fn exec_mappings(pid: u32) -> std::io::Result<Vec<ExecMapping>> {
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
                path: path.to_string_lossy().into(),
            }),
            _ => None,
        })
        .collect())
}

/// The file behind a mapping, opened through `/proc/PID/map_files`, which
/// reaches it whatever mount namespace or deleted state it is in, and
/// checked (regular, the mapped file, at most [`MAX_ELF_BYTES`]). Only its
/// headers and `.eh_frame` are read from it, never the whole file.
pub(crate) fn open_mapped(pid: u32, m: &ExecMapping) -> Result<fs::File, OpenError> {
    let path = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    let expect = Expect {
        owner: None,
        max_bytes: MAX_ELF_BYTES,
        identity: Some((m.key.dev, m.key.inode)),
    };
    untrusted::open_path(&path, Last::MagicLink, What::Elf, &expect).map(|c| c.file)
}

/// The file `pid` executes.
pub(super) fn exe_of(pid: u32) -> Option<FileKey> {
    let meta = fs::metadata(format!("/proc/{pid}/exe")).ok()?;
    Some(FileKey {
        dev: meta.dev(),
        inode: meta.ino(),
    })
}

/// The process's name (`comm`, at most 15 bytes), for reports.
pub(super) fn name_of(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

/// `p_vaddr - p_offset` of the segment `m` maps, read from its headers.
pub(super) fn delta_of(pid: u32, m: &ExecMapping) -> Option<i64> {
    let file = open_mapped(pid, m).ok()?;
    let bias = super::table::load_bias_of(&file, m.start, m.offset).ok()?;
    Some(m.start.wrapping_sub(m.offset).wrapping_sub(bias) as i64)
}

/// Whether `path` (as `/proc/PID/maps` shows it) is HotSpot's `libjvm.so`.
pub(crate) fn is_libjvm(path: &str) -> bool {
    std::path::Path::new(path)
        .file_name()
        .is_some_and(|n| n.to_string_lossy().trim_end_matches(" (deleted)") == "libjvm.so")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_mappings_reach_their_files_by_device_and_inode() {
        // Our own libc: the device and inode from /proc/PID/maps are what
        // stat says of the file behind the mapping.
        let maps = exec_mappings(std::process::id()).unwrap();
        let libc = maps
            .iter()
            .find(|m| m.path.contains("libc.so"))
            .expect("libc mapped");
        let file = open_mapped(std::process::id(), libc);
        assert!(file.is_ok(), "device and inode match the file");
    }
}
