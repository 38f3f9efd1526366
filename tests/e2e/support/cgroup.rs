//! Cgroup directories made for a test, and workloads started in them.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use super::{workload, Workload};

/// A cgroup directory made for the test, removed (its processes moved back
/// to the root) when dropped.
pub struct Cgroup {
    /// Outermost directory created, then the leaf.
    pub top: PathBuf,
    pub leaf: PathBuf,
    pub mount: PathBuf,
}

impl Cgroup {
    pub fn create(mount: &Path, path: &str) -> Cgroup {
        let leaf = mount.join(path.trim_start_matches('/'));
        fs::create_dir_all(&leaf).unwrap_or_else(|e| panic!("{}: {e}", leaf.display()));
        let first = path.trim_start_matches('/').split('/').next().unwrap();
        Cgroup {
            top: mount.join(first),
            leaf,
            mount: mount.to_path_buf(),
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Ok(pids) = fs::read_to_string(self.leaf.join("cgroup.procs")) {
            for pid in pids.lines() {
                let _ = fs::write(self.mount.join("cgroup.procs"), pid);
            }
        }
        // Deepest first: a cgroup directory goes only when empty.
        let mut dir = self.leaf.clone();
        while dir.starts_with(&self.top) {
            let _ = fs::remove_dir(&dir);
            if !dir.pop() {
                break;
            }
        }
    }
}

/// The cgroup2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
/// hybrid host) and a v1 hierarchy (the `pids` one) if there is one.
pub fn mounts() -> (PathBuf, Option<PathBuf>) {
    let unified = Path::new("/sys/fs/cgroup/unified");
    let v2 = if unified.join("cgroup.procs").exists() {
        unified.to_path_buf()
    } else {
        PathBuf::from("/sys/fs/cgroup")
    };
    let pids = Path::new("/sys/fs/cgroup/pids");
    let v1 = pids.join("tasks").exists().then(|| pids.to_path_buf());
    (v2, v1)
}

/// Starts `cpu_shares 20 4` inside `cgroup`: a shell moves itself in, then
/// execs the workload (as runtimes do before the container's exec).
pub fn start_in(cgroup: &Cgroup) -> Workload {
    let bin = workload("cpu_shares");
    start_command_in(cgroup, &format!("'{}' 20 4", bin.display()))
}

/// Starts the shell `command` (which must print `ready <pid>`) inside
/// `cgroup`: a shell moves itself in, then execs it.
pub fn start_command_in(cgroup: &Cgroup, command: &str) -> Workload {
    let procs = cgroup.leaf.join("cgroup.procs");
    let script = format!("echo $$ > '{}' && exec {command}", procs.display());
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]);
    Workload::spawn(cmd)
}
