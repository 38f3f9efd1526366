//! JIT symbols from perf maps (`/tmp/perf-PID.map`: `START SIZE NAME` per
//! line, hex with or without `0x`), parsed here rather than by blazesym:
//! its parser rejects the `0x` fields JDK 17 writes and then fails the whole
//! symbolize call, and it reads files whole. A perf map belongs to the
//! profiled process's user, so it is opened through [`crate::untrusted`]
//! (no symlink, no FIFO, owner checked, size capped, not older than the
//! process) and read with caps on lines and entries.

use std::{
    io::{self, BufRead, BufReader, Read},
    time::{Duration, SystemTime},
};

use crate::{
    procinfo,
    untrusted::{self, Dir, Expect, OpenError, Reason, What},
};

/// Largest perf map read: a busy JVM writes a few MiB.
pub const MAX_BYTES: u64 = 64 << 20;
/// Longest line kept; longer ones are skipped and counted. JDK method
/// signatures stay well below.
pub const MAX_LINE: usize = 4096;
/// Most entries kept from one map (a large JVM has a few 100k).
pub const MAX_ENTRIES: usize = 1 << 20;
/// A map written this long before the process started is an earlier
/// process's with the same pid (the slack covers clock granularity).
const STALE_SLACK: Duration = Duration::from_secs(1);

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

    /// Parses perf map text from `reader`, keeping lines up to
    /// [`MAX_LINE`] bytes and at most [`MAX_ENTRIES`] entries (both counted
    /// when exceeded). Never holds more than one line in memory.
    pub fn from_reader(reader: impl Read) -> io::Result<PerfMap> {
        let mut reader = BufReader::with_capacity(64 << 10, reader);
        let mut text = String::new();
        let mut line = Vec::with_capacity(256);
        let (mut entries, mut long_lines) = (0usize, 0u64);
        loop {
            line.clear();
            let (complete, too_long) = read_capped_line(&mut reader, &mut line, MAX_LINE)?;
            if too_long {
                long_lines += 1;
            } else if !line.is_empty() {
                if entries == MAX_ENTRIES {
                    untrusted::refusals::count(What::PerfMap, Reason::TooManyEntries);
                    break;
                }
                entries += 1;
                text.push_str(&String::from_utf8_lossy(&line));
                text.push('\n');
            }
            if !complete {
                break;
            }
        }
        if long_lines > 0 {
            untrusted::refusals::count(What::PerfMap, Reason::LongLine);
        }
        Ok(PerfMap::parse(&text))
    }

    /// Reads the perf map of process `pid` (`ns_pid` in its own namespace)
    /// from its `/tmp`, if it has one that passes the checks.
    pub fn read(pid: u32, ns_pid: u32) -> Result<PerfMap, OpenError> {
        let status = procinfo::Status::read(pid).ok_or_else(gone)?;
        let started = procinfo::start_time(pid).ok_or_else(gone)?;
        let tmp = Dir::proc_link(pid, "root")?.sub("tmp", What::PerfMap)?;
        let name = file_name(ns_pid);
        let opened = tmp.open(
            &name,
            What::PerfMap,
            &Expect {
                owner: Some(status.euid),
                max_bytes: MAX_BYTES,
                identity: None,
            },
        )?;
        let stamp = stamp_of(&opened.stat);
        if stamp.1 + STALE_SLACK < started {
            return Err(OpenError::refuse(
                What::PerfMap,
                Reason::Stale,
                format!("/proc/{pid}/root/tmp/{name}"),
            ));
        }
        let mut map = PerfMap::from_reader(opened.file.take(MAX_BYTES))?;
        map.stamp = Some(stamp);
        Ok(map)
    }

    /// Size and mtime of the file when this map was read.
    pub fn read_stamp(&self) -> Option<Stamp> {
        self.stamp
    }

    /// Bytes of names held (for the symbolizer's memory budget).
    pub fn name_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.name.len()).sum()
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

fn file_name(ns_pid: u32) -> String {
    format!("perf-{ns_pid}.map")
}

fn gone() -> OpenError {
    OpenError::Io(io::Error::from(io::ErrorKind::NotFound))
}

/// Size and mtime of process `pid`'s perf map now, if there is one.
pub fn stamp(pid: u32, ns_pid: u32) -> Option<Stamp> {
    Dir::proc_link(pid, "root")
        .ok()
        .and_then(|root| root.sub("tmp", What::PerfMap).ok())
        .and_then(|tmp| tmp.stat(&file_name(ns_pid)).ok())
        .map(|st| stamp_of(&st))
}

/// Size and mtime of a perf map: a change means the JIT wrote it again.
pub type Stamp = (u64, SystemTime);

fn stamp_of(st: &libc::stat) -> (u64, SystemTime) {
    let mtime = SystemTime::UNIX_EPOCH
        + Duration::new(
            st.st_mtime.max(0) as u64,
            st.st_mtime_nsec.clamp(0, 999_999_999) as u32,
        );
    (st.st_size.max(0) as u64, mtime)
}

/// Reads one line into `line` (without its newline), keeping at most
/// `max` bytes: returns (more input may follow, the line was too long and
/// was skipped to its end).
fn read_capped_line(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<(bool, bool)> {
    let mut too_long = false;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok((false, too_long));
        }
        let (chunk, newline) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i)),
            None => (buf, None),
        };
        if !too_long {
            if line.len() + chunk.len() > max {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = newline.map_or(chunk.len(), |i| i + 1);
        reader.consume(used);
        if newline.is_some() {
            return Ok((true, too_long));
        }
    }
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
    fn long_lines_are_skipped_without_being_held() {
        let before = untrusted::refusals::get(What::PerfMap, Reason::LongLine);
        let mut text = String::from("1000 10 a\n");
        text.push_str(&format!("2000 10 {}\n", "x".repeat(10 << 20)));
        text.push_str("3000 10 c");
        let map = PerfMap::from_reader(io::Cursor::new(text)).unwrap();
        assert_eq!(map.find(0x1001), Some("a"));
        assert_eq!(map.find(0x2001), None);
        assert_eq!(map.find(0x3001), Some("c"), "a last line without newline");
        assert!(untrusted::refusals::get(What::PerfMap, Reason::LongLine) > before);
        assert!(map.name_bytes() < 10);
    }

    #[test]
    fn our_own_perf_map_is_read_checked_and_refused_when_unsafe() {
        // One test for every variant: they share our pid's file name.
        let me = std::process::id();
        let path = std::path::PathBuf::from(format!("/tmp/perf-{me}.map"));
        let _ = std::fs::remove_file(&path);
        std::fs::write(&path, "1000 10 a\n").unwrap();
        let map = PerfMap::read(me, me).unwrap();
        assert_eq!(map.find(0x1008), Some("a"));
        assert_eq!(stamp(me, me), map.read_stamp());
        std::fs::write(&path, "1000 10 a\n2000 10 b\n").unwrap();
        assert_ne!(stamp(me, me), map.read_stamp());

        // Older than the process: an earlier process's with our pid.
        let old = std::fs::File::options().write(true).open(&path).unwrap();
        old.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000))
            .unwrap();
        drop(old);
        let reason = |r: Result<PerfMap, OpenError>| r.err().and_then(|e| e.reason());
        assert_eq!(reason(PerfMap::read(me, me)), Some(Reason::Stale));

        std::fs::remove_file(&path).unwrap();
        let target = std::path::PathBuf::from(format!("/tmp/perf-target-{me}"));
        std::fs::write(&target, "1000 10 secret\n").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert_eq!(reason(PerfMap::read(me, me)), Some(Reason::Symlink));
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&target).unwrap();

        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(reason(PerfMap::read(me, me)), Some(Reason::WrongType));
        std::fs::remove_file(&path).unwrap();

        std::fs::File::create(&path)
            .unwrap()
            .set_len(2 << 30)
            .unwrap();
        assert_eq!(reason(PerfMap::read(me, me)), Some(Reason::TooBig));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(PerfMap::read(me, me), Err(OpenError::Io(_))));
    }
}
