//! A daemon confined to a memory cgroup the size of its unit's
//! `MemoryMax` (512 MiB, `deploy/wallscope.service`), as the security
//! tests run it: an attack that would need more is an OOM kill, which the
//! cgroup counts. Uses the v1 `memory` hierarchy where the host has one,
//! else the cgroup2 mount with the `memory` controller.

use std::{
    ffi::CString,
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use super::Daemon;

/// The unit's `MemoryMax`.
pub const UNIT_MEMORY_MAX: u64 = 512 << 20;

/// A memory cgroup made for one daemon, removed when dropped.
pub struct MemoryCgroup {
    pub dir: PathBuf,
    /// cgroup v1 (`memory.limit_in_bytes`) rather than v2 (`memory.max`).
    v1: bool,
}

impl MemoryCgroup {
    /// A new cgroup holding at most `bytes` (swap included where the
    /// hierarchy can say so).
    pub fn create(bytes: u64) -> MemoryCgroup {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "wallscope-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let v1_root = Path::new("/sys/fs/cgroup/memory");
        let (dir, v1) = if v1_root.join("memory.limit_in_bytes").exists() {
            (v1_root.join(&name), true)
        } else {
            let (v2, _) = super::cgroup::mounts();
            let controllers =
                fs::read_to_string(v2.join("cgroup.subtree_control")).unwrap_or_default();
            if !controllers.split_whitespace().any(|c| c == "memory") {
                let _ = fs::write(v2.join("cgroup.subtree_control"), "+memory");
            }
            (v2.join(&name), false)
        };
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let cg = MemoryCgroup { dir, v1 };
        if v1 {
            cg.write("memory.limit_in_bytes", &bytes.to_string());
            // Best effort: without swap accounting there is no memsw file.
            let _ = fs::write(
                cg.dir.join("memory.memsw.limit_in_bytes"),
                bytes.to_string(),
            );
        } else {
            cg.write("memory.max", &bytes.to_string());
            let _ = fs::write(cg.dir.join("memory.swap.max"), "0");
        }
        cg
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        fs::write(&path, value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    fn read(&self, file: &str) -> String {
        fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// Processes the kernel's OOM killer killed in this cgroup so far.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v1 {
            ("memory.oom_control", "oom_kill")
        } else {
            ("memory.events", "oom_kill")
        };
        self.read(file)
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The most memory charged to the cgroup at once (v1; v2 before 6.x
    /// has no peak file, and then the current figure stands in).
    pub fn peak_bytes(&self) -> u64 {
        let file = if self.v1 {
            "memory.max_usage_in_bytes"
        } else if self.dir.join("memory.peak").exists() {
            "memory.peak"
        } else {
            "memory.current"
        };
        self.read(file).trim().parse().unwrap_or(0)
    }

    /// The `cgroup.procs` file new members are written to.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let root = self.dir.parent().unwrap().join("cgroup.procs");
        for pid in self.read("cgroup.procs").lines() {
            let _ = fs::write(&root, pid);
        }
        // The last member may take a moment to leave after being killed.
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A daemon started inside its own [`MemoryCgroup`] of `bytes`.
pub struct ConfinedDaemon {
    pub daemon: Daemon,
    pub cgroup: MemoryCgroup,
}

impl ConfinedDaemon {
    /// `wallscope serve args...` in a new cgroup of [`UNIT_MEMORY_MAX`],
    /// ready (answering `/healthz`).
    pub fn start(args: &[&str]) -> ConfinedDaemon {
        ConfinedDaemon::start_with_max(args, UNIT_MEMORY_MAX)
    }

    /// As [`ConfinedDaemon::start`] with a cgroup of `bytes`.
    pub fn start_with_max(args: &[&str], bytes: u64) -> ConfinedDaemon {
        ConfinedDaemon::start_with(args, bytes, |_| {})
    }

    /// As [`ConfinedDaemon::start_with_max`], with `prepare` given the
    /// command first (e.g. a `pre_exec` that lowers a limit).
    pub fn start_with(
        args: &[&str],
        bytes: u64,
        prepare: impl FnOnce(&mut std::process::Command),
    ) -> ConfinedDaemon {
        let cgroup = MemoryCgroup::create(bytes);
        let procs = CString::new(cgroup.procs().into_os_string().into_encoded_bytes()).unwrap();
        let daemon = Daemon::spawn_with(args, move |cmd| {
            prepare(cmd);
            let procs = procs.clone();
            // SAFETY: only async-signal-safe calls (open, write, close)
            // between fork and exec, on memory prepared before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    if written != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        });
        daemon.wait_ready();
        ConfinedDaemon { daemon, cgroup }
    }

    pub fn url(&self) -> &str {
        &self.daemon.url
    }

    /// Panics unless the daemon is alive and was never OOM-killed.
    pub fn assert_survived(&mut self, what: &str) {
        assert_eq!(
            self.cgroup.oom_kills(),
            0,
            "{what}: the daemon was OOM-killed in its {} MiB cgroup (peak {} MiB)",
            UNIT_MEMORY_MAX >> 20,
            self.cgroup.peak_bytes() >> 20
        );
        assert!(self.daemon.alive(), "{what}: the daemon exited");
    }
}
