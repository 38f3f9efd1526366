//! The daemon's own process (`/proc/self`) and the host's kernel files
//! (`/proc/sys`, `/proc/loadavg`, `/proc/kallsyms`). These are the
//! kernel's files, not another user's, so plain reads are safe; they are
//! read here so that every `/proc` path of the daemon is in this module.

use std::{fs, os::unix::fs::MetadataExt};

/// What the daemon reads of its own `/proc/self/status`, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OwnStatus {
    /// `RssAnon`, `RssFile` and `RssShmem` (0 when absent).
    pub rss_anon: u64,
    pub rss_file: u64,
    pub rss_shmem: u64,
    /// `VmRSS` and `VmHWM`.
    pub vm_rss: Option<u64>,
    pub vm_hwm: Option<u64>,
    /// `CapEff`: the effective capability set.
    pub cap_eff: Option<u64>,
}

/// The daemon's status; `None` if `/proc` cannot be read or lacks the
/// resident-memory lines.
pub fn status() -> Option<OwnStatus> {
    parse_status(&fs::read_to_string("/proc/self/status").ok()?)
}

fn parse_status(text: &str) -> Option<OwnStatus> {
    let kib = |key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        let value = line[key.len()..].trim().strip_suffix("kB")?.trim();
        value.parse::<u64>().ok().map(|k| k * 1024)
    };
    let cap_eff = text
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok());
    Some(OwnStatus {
        rss_anon: kib("RssAnon:")?,
        rss_file: kib("RssFile:")?,
        rss_shmem: kib("RssShmem:").unwrap_or(0),
        vm_rss: kib("VmRSS:"),
        vm_hwm: kib("VmHWM:"),
        cap_eff,
    })
}

/// CPU time of the daemon so far (`utime + stime`), in seconds.
pub fn cpu_seconds() -> Option<f64> {
    let ticks = cpu_ticks(&fs::read_to_string("/proc/self/stat").ok()?)?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 / per_second as f64)
}

/// `utime + stime` from a `/proc/PID/stat` line; the name may hold spaces
/// and parentheses, so fields are counted after the last `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    // Field 3 (state) is at index 0: utime is field 14, stime field 15.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Resident set size of the daemon, from `/proc/self/statm`.
pub fn resident_bytes() -> Option<u64> {
    let statm = fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().map(|page| pages * page)
}

/// The daemon's executable: its size and inode (0s if unreadable).
pub fn exe_size_and_inode() -> (u64, u64) {
    fs::metadata("/proc/self/exe").map_or((0, 0), |m| (m.len(), m.ino()))
}

/// Resident bytes of some of the daemon's mappings (`/proc/self/smaps`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MappedRss {
    /// The mappings of the executable.
    pub exe: u64,
    /// The mappings of the files asked about.
    pub others: u64,
    /// BPF maps mapped into the daemon (ring buffers, mmapable arrays).
    pub bpf_maps: u64,
}

/// Resident bytes, from `/proc/self/smaps`, of the mappings of inode
/// `exe`, of those of the inodes in `others` and of the BPF maps.
pub fn smaps_rss(exe: u64, others: &[u64]) -> MappedRss {
    fs::read_to_string("/proc/self/smaps")
        .map_or(MappedRss::default(), |text| parse_smaps(&text, exe, others))
}

/// What a mapping's bytes count towards.
#[derive(Clone, Copy)]
enum Mapping {
    Exe,
    Other,
    BpfMap,
    Uncounted,
}

/// Inodes only: the device smaps shows is the filesystem's, which for an
/// overlay is not the file's `st_dev`; two of these inodes on different
/// devices are unlikely and would only move bytes between two sums.
fn parse_smaps(text: &str, exe: u64, others: &[u64]) -> MappedRss {
    let mut rss = MappedRss::default();
    let mut current = Mapping::Uncounted;
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // `start-end perms offset dev inode [path]`
            let inode: u64 = fields.nth(3).and_then(|i| i.parse().ok()).unwrap_or(0);
            current = match fields.next() {
                Some("anon_inode:bpf-map") => Mapping::BpfMap,
                _ if inode != 0 && inode == exe => Mapping::Exe,
                _ if inode != 0 && others.contains(&inode) => Mapping::Other,
                _ => Mapping::Uncounted,
            };
        } else if first == "Rss:" {
            let bytes = fields
                .next()
                .and_then(|k| k.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024;
            match current {
                Mapping::Exe => rss.exe += bytes,
                Mapping::Other => rss.others += bytes,
                Mapping::BpfMap => rss.bpf_maps += bytes,
                Mapping::Uncounted => {}
            }
        }
    }
    rss
}

/// The daemon's threads (tids).
pub fn task_ids() -> Vec<u32> {
    let Ok(tasks) = fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
        .collect()
}

/// The kernel's cap on open files per process (`fs.nr_open`).
pub fn nr_open() -> Option<u64> {
    fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Threads on the host now: the total of `/proc/loadavg`'s 4th field.
pub fn host_threads() -> u32 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok())
        .unwrap_or(0)
}

/// Bytes the kernel's symbols take once parsed (blazesym's estimate: the
/// names and 48 bytes a symbol), from `/proc/kallsyms`.
pub fn kallsyms_bytes() -> u64 {
    let Ok(text) = fs::read_to_string("/proc/kallsyms") else {
        return 0;
    };
    let symbols = text.lines().count() as u64;
    let names: u64 = text
        .lines()
        .filter_map(|l| l.split_ascii_whitespace().nth(2))
        .map(|n| n.len() as u64)
        .sum();
    names + symbols * 48
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_status_lines() {
        let text = "Name:\tws\nVmHWM:\t  4000 kB\nVmRSS:\t  3000 kB\nRssAnon:\t    2000 kB\n\
                    RssFile:\t     900 kB\nRssShmem:\t 100 kB\nCapEff:\t000001c4000800c4\n";
        let s = parse_status(text).unwrap();
        assert_eq!(
            (s.rss_anon, s.rss_file, s.rss_shmem),
            (2000 << 10, 900 << 10, 100 << 10)
        );
        assert_eq!((s.vm_rss, s.vm_hwm), (Some(3000 << 10), Some(4000 << 10)));
        assert_eq!(s.cap_eff, Some(0x1c4000800c4));
        assert_eq!(parse_status("Name: x\n"), None);
        assert!(status().is_some_and(|s| s.rss_anon > 0));
    }

    #[test]
    fn cpu_ticks_skip_odd_names() {
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 1 2 3";
        assert_eq!(cpu_ticks(stat), Some(12));
        assert_eq!(cpu_ticks("42 (x) S 1"), None);
        assert!(cpu_seconds().is_some() && resident_bytes().is_some_and(|b| b > 0));
    }

    #[test]
    fn smaps_rss_is_summed_by_file() {
        let smaps = "\
55d0a0000000-55d0a0100000 r--p 00000000 fd:01 77 /usr/bin/wallscope
Size:               1024 kB
Rss:                 400 kB
55d0a0100000-55d0a0200000 r-xp 00100000 fd:01 77 /usr/bin/wallscope
Rss:                 600 kB
7f0000000000-7f0001000000 r--p 00000000 00:2f 12 /usr/lib/libLLVM.so
Rss:                1000 kB
7f0001000000-7f0002000000 rw-p 00000000 00:00 0
Rss:                9000 kB
7f0003000000-7f0003100000 rw-s 00000000 00:0f 1059 anon_inode:bpf-map
Rss:                  64 kB
";
        let rss = parse_smaps(smaps, 77, &[12]);
        assert_eq!(
            (rss.exe, rss.others, rss.bpf_maps),
            (1000 << 10, 1000 << 10, 64 << 10)
        );
        assert_eq!(parse_smaps(smaps, 77, &[]).others, 0);
    }

    #[test]
    fn host_figures_read() {
        assert!(host_threads() > 0);
        assert!(task_ids().contains(&(unsafe { libc::gettid() } as u32)));
        assert!(nr_open().is_some_and(|n| n >= 1024));
    }
}
