//! JIT symbols from perf maps (`/tmp/perf-PID.map`: `START SIZE NAME` per
//! line, hex with or without `0x`), parsed here rather than by blazesym:
//! its parser rejects the `0x` fields JDK 17 writes and then fails the whole
//! symbolize call, and it reads files whole. A perf map belongs to the
//! profiled process's user, so it is opened through [`crate::untrusted`]
//! (no symlink, no FIFO, owner checked, size capped, not older than the
//! process) and read with caps on lines and entries.

use std::{
    io::{self, BufRead, BufReader, Read, Seek, SeekFrom},
    time::{Duration, SystemTime},
};

use crate::{
    process::{live, ProcKey},
    untrusted::{self, Dir, Expect, OpenError, Reason, What},
};

/// Largest perf map read: a busy JVM writes a few MiB.
pub const MAX_BYTES: u64 = 64 << 20;
/// Longest line kept; longer ones are skipped and counted. JDK method
/// signatures stay well below.
pub const MAX_LINE: usize = 4096;
/// Most entries kept from one map (a large JVM has a few 100k).
pub const MAX_ENTRIES: usize = 1 << 20;
/// Most bytes of names kept from one map; the lines past it are not read
/// (counted, `perf_map`/`budget`): a busy JVM's map holds a few MiB.
pub const MAX_NAME_BYTES: usize = 16 << 20;

/// [`MAX_NAME_BYTES`], or half the budget's `perf_map_names` part if less:
/// a map being read anew beside its last read then holds at most the part.
pub fn max_name_bytes() -> usize {
    MAX_NAME_BYTES.min(super::maps::budget_bytes() / 2)
}
/// A map written this long before the process started is an earlier
/// process's with the same pid (the slack covers clock granularity): the
/// start from the process table is exact (file times are a few ms
/// coarse), the one from `/proc/PID/stat` is only to the second.
const STALE_SLACK: Duration = Duration::from_millis(50);
const STALE_SLACK_PROC_STAT: Duration = Duration::from_secs(1);
/// Bytes at the start and before the end of what was read whose hashes
/// tell an appended map (read on from there) from a rewritten one (read
/// again whole).
const TAIL: u64 = 4096;

/// One JIT symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    start: u64,
    end: u64,
    name: String,
}

/// Where the last read stopped, to read only what a JIT appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    /// Device and inode of the file read.
    file: (u64, u64),
    /// End of the last whole line read.
    offset: u64,
    /// Hash of the first and of the last [`TAIL`] bytes before `offset`.
    tail: (u64, u64),
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
    mark: Option<Mark>,
    name_bytes: usize,
    /// Entries or names were left out for the caps (an append is then
    /// not read: the caps hold).
    cut: bool,
}

/// Lines parsed from a perf map, numbered in file order.
struct Lines {
    lines: Vec<(usize, Entry)>,
    /// Bytes up to the end of the last whole line.
    consumed: u64,
    name_bytes: usize,
    cut: bool,
    /// Left out for [`max_name_bytes`] (the caller counts it for the pid).
    names_cut: bool,
    /// The end was reached (or the caps: nothing more is read).
    eof: bool,
}

/// What [`PerfMap::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Read `bytes` more; `done` once the end of the file was reached.
    Read { bytes: u64, done: bool },
    /// The file was rewritten (not appended to) since the map was read:
    /// nothing read, the map unchanged (read it again into a new map).
    Rewritten,
}

impl PerfMap {
    /// Parses perf map text; malformed lines are skipped.
    #[cfg(test)]
    pub fn parse(text: &str) -> PerfMap {
        PerfMap::from_reader(text.as_bytes()).unwrap_or_default()
    }

    /// The map of `lines` (later lines win): sorted by start, keeping the
    /// last line per start and dropping earlier ranges a later one overlaps.
    fn build(mut entries: Vec<(usize, Entry)>) -> Vec<Entry> {
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
        kept.into_iter().map(|(_, e)| e).collect()
    }

    fn set_entries(&mut self, entries: Vec<Entry>) {
        self.starts = entries.iter().map(|e| e.start).collect();
        self.name_bytes = entries.iter().map(|e| e.name.len()).sum();
        self.entries = entries;
    }

    /// Parses perf map text from `reader`, keeping lines up to
    /// [`MAX_LINE`] bytes, at most [`MAX_ENTRIES`] entries and
    /// [`max_name_bytes`] of names (all counted when exceeded). Never holds
    /// more than one line besides the entries.
    #[cfg(test)]
    pub fn from_reader(reader: impl Read) -> io::Result<PerfMap> {
        let lines = read_lines(reader, 0, MAX_ENTRIES, max_name_bytes(), MAX_BYTES)?;
        let mut map = PerfMap {
            cut: lines.cut,
            ..PerfMap::default()
        };
        map.set_entries(PerfMap::build(lines.lines));
        Ok(map)
    }

    /// Reads the perf map of process `pid` (`ns_pid` in its own namespace)
    /// from its `/tmp`, if it has one that passes the checks.
    #[cfg(test)]
    pub fn read(pid: u32, ns_pid: u32) -> Result<PerfMap, OpenError> {
        let mut map = PerfMap::default();
        map.update(ProcKey::of_pid(pid), ns_pid, MAX_BYTES, true)?;
        Ok(map)
    }

    /// Reads on in process `key`'s file, about `max_bytes` at most (whole
    /// lines): from
    /// where the last read stopped when the file is the same one and what
    /// was read is unchanged (the hash of its last [`TAIL`] bytes), else,
    /// if `restart`, from the start into an emptied map (else nothing:
    /// [`Progress::Rewritten`]). On error the map is unchanged.
    pub fn update(
        &mut self,
        key: ProcKey,
        ns_pid: u32,
        max_bytes: u64,
        restart: bool,
    ) -> Result<Progress, OpenError> {
        let pid = key.pid;
        // Live: the file is opened as its owner is now.
        let status = live::Status::read(pid).ok_or_else(gone)?;
        let (started, slack) = match key.started_at() {
            Some(at) => (at, STALE_SLACK),
            None => (
                live::start_time(pid).ok_or_else(gone)?,
                STALE_SLACK_PROC_STAT,
            ),
        };
        let tmp = Dir::process_tmp(pid, What::PerfMap)?;
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
        if stamp.1 + slack < started {
            return Err(OpenError::refuse(
                What::PerfMap,
                Reason::Stale,
                tmp.shown_path(&name),
            ));
        }
        let mut file = opened.file;
        let ident = (opened.stat.st_dev, opened.stat.st_ino);
        let appended = self.mark.filter(|m| {
            m.file == ident && stamp.0 >= m.offset && tail_hash(&file, m.offset) == Some(m.tail)
        });
        if self.mark.is_some() && appended.is_none() && !restart {
            return Ok(Progress::Rewritten);
        }
        let from = match appended {
            Some(m) => {
                file.seek(SeekFrom::Start(m.offset))?;
                m.offset
            }
            None => 0,
        };
        let (old_entries, old_names) = match appended {
            Some(_) => (self.entries.len(), self.name_bytes),
            None => (0, 0),
        };
        let lines = read_lines(
            (&mut file).take(MAX_BYTES - from),
            old_entries,
            MAX_ENTRIES.saturating_sub(old_entries),
            max_name_bytes().saturating_sub(old_names),
            max_bytes,
        )?;
        if lines.names_cut {
            untrusted::refusals::count_for(What::PerfMap, Reason::Budget, pid);
        }
        let offset = from + lines.consumed;
        let mut entries = lines.lines;
        if appended.is_some() {
            let old = std::mem::take(&mut self.entries);
            entries.extend(old.into_iter().enumerate());
        } else {
            self.cut = false;
        }
        self.cut |= lines.cut;
        self.set_entries(PerfMap::build(entries));
        // Up to date with this version of the file once read to its end.
        let done = lines.eof || offset >= stamp.0;
        self.stamp = done.then_some(stamp);
        self.mark = tail_hash(&file, offset).map(|tail| Mark {
            file: ident,
            offset,
            tail,
        });
        Ok(Progress::Read {
            bytes: lines.consumed,
            done,
        })
    }

    /// Size and mtime of the file when this map was read.
    pub fn read_stamp(&self) -> Option<Stamp> {
        self.stamp
    }

    /// Where the last read stopped (what an append-only update would read
    /// from).
    pub fn read_offset(&self) -> u64 {
        self.mark.map_or(0, |m| m.offset)
    }

    /// Bytes of names held (for the symbolizer's memory budget).
    pub fn name_bytes(&self) -> usize {
        self.name_bytes
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

/// Parses the lines of `reader`, numbering them from `first`, keeping at
/// most `max_entries` entries and `max_names` bytes of names (the rest is
/// not read; counted), and stopping at the first line end past
/// `max_bytes`. Lines over [`MAX_LINE`] are skipped (counted).
fn read_lines(
    reader: impl Read,
    first: usize,
    max_entries: usize,
    max_names: usize,
    max_bytes: u64,
) -> io::Result<Lines> {
    let mut reader = BufReader::with_capacity(64 << 10, reader);
    let mut out = Lines {
        lines: Vec::new(),
        consumed: 0,
        name_bytes: 0,
        cut: false,
        names_cut: false,
        eof: false,
    };
    let mut line = Vec::with_capacity(256);
    let mut long_lines = 0u64;
    while out.consumed < max_bytes {
        line.clear();
        let (used, complete, too_long) = read_capped_line(&mut reader, &mut line, MAX_LINE)?;
        // A last line without its newline is taken but read again next
        // time (the JIT may be writing it): the second copy wins.
        if complete {
            out.consumed += used;
        } else {
            out.eof = true;
        }
        if too_long {
            long_lines += 1;
        } else if let Some(entry) = parse_line(&String::from_utf8_lossy(&line)) {
            if out.lines.len() == max_entries {
                untrusted::refusals::count(What::PerfMap, Reason::TooManyEntries);
                out.cut = true;
            } else if out.name_bytes + entry.name.len() > max_names {
                out.names_cut = true;
                out.cut = true;
            } else {
                out.name_bytes += entry.name.len();
                out.lines.push((first + out.lines.len(), entry));
            }
        }
        if out.cut {
            // The rest is not read: as good as the end.
            out.eof = true;
        }
        if out.eof {
            break;
        }
    }
    if long_lines > 0 {
        untrusted::refusals::count(What::PerfMap, Reason::LongLine);
    }
    Ok(out)
}

/// Hashes of the first and of the last [`TAIL`] bytes of `file` before
/// `offset`: a JIT appends, a rewrite changes its beginning or its end.
fn tail_hash(file: &std::fs::File, offset: u64) -> Option<(u64, u64)> {
    use std::{hash::Hasher, os::unix::fs::FileExt};
    let hash = |from: u64, to: u64| {
        let mut buf = vec![0u8; (to - from) as usize];
        file.read_exact_at(&mut buf, from).ok()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        h.write(&buf);
        Some(h.finish())
    };
    Some((
        hash(0, offset.min(TAIL))?,
        hash(offset.saturating_sub(TAIL), offset)?,
    ))
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
    Dir::process_tmp(pid, What::PerfMap)
        .ok()
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
/// `max` bytes: returns (bytes consumed, the line ended with a newline,
/// the line was too long and was skipped to its end).
fn read_capped_line(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<(u64, bool, bool)> {
    let mut too_long = false;
    let mut used_all = 0u64;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok((used_all, false, too_long));
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
        used_all += used as u64;
        if newline.is_some() {
            return Ok((used_all, true, too_long));
        }
    }
}

#[cfg(test)]
mod tests;
