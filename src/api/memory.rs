//! The daemon's own resident memory, by kind, from `/proc/self/status`.

use serde::Serialize;

/// Resident memory of this process in bytes.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Rss {
    /// Heap, stacks and other private memory (`RssAnon`).
    pub anon_bytes: u64,
    /// Mapped files: the binary, libraries, mapped ELF files (`RssFile`).
    pub file_bytes: u64,
    /// Shared memory (`RssShmem`).
    pub shmem_bytes: u64,
}

impl Rss {
    /// This process's figures; `None` if `/proc` cannot be read.
    pub fn of_self() -> Option<Rss> {
        parse(&std::fs::read_to_string("/proc/self/status").ok()?)
    }

    /// All resident memory.
    pub fn total_bytes(&self) -> u64 {
        self.anon_bytes + self.file_bytes + self.shmem_bytes
    }
}

/// The `RssAnon`, `RssFile` and `RssShmem` lines (in kB) of a status file.
fn parse(status: &str) -> Option<Rss> {
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        let value = line[key.len()..].trim().strip_suffix("kB")?.trim();
        value.parse::<u64>().ok().map(|k| k * 1024)
    };
    Some(Rss {
        anon_bytes: kib("RssAnon:")?,
        file_bytes: kib("RssFile:")?,
        shmem_bytes: kib("RssShmem:").unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_rss_lines() {
        let status = "Name:\tws\nVmRSS:\t  3000 kB\nRssAnon:\t    2000 kB\nRssFile:\t     900 kB\nRssShmem:\t 100 kB\n";
        let rss = parse(status).unwrap();
        assert_eq!(rss.anon_bytes, 2000 * 1024);
        assert_eq!(rss.total_bytes(), 3000 * 1024);
        assert_eq!(parse("Name: x\n"), None);
        assert!(Rss::of_self().is_some_and(|r| r.anon_bytes > 0));
    }
}
