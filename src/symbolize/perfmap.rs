//! JIT symbols from perf maps (`/tmp/perf-PID.map`: `START SIZE NAME` per
//! line, hex with or without `0x`), parsed here rather than by blazesym:
//! its parser rejects the `0x` fields JDK 17 writes and then fails the whole
//! symbolize call. Files belong to other users, so reads are bounded and
//! never follow symlinks.

use std::{
    fs::File,
    io::{self, Read},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    time::SystemTime,
};

/// Largest perf map read (a busy JVM writes a few MiB).
const MAX_BYTES: u64 = 64 << 20;

/// One JIT symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    start: u64,
    end: u64,
    name: String,
}

/// A parsed perf map, sorted by start; where entries overlap, the later
/// line in the file wins (the JIT reused the address).
#[derive(Debug, Clone, Default)]
pub struct PerfMap {
    entries: Vec<Entry>,
    /// `entries[i].start`, apart: the lookup's binary search stays in cache.
    starts: Vec<u64>,
    /// Size and mtime when read, to notice the JIT appending.
    stamp: Option<(u64, SystemTime)>,
}

impl PerfMap {
    /// Parses perf map text; malformed lines are skipped.
    pub fn parse(text: &str) -> PerfMap {
        let mut entries: Vec<(usize, Entry)> = text
            .lines()
            .enumerate()
            .filter_map(|(i, line)| parse_line(line).map(|e| (i, e)))
            .collect();
        // Later lines win: sort by start, then keep the last line per start
        // and drop earlier ranges a later one overlaps.
        entries.sort_by_key(|(i, e)| (e.start, *i));
        let mut kept: Vec<(usize, Entry)> = Vec::with_capacity(entries.len());
        for (i, e) in entries {
            while let Some((j, prev)) = kept.last() {
                if prev.end > e.start && *j < i {
                    kept.pop();
                } else {
                    break;
                }
            }
            if kept.last().is_none_or(|(_, prev)| prev.end <= e.start) {
                kept.push((i, e));
            }
        }
        let entries: Vec<Entry> = kept.into_iter().map(|(_, e)| e).collect();
        PerfMap {
            starts: entries.iter().map(|e| e.start).collect(),
            entries,
            stamp: None,
        }
    }

    /// Reads a perf map file, refusing symlinks and files over 64 MiB.
    pub fn read(path: &Path) -> io::Result<PerfMap> {
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        let mut text = String::new();
        file.take(MAX_BYTES).read_to_string(&mut text)?;
        let mut map = PerfMap::parse(&text);
        map.stamp = Some((meta.size(), meta.modified()?));
        Ok(map)
    }

    /// Whether the file at `path` changed since this map was read.
    pub fn is_stale(&self, path: &Path) -> bool {
        let now = std::fs::symlink_metadata(path)
            .ok()
            .and_then(|m| Some((m.size(), m.modified().ok()?)));
        now != self.stamp
    }

    /// The symbol covering `addr`.
    #[cfg(test)]
    pub fn find(&self, addr: u64) -> Option<&str> {
        self.index_of(addr).map(|i| self.name(i))
    }

    /// Index of the entry covering `addr`, for callers that cache per entry.
    pub fn index_of(&self, addr: u64) -> Option<usize> {
        let i = self.starts.partition_point(|&s| s <= addr).checked_sub(1)?;
        (addr < self.entries[i].end).then_some(i)
    }

    /// Name of entry `i` (from [`PerfMap::index_of`]).
    pub fn name(&self, i: usize) -> &str {
        &self.entries[i].name
    }

    /// Number of entries.
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }
}

fn hex(field: &str) -> Option<u64> {
    let digits = field
        .strip_prefix("0x")
        .or_else(|| field.strip_prefix("0X"))
        .unwrap_or(field);
    u64::from_str_radix(digits, 16).ok()
}

fn parse_line(line: &str) -> Option<Entry> {
    let mut parts = line.trim_end().splitn(3, ' ');
    let start = hex(parts.next()?)?;
    let size = hex(parts.next()?)?;
    let name = parts.next()?.trim();
    if size == 0 || name.is_empty() {
        return None;
    }
    Some(Entry {
        start,
        end: start.checked_add(size)?,
        name: name.to_string(),
    })
}

/// Where `pid`'s perf map is, as seen from our mount namespace: the JVM
/// names it by its own (namespaced) pid, in its own `/tmp`.
pub fn path_for(pid: u32, ns_pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root/tmp/perf-{ns_pid}.map"))
}

/// The innermost pid of `pid` (`NSpid` in `/proc/PID/status`), or `pid`.
pub fn ns_pid(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("NSpid:"))?;
            line.split_whitespace().last()?.parse().ok()
        })
        .unwrap_or(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_and_without_0x_and_later_lines_win() {
        let map = PerfMap::parse(
            "0x00007f76bcec71c0 0x0000000000000270 java.lang.String::hashCode\n\
             7f76bcec8000 100 Interpreter\n\
             garbage\n\
             7f76bcec9000 0 empty\n\
             7f76bcec71c0 10 LFoo;::bar (reused)\n",
        );
        assert_eq!(map.find(0x7f76bcec71c5), Some("LFoo;::bar (reused)"));
        assert_eq!(map.find(0x7f76bcec8050), Some("Interpreter"));
        assert_eq!(map.find(0x7f76bcec8100), None, "end is exclusive");
        assert_eq!(
            map.find(0x7f76bcec71c0 + 0x100),
            None,
            "the reused range replaced the old one"
        );
        assert_eq!(map.entries.len(), 2);
    }

    #[test]
    fn reads_files_but_not_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("perf-1.map");
        std::fs::write(&file, "1000 10 a\n").unwrap();
        let map = PerfMap::read(&file).unwrap();
        assert_eq!(map.find(0x1008), Some("a"));
        assert!(!map.is_stale(&file));
        std::fs::write(&file, "1000 10 a\n2000 10 b\n").unwrap();
        assert!(map.is_stale(&file));
        let link = dir.path().join("perf-2.map");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(PerfMap::read(&link).is_err());
    }

    #[test]
    fn namespaced_pid_falls_back_to_the_pid() {
        assert_eq!(ns_pid(std::process::id()), std::process::id());
        assert_eq!(ns_pid(u32::MAX), u32::MAX);
        assert_eq!(path_for(7, 1), PathBuf::from("/proc/7/root/tmp/perf-1.map"));
    }
}
