//! What `/proc` says of a process, its threads and the host: memory
//! (`status`), CPU ticks (`stat`, per process or per thread, kept across
//! threads' exits by [`ThreadCpu`]), the host's CPU and load average.

use anyhow::{ensure, Context, Result};
use std::collections::BTreeMap;
use std::fs;

/// Clock ticks per second, the unit of `stat`'s CPU times.
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// A `/proc/PID/status` field in KiB (`VmRSS:`, `VmHWM:`, `RssAnon:`...).
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find_map(|l| l.strip_prefix(field));
    let kib = line.and_then(|l| l.split_whitespace().next()?.parse().ok());
    kib.with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// `(comm, utime + stime in ticks)` of a `stat` file's text. The comm is
/// read up to the last `)`: a thread may name itself with one.
pub fn stat_ticks(stat: &str) -> Result<(String, u64)> {
    let (head, after_comm) = stat.rsplit_once(')').context("bad stat")?;
    let comm = head.split_once('(').context("bad stat")?.1.to_string();
    let f: Vec<&str> = after_comm.split_whitespace().collect();
    ensure!(f.len() > 12, "short stat");
    Ok((comm, f[11].parse::<u64>()? + f[12].parse::<u64>()?))
}

/// Each live thread of `pid`: tid to `(comm, CPU ticks)`. A thread that
/// exits while it is read is left out.
pub fn thread_ticks(pid: u32) -> Result<BTreeMap<u32, (String, u64)>> {
    let dir = fs::read_dir(format!("/proc/{pid}/task"))?;
    let mut out = BTreeMap::new();
    for entry in dir.flatten() {
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Ok(stat) = fs::read_to_string(entry.path().join("stat")) {
            out.insert(tid, stat_ticks(&stat)?);
        }
    }
    Ok(out)
}

/// The host's 1-, 5- and 15-minute load averages (`/proc/loadavg`).
pub fn load_average() -> Result<[f64; 3]> {
    let text = fs::read_to_string("/proc/loadavg")?;
    let v: Vec<f64> = text
        .split_whitespace()
        .take(3)
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    ensure!(v.len() == 3, "short /proc/loadavg: {text:?}");
    Ok([v[0], v[1], v[2]])
}

/// Processes forked on the host since boot (`processes` in `/proc/stat`).
pub fn host_forks() -> Result<u64> {
    let stat = fs::read_to_string("/proc/stat")?;
    let line = stat.lines().find_map(|l| l.strip_prefix("processes "));
    Ok(line.context("no processes in /proc/stat")?.trim().parse()?)
}

/// A process's CPU ticks by thread, kept across samples: a thread's
/// first sample (0 for one born after the first) and last.
#[derive(Default)]
pub struct ThreadCpu {
    /// tid to `(comm, ticks at its first sample, ticks at its last)`.
    seen: BTreeMap<u32, (String, u64, u64)>,
    sampled: bool,
}

impl ThreadCpu {
    pub fn sample(&mut self, pid: u32) -> Result<()> {
        for (tid, (comm, ticks)) in thread_ticks(pid)? {
            let first = if self.sampled { 0 } else { ticks };
            let e = self.seen.entry(tid).or_insert((comm.clone(), first, ticks));
            (e.0, e.2) = (comm, ticks);
        }
        self.sampled = true;
        Ok(())
    }

    /// CPU seconds used between the first and last samples, by thread
    /// name, most first. A thread that exited between two samples loses
    /// its time since the earlier one.
    pub fn by_name(&self) -> Vec<(String, f64)> {
        let mut sums: BTreeMap<&str, u64> = BTreeMap::new();
        for (comm, first, last) in self.seen.values() {
            *sums.entry(comm).or_default() += last.saturating_sub(*first);
        }
        let tck = clock_ticks();
        let mut v: Vec<(String, f64)> = sums
            .into_iter()
            .map(|(c, t)| (c.to_string(), t as f64 / tck))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

/// Host CPU ticks since boot, busy (all but idle and iowait) and total,
/// from the `cpu` line of `/proc/stat`.
pub fn host_cpu() -> Result<(u64, u64)> {
    let stat = fs::read_to_string("/proc/stat")?;
    let line = stat.lines().find_map(|l| l.strip_prefix("cpu "));
    let ticks: Vec<u64> = line
        .context("no cpu in /proc/stat")?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    ensure!(ticks.len() >= 5, "short cpu line in /proc/stat");
    // guest and guest_nice (fields 9, 10) are already in user and nice.
    let total: u64 = ticks.iter().take(8).sum();
    Ok((total - ticks[3] - ticks[4], total))
}
