//! A client for HotSpot's dynamic attach mechanism, the protocol `jcmd`
//! speaks: a UNIX socket `/tmp/.java_pid<PID>` that the JVM opens after
//! finding a trigger file `.attach_pid<PID>` and receiving SIGQUIT.
//!
//! Written here rather than by running `jcmd`: that needs a JDK on the
//! host, a matching user, and it cannot reach a JVM in another mount
//! namespace. From the host we reach the container's `/tmp` through
//! `/proc/PID/root` and name files by the JVM's own (namespaced) pid.

use std::{
    fs,
    io::{self, Read, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{fs::FileTypeExt, net::UnixStream},
    },
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use thiserror::Error;

use crate::symbolize::maps::ProcMaps;

/// The answer of one command can be a thread dump of thousands of threads;
/// more than this is cut off.
const MAX_REPLY: u64 = 16 << 20;
/// Time for one command's reply (a thread dump of a big JVM takes a while).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

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
    #[error("talking to the JVM: {0}")]
    Io(#[from] io::Error),
}

/// A JVM to attach to: its pid here and in its own pid namespace.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub pid: u32,
    pub ns_pid: u32,
}

impl Target {
    fn socket_path(&self) -> PathBuf {
        self.in_tmp(&format!(".java_pid{}", self.ns_pid))
    }

    /// A path in the target's `/tmp`, reached from our mount namespace.
    fn in_tmp(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root/tmp/{name}", self.pid))
    }

    /// Runs one diagnostic command (`jcmd` syntax, e.g. `Thread.print`) and
    /// returns its output. Starts the JVM's attach listener first when its
    /// socket is not there, waiting up to `start_timeout` for it.
    pub fn jcmd(&self, command: &str, start_timeout: Duration) -> Result<String, AttachError> {
        let stream = match self.connect() {
            Ok(s) => s,
            Err(_) => {
                self.start_listener(start_timeout)?;
                self.connect()?
            }
        };
        self.request(stream, command)
    }

    fn connect(&self) -> io::Result<UnixStream> {
        let path = self.socket_path();
        let meta = fs::symlink_metadata(&path)?;
        if !meta.file_type().is_socket() {
            return Err(io::Error::other("not a socket"));
        }
        UnixStream::connect(path)
    }

    fn request(&self, mut stream: UnixStream, command: &str) -> Result<String, AttachError> {
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
        // Protocol version 1: version, operation and three arguments, each
        // NUL-terminated; `jcmd` takes the whole command line as one.
        let mut msg = Vec::with_capacity(command.len() + 16);
        for part in ["1", "jcmd", command, "", ""] {
            msg.extend_from_slice(part.as_bytes());
            msg.push(0);
        }
        stream.write_all(&msg)?;
        let mut reply = Vec::new();
        stream.take(MAX_REPLY).read_to_end(&mut reply)?;
        parse_reply(command, &String::from_utf8_lossy(&reply))
    }

    /// Creates the trigger file and sends SIGQUIT, after checking through a
    /// pidfd that the very process signalled maps libjvm: SIGQUIT kills any
    /// other process with a core dump.
    fn start_listener(&self, timeout: Duration) -> Result<(), AttachError> {
        let pidfd = pidfd_open(self.pid).map_err(|_| AttachError::Gone)?;
        if !maps_libjvm(self.pid)? {
            return Err(AttachError::NotHotspot);
        }
        if !catches(self.pid, libc::SIGQUIT)? {
            return Err(AttachError::SigquitNotHandled);
        }
        let trigger = self.create_trigger()?;
        let result = (|| {
            pidfd_send_signal(&pidfd, libc::SIGQUIT).map_err(|_| AttachError::Gone)?;
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                if self.connect().is_ok() {
                    return Ok(());
                }
                if !Path::new(&format!("/proc/{}", self.pid)).exists() {
                    return Err(AttachError::Gone);
                }
                thread::sleep(Duration::from_millis(20));
            }
            Err(AttachError::NoSocket(timeout))
        })();
        let _ = fs::remove_file(trigger);
        result
    }

    /// `.attach_pid<NSPID>` in the JVM's working directory, else its `/tmp`,
    /// owned by the JVM's user (HotSpot accepts its own user or root; inside
    /// a user namespace our root is not its root).
    fn create_trigger(&self) -> Result<PathBuf, AttachError> {
        let name = format!(".attach_pid{}", self.ns_pid);
        let cwd = PathBuf::from(format!("/proc/{}/cwd/{name}", self.pid));
        let (uid, gid) = owner(self.pid)?;
        let mut last = None;
        for path in [cwd, self.in_tmp(&name)] {
            match fs::File::create(&path) {
                Ok(file) => {
                    // Best effort: root-owned triggers work for JVMs that
                    // see us as root.
                    // SAFETY: fchown on a descriptor we own.
                    unsafe { libc::fchown(file.as_raw_fd(), uid, gid) };
                    return Ok(path);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(AttachError::Io(last.unwrap_or_else(|| {
            io::Error::other("no place for the trigger file")
        })))
    }
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

/// Whether `pid` is a HotSpot JVM (see [`super::is_hotspot`]).
pub fn maps_libjvm(pid: u32) -> Result<bool, AttachError> {
    let maps = ProcMaps::read(pid).map_err(|_| AttachError::Gone)?;
    Ok(super::is_hotspot(&maps))
}

/// Whether `pid` has a handler for `sig` (`SigCgt` in `/proc/PID/status`):
/// a JVM before its signal setup, or run with `-Xrs`, would die of SIGQUIT.
fn catches(pid: u32, sig: i32) -> Result<bool, AttachError> {
    let status =
        fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| AttachError::Gone)?;
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .ok_or(AttachError::Gone)?;
    Ok(mask & (1 << (sig - 1)) != 0)
}

/// Effective uid and gid of `pid`.
fn owner(pid: u32) -> Result<(u32, u32), AttachError> {
    let status =
        fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| AttachError::Gone)?;
    let field = |key: &str| -> Option<u32> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(2)?.parse().ok()
    };
    match (field("Uid:"), field("Gid:")) {
        (Some(uid), Some(gid)) => Ok((uid, gid)),
        _ => Err(AttachError::Gone),
    }
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
        assert!(matches!(
            me.jcmd("VM.version", Duration::from_millis(10)),
            Err(AttachError::NotHotspot)
        ));
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
