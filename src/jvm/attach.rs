//! A client for HotSpot's dynamic attach mechanism, the protocol `jcmd`
//! speaks: a UNIX socket `/tmp/.java_pid<PID>` that the JVM opens after
//! finding a trigger file `.attach_pid<PID>` and receiving SIGQUIT.
//!
//! Written here rather than by running `jcmd`: that needs a JDK on the
//! host, a matching user, and it cannot reach a JVM in another mount
//! namespace. From the host we reach the container's `/tmp` through
//! `/proc/PID/root` and name files by the JVM's own (namespaced) pid.

use std::{
    io::{self, Read, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::net::UnixStream,
    },
    thread,
    time::{Duration, Instant},
};

use thiserror::Error;

use crate::{
    process::live::{self, Status},
    untrusted::{self, Dir, OpenError, Reason, What},
};

/// The answer of one command can be a thread dump of thousands of threads;
/// more than this is cut off.
const MAX_REPLY: u64 = 16 << 20;
/// Time for one command's whole reply (a thread dump of a big JVM takes a
/// while); a JVM that trickles bytes is cut off then too.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for `connect` (a full listen backlog would block it).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a command could not be run in a JVM.
#[derive(Debug, Error)]
pub enum AttachError {
    #[error("not a HotSpot JVM (libjvm.so is not mapped)")]
    NotHotspot,
    #[error("the process is gone")]
    Gone,
    #[error(
        "the JVM does not handle SIGQUIT yet (still starting, or run with -Xrs); not signalled"
    )]
    SigquitNotHandled,
    #[error("the JVM did not open its attach socket within {0:?} (started with -XX:+DisableAttachMechanism, or not responding)")]
    NoSocket(Duration),
    #[error("the JVM refused `{command}` (code {code}): {message}")]
    Refused {
        command: String,
        code: i32,
        message: String,
    },
    #[error("the JVM did not answer within {0:?}")]
    Timeout(Duration),
    #[error("another client is attaching to the JVM (its trigger file is there); retried later")]
    Busy,
    #[error("unsafe attach file: {0}")]
    Unsafe(OpenError),
    #[error("talking to the JVM: {0}")]
    Io(#[from] io::Error),
}

impl From<OpenError> for AttachError {
    fn from(e: OpenError) -> AttachError {
        match e {
            OpenError::Io(e) => AttachError::Io(e),
            refused => AttachError::Unsafe(refused),
        }
    }
}

/// A JVM to attach to: its pid here and in its own pid namespace.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub pid: u32,
    pub ns_pid: u32,
}

impl Target {
    /// Runs one diagnostic command (`jcmd` syntax, e.g. `Thread.print`) and
    /// returns its output. Starts the JVM's attach listener first when its
    /// socket is not there, waiting up to `start_timeout` for it.
    pub fn jcmd(&self, command: &str, start_timeout: Duration) -> Result<String, AttachError> {
        self.jcmd_within(command, start_timeout, REPLY_TIMEOUT)
    }

    /// [`Target::jcmd`] with the whole reply due within `reply_timeout`
    /// (at most the usual [`REPLY_TIMEOUT`]): the agent gives each target
    /// its own time, so that a JVM that answers slowly holds up only itself.
    pub fn jcmd_within(
        &self,
        command: &str,
        start_timeout: Duration,
        reply_timeout: Duration,
    ) -> Result<String, AttachError> {
        let status = Status::read(self.pid).ok_or(AttachError::Gone)?;
        // Before anything in /tmp is looked at: a socket left there by a
        // JVM that died under a pid now reused says nothing about this
        // process, and must not turn "not a JVM" into "unsafe socket".
        if !maps_libjvm(self.pid)? {
            return Err(AttachError::NotHotspot);
        }
        let stream = match self.connect(&status) {
            Ok(s) => s,
            Err(err @ AttachError::Unsafe(_)) => return Err(err),
            Err(_) => match self.start_listener(&status, start_timeout) {
                Ok(()) => self.connect(&status)?,
                // Another client's trigger: its signal opens the socket
                // for us too; if not in time, it is still busy.
                Err(AttachError::Busy) => match self.wait_for_socket(&status, start_timeout) {
                    Ok(()) => self.connect(&status)?,
                    Err(AttachError::NoSocket(_)) => return Err(AttachError::Busy),
                    Err(err) => return Err(err),
                },
                Err(err) => return Err(err),
            },
        };
        self.request(stream, command, reply_timeout.min(REPLY_TIMEOUT))
    }

    /// The JVM's `/tmp`, reached from our mount namespace through
    /// `/proc/PID/root`, without following a symlink on the way.
    fn tmp(&self, what: What) -> Result<Dir, AttachError> {
        Ok(Dir::process_tmp(self.pid, what)?)
    }

    /// Connects to `/tmp/.java_pid<NSPID>` after checking that it is a
    /// socket of the JVM's user (or root), and then that the process on the
    /// other end is this very JVM (`SO_PEERCRED`), so that a socket planted
    /// by someone else, or swapped in after the check, is never talked to.
    fn connect(&self, status: &Status) -> Result<UnixStream, AttachError> {
        let tmp = self.tmp(What::AttachSocket)?;
        let name = format!(".java_pid{}", self.ns_pid);
        let st = tmp.stat(&name)?;
        let shown = || tmp.shown_path(&name);
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(OpenError::refuse(What::AttachSocket, Reason::WrongType, shown()).into());
        }
        if st.st_uid != status.euid && st.st_uid != 0 {
            return Err(OpenError::refuse(What::AttachSocket, Reason::Owner, shown()).into());
        }
        let addr = socket2::SockAddr::unix(tmp.fd_path().join(&name))?;
        let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
        // As the JVM's user: its socket is theirs, mode 0600, and root
        // without CAP_DAC_OVERRIDE (deploy/wallscope.service grants none)
        // may not write to it. HotSpot accepts the peer anyway: its euid,
        // not its fsuid, is root.
        as_user(status.euid, status.egid, || {
            socket.connect_timeout(&addr, CONNECT_TIMEOUT)
        })?;
        let stream = UnixStream::from(OwnedFd::from(socket));
        if peer_pid(&stream)? != self.pid {
            return Err(OpenError::refuse(What::AttachSocket, Reason::WrongPeer, shown()).into());
        }
        Ok(stream)
    }

    fn request(
        &self,
        mut stream: UnixStream,
        command: &str,
        timeout: Duration,
    ) -> Result<String, AttachError> {
        let deadline = Instant::now() + timeout;
        let timed_out = || {
            untrusted::refusals::count(What::AttachSocket, Reason::Timeout);
            AttachError::Timeout(timeout)
        };
        stream.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        // Protocol version 1: version, operation and three arguments, each
        // NUL-terminated; `jcmd` takes the whole command line as one.
        let mut msg = Vec::with_capacity(command.len() + 16);
        for part in ["1", "jcmd", command, "", ""] {
            msg.extend_from_slice(part.as_bytes());
            msg.push(0);
        }
        stream.write_all(&msg).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
            _ => e.into(),
        })?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 64 << 10];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out());
            }
            stream.set_read_timeout(Some(left))?;
            let n = match stream.read(&mut buf) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(timed_out())
                }
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                break;
            }
            let room = (MAX_REPLY as usize).saturating_sub(reply.len());
            reply.extend_from_slice(&buf[..n.min(room)]);
            if room <= n {
                break;
            }
        }
        parse_reply(command, &String::from_utf8_lossy(&reply))
    }

    /// Creates the trigger file and sends SIGQUIT, after checking through a
    /// pidfd that the very process signalled maps libjvm: SIGQUIT kills any
    /// other process with a core dump.
    fn start_listener(&self, status: &Status, timeout: Duration) -> Result<(), AttachError> {
        let pidfd = pidfd_open(self.pid).map_err(|_| AttachError::Gone)?;
        if !maps_libjvm(self.pid)? {
            return Err(AttachError::NotHotspot);
        }
        if !status.catches(libc::SIGQUIT) {
            return Err(AttachError::SigquitNotHandled);
        }
        let (dir, name, created) = self.create_trigger(status)?;
        let result = pidfd_send_signal(&pidfd, libc::SIGQUIT)
            .map_err(|_| AttachError::Gone)
            .and_then(|()| self.wait_for_socket(status, timeout));
        dir.remove_if_same(&name, &created);
        result
    }

    /// Waits up to `timeout` for the JVM's attach socket to answer.
    fn wait_for_socket(&self, status: &Status, timeout: Duration) -> Result<(), AttachError> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            match self.connect(status) {
                Ok(_) => return Ok(()),
                Err(err @ AttachError::Unsafe(_)) => return Err(err),
                Err(_) => {}
            }
            if !live::exists(self.pid) {
                return Err(AttachError::Gone);
            }
            thread::sleep(Duration::from_millis(20));
        }
        Err(AttachError::NoSocket(timeout))
    }

    /// Creates `.attach_pid<NSPID>` in the JVM's working directory, else in
    /// its `/tmp`, as a new file only (a name already there, a symlink
    /// above all, is left alone and counted), and as the JVM's user: with
    /// this thread's fsuid/fsgid set to the JVM's, the kernel checks the
    /// permissions `jcmd` run as that user would have, and the file is
    /// owned by that user, as HotSpot requires.
    fn create_trigger(&self, status: &Status) -> Result<(Dir, String, OwnedFd), AttachError> {
        let name = format!(".attach_pid{}", self.ns_pid);
        let mut last = AttachError::Io(io::Error::other("no place for the trigger file"));
        let dirs = [
            Dir::proc_link(self.pid, "cwd").map_err(AttachError::from),
            self.tmp(What::AttachTrigger),
        ];
        for dir in dirs {
            let dir = match dir {
                Ok(d) => d,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            match as_user(status.euid, status.egid, || dir.create_new(&name, 0o600)) {
                Ok(fd) => return Ok((dir, name, fd)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    // A plain file of the JVM's user, as another client
                    // (a second wallscope, `jcmd`) creates it: busy, not
                    // hostile. Anything else there is refused.
                    let theirs = dir.stat(&name).is_ok_and(|st| {
                        st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == status.euid
                    });
                    let shown = format!("{}/{name}", self.pid);
                    last = OpenError::refuse(What::AttachTrigger, Reason::Exists, shown).into();
                    if theirs {
                        return Err(AttachError::Busy);
                    }
                }
                Err(e) => last = e.into(),
            }
        }
        Err(last)
    }
}

/// Runs `f` with this thread's filesystem uid and gid set to `uid`/`gid`
/// (per thread on Linux: other threads keep root's), then restores root's.
/// Leaving fsuid 0 drops the filesystem capabilities (DAC override) for the
/// duration, so the kernel checks permissions as for that user.
fn as_user<T>(uid: u32, gid: u32, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    // SAFETY: plain syscalls without memory arguments.
    let (old_gid, old_uid) = unsafe { (libc::setfsgid(gid), libc::setfsuid(uid)) };
    // SAFETY: as above; -1 reads the current value without changing it.
    let switched = unsafe { libc::setfsuid(u32::MAX) } as u32 == uid;
    let result = if switched {
        f()
    } else {
        Err(io::Error::other(format!("cannot act as uid {uid}")))
    };
    // SAFETY: plain syscalls without memory arguments.
    unsafe {
        libc::setfsuid(old_uid as u32);
        libc::setfsgid(old_gid as u32);
    }
    result
}

/// The pid (in our namespace) of the process that opened the other end.
fn peer_pid(stream: &UnixStream) -> io::Result<u32> {
    // SAFETY: an all-zero ucred is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid descriptor, buffer and length.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.pid as u32)
}

/// Splits a reply into its status line and output.
fn parse_reply(command: &str, reply: &str) -> Result<String, AttachError> {
    let (code, rest) = reply.split_once('\n').unwrap_or((reply, ""));
    let code: i32 = code.trim().parse().map_err(|_| {
        AttachError::Io(io::Error::other(format!(
            "malformed reply to `{command}`: {:?}",
            reply.chars().take(80).collect::<String>()
        )))
    })?;
    // Unknown or failing commands come back with code 0 and an exception in
    // the output on some JDKs, with a non-zero code on others.
    let failed = rest
        .lines()
        .next()
        .is_some_and(|l| l.starts_with("java.lang.") && l.contains("Exception"));
    if code != 0 || failed {
        return Err(AttachError::Refused {
            command: command.to_string(),
            code,
            message: rest.trim().lines().next().unwrap_or("").to_string(),
        });
    }
    Ok(rest.to_string())
}

/// Whether `pid` is a HotSpot JVM (see [`crate::process::maps::ProcMaps::is_hotspot`]).
pub fn maps_libjvm(pid: u32) -> Result<bool, AttachError> {
    let maps = live::maps(pid).map_err(|_| AttachError::Gone)?;
    Ok(maps.is_hotspot())
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_send_signal(pidfd: &OwnedFd, sig: i32) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we own.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{fs, path::Path};

    #[test]
    fn replies_split_into_status_and_output() {
        assert_eq!(
            parse_reply("Compiler.perfmap", "0\n").unwrap(),
            "",
            "perfmap prints nothing on success"
        );
        assert_eq!(parse_reply("x", "0\nhello\n").unwrap(), "hello\n");
        let err = parse_reply(
            "Compiler.perfmap",
            "0\njava.lang.IllegalArgumentException: Unknown diagnostic command\n",
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("Unknown diagnostic command"),
            "{err}"
        );
        assert!(matches!(
            parse_reply("x", "-1\nbad\n"),
            Err(AttachError::Refused { code: -1, .. })
        ));
        assert!(matches!(parse_reply("x", ""), Err(AttachError::Io(_))));
    }

    #[test]
    fn a_process_without_libjvm_is_never_signalled() {
        // Our own test binary is not a JVM: the attach must stop before any
        // trigger file or signal.
        let me = Target {
            pid: std::process::id(),
            ns_pid: std::process::id(),
        };
        // As a JVM that died under our (reused) pid would have left it: a
        // socket of another user, which must not make this "unsafe".
        let stale = format!("/tmp/.java_pid{}", me.ns_pid);
        let _ = std::fs::remove_file(&stale);
        let planted = std::os::unix::net::UnixListener::bind(&stale).is_ok()
            && std::os::unix::fs::chown(&stale, Some(65534), Some(65534)).is_ok();
        let answer = me.jcmd("VM.version", Duration::from_millis(10));
        if planted {
            let _ = std::fs::remove_file(&stale);
        }
        assert!(matches!(answer, Err(AttachError::NotHotspot)), "{answer:?}");
        assert!(!Path::new(&format!(".attach_pid{}", me.ns_pid)).exists());
    }

    #[test]
    fn a_process_with_libjvm_but_no_sigquit_handler_is_not_signalled() {
        // `sleep` with some library preloaded under the name libjvm.so: it
        // looks like a JVM by its maps but would die of SIGQUIT.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("libjvm.so");
        let libm = [
            "/lib/x86_64-linux-gnu/libm.so.6",
            "/usr/lib64/libm.so.6",
            "/lib64/libm.so.6",
        ]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("a libm to preload");
        fs::copy(libm, &fake).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("LD_PRELOAD", &fake)
            .spawn()
            .unwrap();
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !maps_libjvm(pid).unwrap_or(false) {
            assert!(Instant::now() < deadline, "libjvm.so never mapped");
            thread::sleep(Duration::from_millis(10));
        }
        let target = Target { pid, ns_pid: pid };
        let result = target.jcmd("VM.version", Duration::from_millis(100));
        assert!(
            matches!(result, Err(AttachError::SigquitNotHandled)),
            "{result:?}"
        );
        assert!(child.try_wait().unwrap().is_none(), "still alive");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
