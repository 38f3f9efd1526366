//! Snapshots of `/proc/PID/maps`.
//!
//! blazesym can cache a process's mappings itself, but never refreshes them
//! and cannot tell us which module an unresolved address belongs to; we need
//! both (refresh after dlopen, `module+0xOFF` for misses, anonymous
//! executable regions for JIT code), so we keep our own small table.

use std::{fs, io, path::PathBuf};

use super::{files::FileKey, mapped::hotspot_libjvm};

/// Executable mappings kept per process (the first, by address): a
/// process may map tens of thousands, and the table holds up to
/// [`super::MAX_IMAGES`] images. Real programs map a few hundred (a JVM,
/// Chromium: under 1,000).
pub const MAX_MAPPINGS: usize = 4096;

/// What backs a mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// A file, identified by device and inode so one table serves all
    /// processes that map it.
    File { path: PathBuf, dev: u64, inode: u64 },
    /// The vDSO.
    Vdso,
    /// Anonymous memory or a pseudo-file such as `[heap]` (JIT code lives here).
    Anon { name: String },
}

impl Backing {
    /// Bytes of its path or name.
    pub fn text_len(&self) -> usize {
        match self {
            Backing::File { path, .. } => path.as_os_str().len(),
            Backing::Vdso => 0,
            Backing::Anon { name } => name.len(),
        }
    }
}

/// One executable mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub backing: Backing,
}

impl Mapping {
    /// File offset of an address inside this mapping.
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }
}

/// The executable mappings of one process, sorted by start address.
#[derive(Debug, Clone, Default)]
pub struct ProcMaps {
    mappings: Vec<Mapping>,
}

impl ProcMaps {
    /// Reads `/proc/PID/maps`.
    pub(in crate::process) fn read(pid: u32) -> io::Result<ProcMaps> {
        Ok(ProcMaps::parse(&fs::read_to_string(format!(
            "/proc/{pid}/maps"
        ))?))
    }

    /// Parses the text of a maps file, keeping executable mappings only;
    /// malformed lines are skipped.
    pub fn parse(text: &str) -> ProcMaps {
        let mut mappings: Vec<Mapping> = text
            .lines()
            .filter_map(parse_line)
            .take(MAX_MAPPINGS)
            .collect();
        mappings.sort_by_key(|m| m.start);
        ProcMaps { mappings }
    }

    /// The mapping that holds `addr`.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        let m = self.mappings.get(i.checked_sub(1)?)?;
        (addr < m.end).then_some(m)
    }

    /// The mappings, by start address.
    pub fn iter(&self) -> impl Iterator<Item = &Mapping> {
        self.mappings.iter()
    }

    /// Number of executable mappings.
    pub fn len(&self) -> usize {
        self.mappings.len()
    }

    /// Whether these are a HotSpot JVM's mappings (see
    /// [`hotspot_libjvm`]).
    pub fn is_hotspot(&self) -> bool {
        let paths = self.iter().filter_map(|m| match &m.backing {
            Backing::File { path, .. } => Some(path.to_string_lossy()),
            _ => None,
        });
        hotspot_libjvm(paths).is_some()
    }

    /// True when no executable mapping was found.
    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty()
    }
}

/// The fields of one line of a maps file.
struct Line<'a> {
    start: u64,
    end: u64,
    perms: &'a [u8],
    offset: &'a str,
    /// Device and inode, for a mapped file (inode not 0).
    file: Option<FileKey>,
    name: &'a str,
}

fn split_line(line: &str) -> Option<Line<'_>> {
    // address perms offset dev inode [pathname]
    let mut fields = line.splitn(6, ' ');
    let (range, perms, offset, dev, inode) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let name = fields.next().unwrap_or("").trim_start();
    let (start, end) = range.split_once('-')?;
    let inode: u64 = inode.trim().parse().ok()?;
    let file = if inode == 0 {
        None
    } else {
        let (major, minor) = dev.split_once(':')?;
        Some(FileKey {
            dev: libc::makedev(
                u32::from_str_radix(major, 16).ok()?,
                u32::from_str_radix(minor, 16).ok()?,
            ),
            inode,
        })
    };
    Some(Line {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms: perms.as_bytes(),
        offset,
        file,
        name,
    })
}

fn parse_line(line: &str) -> Option<Mapping> {
    let l = split_line(line)?;
    if l.perms.get(2) != Some(&b'x') {
        return None;
    }
    let offset = u64::from_str_radix(l.offset, 16).ok()?;
    let backing = match l.file {
        _ if l.name == "[vdso]" => Backing::Vdso,
        Some(FileKey { dev, inode }) if l.name.starts_with('/') => Backing::File {
            path: PathBuf::from(l.name),
            dev,
            inode,
        },
        _ => Backing::Anon {
            name: l.name.to_string(),
        },
    };
    (l.start < l.end).then_some(Mapping {
        start: l.start,
        end: l.end,
        offset,
        backing,
    })
}

/// One mapping of any kind, as far as checking where an address lies
/// needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub writable: bool,
    /// The file mapped, if any.
    pub file: Option<FileKey>,
}

/// Every mapping of `pid` (not only executable ones), by address, at most
/// [`MAX_REGIONS`].
pub(in crate::process) fn regions(pid: u32) -> io::Result<Vec<Region>> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_regions(&text))
}

/// The mappings of `pid` whose name starts with one of `names` (the
/// process context's `OTEL_CTX`), at most [`MAX_REGIONS`] lines looked at.
pub(in crate::process) fn regions_named(pid: u32, names: &[&str]) -> io::Result<Vec<Region>> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_named(&text, names))
}

fn parse_named(text: &str, names: &[&str]) -> Vec<Region> {
    regions_where(text, |name| names.iter().any(|n| name.starts_with(n)))
}

/// Mappings [`regions`](crate::process::live::regions) keeps: a JVM maps a few thousand.
pub const MAX_REGIONS: usize = 65_536;

fn parse_regions(text: &str) -> Vec<Region> {
    regions_where(text, |_| true)
}

/// The first [`MAX_REGIONS`] mappings of `text` whose name `keep` takes.
fn regions_where(text: &str, keep: impl Fn(&str) -> bool) -> Vec<Region> {
    text.lines()
        .filter_map(split_line)
        .take(MAX_REGIONS)
        .filter(|l| keep(l.name))
        .map(|l| Region {
            start: l.start,
            end: l.end,
            writable: l.perms.starts_with(b"rw"),
            file: l.file,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c8a00000-55d0c8a01000 r--p 00000000 fe:01 1234 /usr/bin/work
55d0c8a01000-55d0c8a02000 r-xp 00001000 fe:01 1234 /usr/bin/work
7f0000000000-7f0000100000 rwxp 00000000 00:00 0 
7f1000000000-7f1000020000 r-xp 00028000 08:02 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
garbage line
";

    #[test]
    fn keeps_executable_mappings_and_finds_addresses() {
        let maps = ProcMaps::parse(SAMPLE);
        assert_eq!(maps.len(), 4);
        let m = maps.find(0x55d0c8a01010).unwrap();
        assert_eq!(m.file_offset(0x55d0c8a01010), 0x1010);
        assert!(
            matches!(&m.backing, Backing::File { path, inode: 1234, .. } if path.ends_with("work"))
        );
        assert!(matches!(
            maps.find(0x7f0000000010).unwrap().backing,
            Backing::Anon { .. }
        ));
        assert_eq!(maps.find(0x7ffd00000001).unwrap().backing, Backing::Vdso);
        let libc = maps.find(0x7f1000000100).unwrap();
        assert_eq!(libc.file_offset(0x7f1000000100), 0x28100);
        assert!(maps.find(0x55d0c8a00010).is_none(), "not executable");
        assert!(maps.find(0x7f1000020000).is_none(), "end is exclusive");
        assert!(maps.find(1).is_none());
    }

    #[test]
    fn regions_keep_every_mapping_with_its_file() {
        let r = parse_regions(SAMPLE);
        assert_eq!(r.len(), 5);
        assert!(!r[0].writable && r[2].writable);
        assert_eq!(
            r[3].file,
            Some(FileKey {
                dev: libc::makedev(8, 2),
                inode: 99
            })
        );
        assert_eq!(r[2].file, None);
    }

    #[test]
    fn named_regions_by_prefix() {
        let text = "7f00-7f01 rw-s 0 00:01 32040 /memfd:OTEL_CTX (deleted)\n8000-9000 rw-p 0 00:00 0 [anon:other]\n";
        let r = parse_named(text, &["/memfd:OTEL_CTX", "[anon:OTEL_CTX]"]);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].start, r[0].end), (0x7f00, 0x7f01));
    }

    #[test]
    fn path_with_spaces_survives() {
        let maps = ProcMaps::parse("1000-2000 r-xp 0 fe:01 7 /opt/my app/bin\n");
        assert!(
            matches!(&maps.find(0x1000).unwrap().backing, Backing::File { path, .. } if path.to_str() == Some("/opt/my app/bin"))
        );
    }
}
