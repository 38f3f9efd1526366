//! What the table knows of a process besides its maps: who it runs as,
//! its pid in its own namespace, whether it is a kernel thread, its
//! executable and (for a JVM) its command line. Read from the kernel's
//! files once per image (pid, start, exec), when a stage first asks, and
//! again after the table re-reads the image's maps; stages ask the table
//! ([`crate::process::ProcessTable::facts`]) instead of `/proc`.

use std::path::PathBuf;

use super::status::{self, Status};

/// Most bytes of a command line kept (a JVM's, for its main class).
pub const MAX_CMDLINE: u64 = 16 * 1024;

/// One process's facts, as read once for its image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// Effective user and group: whom its files belong to, whose budget
    /// and fair share it draws on.
    pub euid: u32,
    pub egid: u32,
    /// Its pid in its own (innermost) pid namespace.
    pub ns_pid: u32,
    /// A kernel thread (no user space of its own).
    pub kernel_thread: bool,
    /// The kernel's text of its `exe` link.
    pub executable: Option<PathBuf>,
    /// Its command line, at most [`MAX_CMDLINE`] bytes (NUL-separated
    /// arguments): read for JVMs only, whose main class is in it.
    pub cmdline: Option<Box<[u8]>>,
}

impl Facts {
    /// Reads `pid`'s facts (its command line too if `with_cmdline`);
    /// `None` when it is gone.
    pub(super) fn read(pid: u32, with_cmdline: bool) -> Option<Facts> {
        let Status {
            euid, egid, ns_pid, ..
        } = Status::read(pid)?;
        Some(Facts {
            euid,
            egid,
            ns_pid,
            kernel_thread: status::is_kernel_thread(pid),
            executable: status::executable(pid),
            cmdline: with_cmdline
                .then(|| status::cmdline(pid, MAX_CMDLINE))
                .flatten()
                .map(Vec::into_boxed_slice),
        })
    }

    /// Bytes these facts hold, for the table's bound.
    pub(super) fn bytes(&self) -> usize {
        std::mem::size_of::<Facts>()
            + self.executable.as_ref().map_or(0, |p| p.as_os_str().len())
            + self.cmdline.as_ref().map_or(0, |c| c.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_facts() {
        let me = std::process::id();
        let facts = Facts::read(me, true).unwrap();
        // SAFETY: geteuid and getegid have no preconditions.
        assert_eq!(facts.euid, unsafe { libc::geteuid() });
        assert_eq!(facts.egid, unsafe { libc::getegid() });
        assert_eq!(facts.ns_pid, me);
        assert!(!facts.kernel_thread);
        assert_eq!(facts.executable, std::env::current_exe().ok());
        let cmdline = facts.cmdline.unwrap();
        assert!(cmdline.len() as u64 <= MAX_CMDLINE && !cmdline.is_empty());
        assert_eq!(Facts::read(me, false).unwrap().cmdline, None);
        assert_eq!(Facts::read(u32::MAX, true), None);
    }
}
