//! The one way the daemon opens files that profiled processes control
//! (perf maps, mapped ELF files, JVM attach files), as root.
//!
//! Every open is `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC`: a symlink cannot
//! send us to a file of root's, a FIFO cannot block us. Paths with several
//! components another user controls are walked one directory at a time
//! from a descriptor (`O_PATH | O_DIRECTORY | O_NOFOLLOW`), starting at a
//! directory the kernel names (`/proc/PID/root`, `/proc/PID/cwd`). What is
//! opened is then checked with `fstat` (type, owner, size, identity) before
//! a byte is read. Refusals are counted by [`refusals`].
//!
//! Written on `libc` rather than a crate: `openat` with these flags and
//! `fstat` on the result is all it takes, and no maintained crate offers
//! exactly this (`openat2`'s `RESOLVE_*` flags would, but not on every
//! kernel we run on).

pub mod refusals;
pub mod text;

use std::{
    ffi::CString,
    fs::File,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
};

pub use refusals::{Reason, What};

/// Why a file was not opened: it is not there (not counted), or it was
/// refused (counted).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("refused {what} {path}: {reason}", what = .what.name(), reason = .reason.name())]
    Refused {
        what: What,
        reason: Reason,
        path: String,
    },
}

impl OpenError {
    /// Counts and returns a refusal.
    pub fn refuse(what: What, reason: Reason, path: impl Into<String>) -> OpenError {
        refusals::count(what, reason);
        OpenError::Refused {
            what,
            reason,
            path: path.into(),
        }
    }

    /// The reason, for a refusal.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            OpenError::Refused { reason, .. } => Some(*reason),
            OpenError::Io(_) => None,
        }
    }
}

/// What an opened file must be.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    /// Who may own it besides root (`None`: anyone).
    pub owner: Option<u32>,
    /// Largest size accepted, in bytes.
    pub max_bytes: u64,
    /// The very file wanted (device, inode), when known.
    pub identity: Option<(u64, u64)>,
}

/// A file opened and checked, with what `fstat` said of it.
#[derive(Debug)]
pub struct Checked {
    pub file: File,
    pub stat: libc::stat,
}

impl Checked {
    /// A path that reopens this very file (`/proc/self/fd/N`), for
    /// libraries that want a path: no user can redirect it.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

const OPEN_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::other("NUL in a path"))
}

fn fstat(fd: libc::c_int) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open for the duration of the call; st is writable.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Checks an opened file against `expect`.
fn check(
    fd: OwnedFd,
    what: What,
    path: &dyn Fn() -> String,
    expect: &Expect,
) -> Result<Checked, OpenError> {
    let st = fstat(fd.as_raw_fd())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(OpenError::refuse(what, Reason::WrongType, path()));
    }
    if let Some((dev, ino)) = expect.identity {
        if st.st_dev != dev || st.st_ino != ino {
            return Err(OpenError::refuse(what, Reason::Replaced, path()));
        }
    }
    if let Some(owner) = expect.owner {
        if st.st_uid != owner && st.st_uid != 0 {
            return Err(OpenError::refuse(what, Reason::Owner, path()));
        }
    }
    if st.st_size < 0 || st.st_size as u64 > expect.max_bytes {
        return Err(OpenError::refuse(what, Reason::TooBig, path()));
    }
    Ok(Checked {
        file: File::from(fd),
        stat: st,
    })
}

fn open_error(err: io::Error, what: What, path: &dyn Fn() -> String) -> OpenError {
    match err.raw_os_error() {
        Some(libc::ELOOP) => OpenError::refuse(what, Reason::Symlink, path()),
        _ => OpenError::Io(err),
    }
}

/// A directory held open, to walk and open in without following links.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// For messages only.
    shown: PathBuf,
}

impl Dir {
    /// `/proc/PID/LINK` (`root`, `cwd`): the kernel resolves these magic
    /// links itself, so following them cannot be redirected by a user.
    pub fn proc_link(pid: u32, link: &str) -> io::Result<Dir> {
        let path = format!("/proc/{pid}/{link}");
        let c = cstr(&path)?;
        // SAFETY: c is a valid C string; the result is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Dir {
            // SAFETY: the kernel just returned this descriptor.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            shown: path.into(),
        })
    }

    /// A process's `/tmp` as the process sees it (from our mount namespace
    /// through `/proc/PID/root`), refused if it is a symlink.
    pub fn process_tmp(pid: u32, what: What) -> Result<Dir, OpenError> {
        Dir::proc_link(pid, "root")?.sub("tmp", what)
    }

    /// How the file `name` in this directory is shown in messages.
    pub fn shown_path(&self, name: &str) -> String {
        self.shown.join(name).display().to_string()
    }

    /// The subdirectory `name`, refused if it is a symlink.
    pub fn sub(&self, name: &str, what: What) -> Result<Dir, OpenError> {
        let c = cstr(name)?;
        // SAFETY: valid descriptor and C string; the result is checked.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        let shown = self.shown.join(name);
        if fd < 0 {
            let err = io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                // O_PATH | O_NOFOLLOW opens a symlink itself; O_DIRECTORY
                // then fails with ENOTDIR, as for any non-directory.
                Some(libc::ENOTDIR | libc::ELOOP) => {
                    OpenError::refuse(what, Reason::BadDirectory, shown.display().to_string())
                }
                _ => OpenError::Io(err),
            });
        }
        Ok(Dir {
            // SAFETY: the kernel just returned this descriptor.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            shown,
        })
    }

    /// Opens the regular file `name` in this directory for reading and
    /// checks it.
    pub fn open(&self, name: &str, what: What, expect: &Expect) -> Result<Checked, OpenError> {
        let c = cstr(name)?;
        let shown = || self.shown.join(name).display().to_string();
        // SAFETY: valid descriptor and C string; the result is checked.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                OPEN_FLAGS | libc::O_NOFOLLOW,
            )
        };
        if fd < 0 {
            return Err(open_error(io::Error::last_os_error(), what, &shown));
        }
        // SAFETY: the kernel just returned this descriptor.
        check(unsafe { OwnedFd::from_raw_fd(fd) }, what, &shown, expect)
    }

    /// `lstat` of `name` in this directory.
    pub fn stat(&self, name: &str) -> io::Result<libc::stat> {
        let c = cstr(name)?;
        // SAFETY: an all-zero stat is valid; fstatat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor, C string and buffer.
        let rc = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }

    /// Creates `name`, which must not exist in any form (a symlink or a
    /// FIFO planted there is not touched): `O_CREAT | O_EXCL`. The file is
    /// owned by the calling thread's fsuid and fsgid.
    pub fn create_new(&self, name: &str, mode: libc::mode_t) -> io::Result<OwnedFd> {
        let c = cstr(name)?;
        // SAFETY: valid descriptor and C string; the result is checked.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY
                    | libc::O_CREAT
                    | libc::O_EXCL
                    | libc::O_NOFOLLOW
                    | libc::O_NONBLOCK
                    | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Removes `name` if it is still the file `created` (a process may
    /// have swapped it for something else meanwhile: leave that alone).
    pub fn remove_if_same(&self, name: &str, created: &OwnedFd) {
        if let Ok(ours) = fstat(created.as_raw_fd()) {
            self.remove_if(name, |now| {
                now.st_dev == ours.st_dev && now.st_ino == ours.st_ino
            });
        }
    }

    /// Removes `name` (never following a link: the entry itself is looked
    /// at) if its `lstat` passes `keep_going`; whether it was removed.
    pub fn remove_if(&self, name: &str, keep_going: impl FnOnce(&libc::stat) -> bool) -> bool {
        let Ok(now) = self.stat(name) else {
            return false;
        };
        if !keep_going(&now) {
            return false;
        }
        let Ok(c) = cstr(name) else {
            return false;
        };
        // SAFETY: valid descriptor and C string.
        unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) == 0 }
    }

    /// A path naming this very directory (`/proc/self/fd/N`), for calls
    /// that take a path (`connect` on a UNIX socket).
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

/// How to treat the last component of a path given to [`open_path`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Last {
    /// Refuse a symlink.
    NoFollow,
    /// Follow it: only for kernel magic links (`/proc/PID/map_files/...`),
    /// which lead to the very file mapped whatever the file system says.
    MagicLink,
}

/// Opens a regular file by path for reading and checks it. Directories on
/// the way are resolved normally, so give `expect.identity` (or use a
/// [`Dir`]) when they may be another user's.
pub fn open_path(
    path: &Path,
    last: Last,
    what: What,
    expect: &Expect,
) -> Result<Checked, OpenError> {
    let shown = || path.display().to_string();
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::other("NUL in a path"))?;
    let flags = match last {
        Last::NoFollow => OPEN_FLAGS | libc::O_NOFOLLOW,
        Last::MagicLink => OPEN_FLAGS,
    };
    // SAFETY: c is a valid C string; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(open_error(io::Error::last_os_error(), what, &shown));
    }
    // SAFETY: the kernel just returned this descriptor.
    check(unsafe { OwnedFd::from_raw_fd(fd) }, what, &shown, expect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    const ANY: Expect = Expect {
        owner: None,
        max_bytes: 1 << 20,
        identity: None,
    };

    fn refused(r: Result<Checked, OpenError>) -> Option<Reason> {
        r.err().and_then(|e| e.reason())
    }

    #[test]
    fn symlinks_fifos_big_files_and_strangers_are_refused_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ok");
        std::fs::write(&file, "hello").unwrap();
        let ok = open_path(&file, Last::NoFollow, What::PerfMap, &ANY).unwrap();
        assert_eq!(ok.stat.st_size, 5);

        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let before = refusals::get(What::PerfMap, Reason::Symlink);
        assert_eq!(
            refused(open_path(&link, Last::NoFollow, What::PerfMap, &ANY)),
            Some(Reason::Symlink)
        );
        assert!(refusals::get(What::PerfMap, Reason::Symlink) > before);

        // A FIFO with no writer: a blocking open would hang for ever.
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(
            refused(open_path(&fifo, Last::NoFollow, What::PerfMap, &ANY)),
            Some(Reason::WrongType)
        );

        let big = dir.path().join("big");
        File::create(&big).unwrap().set_len(2 << 30).unwrap();
        assert_eq!(
            refused(open_path(&big, Last::NoFollow, What::PerfMap, &ANY)),
            Some(Reason::TooBig)
        );

        let stranger = Expect {
            owner: Some(12345),
            ..ANY
        };
        // Root-owned files are accepted for any owner...
        assert!(open_path(&file, Last::NoFollow, What::PerfMap, &stranger).is_ok());
        // ...another user's are not.
        let c = CString::new(file.to_str().unwrap()).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 4242, 4242) }, 0);
        assert_eq!(
            refused(open_path(&file, Last::NoFollow, What::PerfMap, &stranger)),
            Some(Reason::Owner)
        );
        let meta = std::fs::metadata(dir.path().join("big")).unwrap();
        let wrong = Expect {
            identity: Some((meta.dev(), meta.ino())),
            ..ANY
        };
        assert_eq!(
            refused(open_path(&file, Last::NoFollow, What::Elf, &wrong)),
            Some(Reason::Replaced)
        );
        assert!(matches!(
            open_path(&dir.path().join("none"), Last::NoFollow, What::Elf, &ANY),
            Err(OpenError::Io(_))
        ));
    }

    #[test]
    fn directories_are_walked_without_following_links() {
        let root = Dir::proc_link(std::process::id(), "root").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let rel = dir.path().strip_prefix("/").unwrap();
        let mut d = root;
        for part in rel.components() {
            d = d
                .sub(part.as_os_str().to_str().unwrap(), What::PerfMap)
                .unwrap();
        }
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::fs::write(dir.path().join("real/f"), "x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("tmp")).unwrap();
        assert!(matches!(
            d.sub("tmp", What::PerfMap),
            Err(OpenError::Refused {
                reason: Reason::BadDirectory,
                ..
            })
        ));
        let real = d.sub("real", What::PerfMap).unwrap();
        assert!(real.open("f", What::PerfMap, &ANY).is_ok());

        // Created new only: an existing name (here a symlink) is untouched.
        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("real/trigger")).unwrap();
        let err = real.create_new("trigger", 0o600).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        let fd = real.create_new("new", 0o600).unwrap();
        real.remove_if_same("new", &fd);
        assert!(!dir.path().join("real/new").exists());
    }
}
