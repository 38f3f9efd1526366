//! The row array's default size, from the host: 1 MiB per GiB of RAM,
//! within [`MIN_MB`]..=[`MAX_MB`] (`--unwind-table-mb` overrides it).
//!
//! Why RAM: a host's RAM bounds how many services it runs, and so how many
//! distinct executable files need tables; counting the files mapped at
//! start would miss those started later. The array is kernel memory in
//! the daemon's cgroup, outside `--memory-mb`: the ceiling keeps it within
//! the quarter of `MemoryMax` the unit leaves for BPF maps.

/// The least default: about 1.4 million rows, glibc's table 28k of them.
pub const MIN_MB: u64 = 16;
/// The largest default.
pub const MAX_MB: u64 = 32;

/// The default MiB of the row array for a host of `ram_bytes` (`None`:
/// unknown, the least).
pub fn default_table_mb(ram_bytes: Option<u64>) -> u64 {
    ram_bytes.map_or(MIN_MB, |b| (b >> 30).clamp(MIN_MB, MAX_MB))
}

/// The host's RAM in bytes, as the kernel reports it.
pub fn host_ram_bytes() -> Option<u64> {
    // SAFETY: `sysinfo` is plain integers: all zeroes is a valid value.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable `sysinfo` the call fills.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return None;
    }
    Some(info.totalram.saturating_mul(u64::from(info.mem_unit)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_follows_the_hosts_ram_within_bounds() {
        const GIB: u64 = 1 << 30;
        assert_eq!(default_table_mb(None), MIN_MB);
        assert_eq!(default_table_mb(Some(4 * GIB)), MIN_MB);
        assert_eq!(default_table_mb(Some(23 * GIB + 5)), 23);
        assert_eq!(default_table_mb(Some(512 * GIB)), MAX_MB);
        assert!(host_ram_bytes().is_some_and(|b| b > 0));
    }
}
