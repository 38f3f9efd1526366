//! Facts about a process that the kernel keeps (`/proc/PID/status`,
//! `/proc/PID/stat`, `/proc/PID/cmdline`): who it runs as, its pid in its
//! own namespace, the signals it handles, when it started, its arguments.
//! These files are the kernel's, not the process's, so plain reads are
//! safe.

use std::{
    fs,
    time::{Duration, SystemTime},
};

/// The fields of `/proc/PID/status` the daemon uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Effective user and group: whom its files belong to.
    pub euid: u32,
    pub egid: u32,
    /// Its pid in its own (innermost) pid namespace.
    pub ns_pid: u32,
    /// Signals it has a handler for (`SigCgt`).
    pub caught: u64,
}

impl Status {
    /// Reads `/proc/PID/status`; `None` when the process is gone.
    pub fn read(pid: u32) -> Option<Status> {
        Status::parse(
            &fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
            pid,
        )
    }

    fn parse(text: &str, pid: u32) -> Option<Status> {
        let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key));
        let second =
            |key: &str| -> Option<u32> { field(key)?.split_whitespace().nth(1)?.parse().ok() };
        Some(Status {
            euid: second("Uid:")?,
            egid: second("Gid:")?,
            ns_pid: super::tasks::ns_tid_in(text).unwrap_or(pid),
            caught: u64::from_str_radix(field("SigCgt:")?.trim(), 16).ok()?,
        })
    }

    /// Whether the process handles signal `sig`.
    pub fn catches(&self, sig: i32) -> bool {
        (1..=64).contains(&sig) && self.caught & (1 << (sig - 1)) != 0
    }
}

/// The user a process runs as (its effective uid), or `None` when it has
/// exited (all exited processes then count as one user): the fair share's
/// users (see [`crate::profile::report::fair`]).
pub fn user_of(pid: u32) -> Option<u32> {
    Status::read(pid).map(|s| s.euid)
}

/// The uid of process `pid` if its real, effective, saved and filesystem
/// uids are all the same (a set-uid program run by a user is not theirs
/// to read), from `/proc/PID/status`.
pub fn sole_uid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    uid_of_status(&status)
}

/// The one uid of a `/proc/PID/status` text's `Uid:` line, if its four
/// uids agree.
fn uid_of_status(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let uids: Vec<u32> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    match uids.as_slice() {
        [first, rest @ ..] if rest.len() == 3 && rest.iter().all(|u| u == first) => Some(*first),
        _ => None,
    }
}

/// Field `n` of `/proc/PID/stat`, counted from 0 after the command name
/// (the state is 0): the name may hold spaces and parentheses, so fields
/// start after the last `)`.
fn stat_field(pid: u32, n: usize) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(n)?.parse().ok()
}

/// At most `max` bytes of `pid`'s command line (NUL-separated arguments).
/// The kernel's file (it reads the process's memory, as the JVM
/// symbolizer does): no symlink or FIFO to fear, and bounded here.
pub fn cmdline(pid: u32, max: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    let file = fs::File::open(format!("/proc/{pid}/cmdline")).ok()?;
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The path of `pid`'s executable: the kernel's own text of the
/// `/proc/PID/exe` link (readlink opens no file the process controls).
pub fn executable(pid: u32) -> Option<std::path::PathBuf> {
    fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// `PF_KTHREAD` in the flags of `/proc/PID/stat`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Whether `pid` is a kernel thread (or the idle task, pid 0); false when
/// it is gone.
pub fn is_kernel_thread(pid: u32) -> bool {
    // flags is field 9, the 6th after the name.
    pid == 0 || stat_field(pid, 6).is_some_and(|f| f & PF_KTHREAD != 0)
}

/// `pid`'s parent's pid (0 for the kernel's own first processes).
pub fn parent_pid(pid: u32) -> Option<u32> {
    // ppid is field 4, the 1st after the state.
    stat_field(pid, 1).and_then(|p| u32::try_from(p).ok())
}

/// When `pid` started, in clock ticks after boot: with the pid, it names
/// one process for the life of the host (a reused pid starts later).
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat_field(pid, 19)
}

/// When `pid` started (wall clock), from its start time in clock ticks
/// after boot and the boot time.
pub fn start_time(pid: u32) -> Option<SystemTime> {
    // starttime is field 22, the 19th after the name.
    let ticks = start_ticks(pid)?;
    let boot: u64 = fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let since_boot = Duration::from_millis(ticks * 1000 / hz);
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(boot) + since_boot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_status_and_start() {
        let me = std::process::id();
        let s = Status::read(me).unwrap();
        // SAFETY: geteuid has no preconditions.
        assert_eq!(s.euid, unsafe { libc::geteuid() });
        assert_eq!(s.ns_pid, me);
        assert!(!s.catches(libc::SIGQUIT));
        let started = start_time(me).unwrap();
        let age = SystemTime::now().duration_since(started).unwrap();
        assert!(age < Duration::from_secs(3600), "{age:?}");
        assert!(Status::read(u32::MAX).is_none());
        assert!(!is_kernel_thread(me) && !is_kernel_thread(u32::MAX));
        assert!(is_kernel_thread(0));
        // Kernel threads have no command line; in the host's pid namespace
        // kthreadd (pid 2) is one.
        for pid in 1..=4096 {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            assert!(!is_kernel_thread(pid) || cmdline.is_empty(), "{pid}");
        }
        let comm = fs::read_to_string("/proc/2/comm").unwrap_or_default();
        assert_eq!(is_kernel_thread(2), comm.trim() == "kthreadd");
    }

    #[test]
    fn parses_namespaced_pids_and_masks() {
        let text = "Name:\tjava\nUid:\t1000\t1001\t1001\t1001\nGid:\t50\t51\t51\t51\n\
                    NSpid:\t4242\t7\nSigCgt:\t0000000000000004\n";
        let s = Status::parse(text, 4242).unwrap();
        assert_eq!((s.euid, s.egid, s.ns_pid), (1001, 51, 7));
        assert!(s.catches(libc::SIGQUIT));
        assert!(!s.catches(libc::SIGTERM));
        assert!(!s.catches(0));
    }

    #[test]
    fn a_process_is_a_users_only_if_all_its_uids_are() {
        let status = |uids: &str| format!("Name:\tx\nPid:\t5\nUid:\t{uids}\nGid:\t0\t0\t0\t0\n");
        assert_eq!(uid_of_status(&status("1000\t1000\t1000\t1000")), Some(1000));
        assert_eq!(uid_of_status(&status("1000\t0\t0\t0")), None);
        assert_eq!(uid_of_status(&status("1000\t1000\t1000")), None);
        assert_eq!(uid_of_status("Name:\tx\n"), None);
        // SAFETY: getuid cannot fail.
        let me = unsafe { libc::getuid() };
        assert_eq!(sole_uid(std::process::id()), Some(me));
    }
}
