//! What the table knows of a process besides its maps: who it runs as,
//! its pid in its own namespace, whether it is a kernel thread, its
//! executable, its [`Identity`] and (for a JVM) its raw command line.
//! Read from the kernel's
//! files once per image (pid, start, exec), when a stage first asks, and
//! again after the table re-reads the image's maps; stages ask the table
//! ([`crate::process::ProcessTable::facts`]) instead of `/proc`.

use std::{path::PathBuf, sync::Arc};

use super::{
    identity::Identity,
    status::{self, Status},
};

/// Most bytes of a command line kept (a JVM's, for its main class).
pub const MAX_CMDLINE: u64 = 16 * 1024;

/// Most bytes of another process's command line read, for its identity:
/// enough for an interpreter's options and its script (the line shown is
/// cut to [`crate::process::identity::MAX_SHOWN`] once cleaned), and no
/// more than a page of a 1 MiB argument list.
pub const MAX_CMDLINE_READ: u64 = 4 * 1024;

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
    /// arguments): kept for JVMs only, whose main class is in it.
    pub cmdline: Option<Box<[u8]>>,
    /// Who it is, cleaned for showing (`None`: a kernel thread); shared
    /// by the slices that record it.
    pub identity: Option<Arc<Identity>>,
}

impl Facts {
    /// Reads `pid`'s facts (keeping its raw command line if
    /// `with_cmdline`); `None` when it is gone.
    pub(super) fn read(pid: u32, with_cmdline: bool) -> Option<Facts> {
        let Status {
            euid, egid, ns_pid, ..
        } = Status::read(pid)?;
        let executable = status::executable(pid);
        let bound = if with_cmdline {
            MAX_CMDLINE
        } else {
            MAX_CMDLINE_READ
        };
        let cmdline = status::cmdline(pid, bound).unwrap_or_default();
        let cut = cmdline.len() as u64 >= bound;
        let identity = Identity::of(&cmdline, cut, executable.as_deref()).map(Arc::new);
        Some(Facts {
            euid,
            egid,
            ns_pid,
            kernel_thread: status::is_kernel_thread(pid),
            executable,
            cmdline: with_cmdline.then(|| cmdline.into_boxed_slice()),
            identity,
        })
    }

    /// Bytes these facts hold, for the table's bound.
    pub(super) fn bytes(&self) -> usize {
        std::mem::size_of::<Facts>()
            + self.executable.as_ref().map_or(0, |p| p.as_os_str().len())
            + self.cmdline.as_ref().map_or(0, |c| c.len())
            + self.identity.as_ref().map_or(0, |i| i.bytes())
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
        let other = Facts::read(me, false).unwrap();
        assert_eq!(other.cmdline, None);
        // The identity is the command line, cleaned.
        let args: Vec<String> = std::env::args().collect();
        let identity = other.identity.unwrap();
        assert!(identity.cmdline.starts_with(&args[0]), "{identity:?}");
        assert_eq!(
            identity.executable.as_deref().map(std::path::Path::new),
            std::env::current_exe().ok().as_deref()
        );
        assert_eq!(Facts::read(u32::MAX, true), None);
    }
}
