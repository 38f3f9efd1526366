//! Cgroup directories made for a test (plain, or of the `cpu` controller
//! with a quota), and workloads started in them.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
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

/// The CPU period a [`QuotaCgroup`] gets.
pub const PERIOD_US: u64 = 100_000;

/// A cgroup of the `cpu` controller with a quota, made for the test and
/// removed when dropped, even when the test fails.
pub struct QuotaCgroup {
    pub dir: PathBuf,
    mount: PathBuf,
    /// The path the daemon should show: relative to the mount.
    pub path: String,
    v2: bool,
}

/// The `cpu` controller's hierarchy: (mount, v2, name as the daemon shows
/// it: `v2` or `v1:CONTROLLERS`).
pub fn cpu_hierarchy() -> (PathBuf, bool, String) {
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let controllers = fs::read_to_string(Path::new(root).join("cgroup.controllers"));
        if controllers.is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu")) {
            return (PathBuf::from(root), true, "v2".into());
        }
    }
    let own = fs::read_to_string("/proc/self/cgroup").unwrap();
    let controllers = own
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .find(|c| c.split(',').any(|c| c == "cpu"))
        .unwrap_or_else(|| panic!("no cpu controller in {own}"))
        .to_string();
    let mount = PathBuf::from("/sys/fs/cgroup").join(&controllers);
    assert!(mount.join("cpu.cfs_quota_us").exists(), "{mount:?}");
    (mount, false, format!("v1:{controllers}"))
}

impl QuotaCgroup {
    /// `/ws-test-quota-NAME-PID` with `quota_us` per [`PERIOD_US`].
    pub fn create(name: &str, quota_us: u64) -> QuotaCgroup {
        let (mount, v2, _) = cpu_hierarchy();
        if v2 {
            let _ = fs::write(mount.join("cgroup.subtree_control"), "+cpu");
        }
        let path = format!("/ws-test-quota-{name}-{}", std::process::id());
        let dir = mount.join(&path[1..]);
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {dir:?}: {e}"));
        let group = QuotaCgroup {
            dir,
            mount,
            path,
            v2,
        };
        if v2 {
            fs::write(group.dir.join("cpu.max"), format!("{quota_us} {PERIOD_US}")).unwrap();
        } else {
            fs::write(group.dir.join("cpu.cfs_period_us"), PERIOD_US.to_string()).unwrap();
            fs::write(group.dir.join("cpu.cfs_quota_us"), quota_us.to_string()).unwrap();
        }
        group
    }

    /// The kernel's throttled time of the group so far, in us.
    pub fn throttled_us(&self) -> u64 {
        match self.v2 {
            true => self.stat("throttled_usec"),
            false => self.stat("throttled_time") / 1000,
        }
    }

    /// A counter of the group's `cpu.stat` (`nr_throttled`) now.
    pub fn stat(&self, name: &str) -> u64 {
        let stat = fs::read_to_string(self.dir.join("cpu.stat")).unwrap();
        stat.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {stat}"))
    }

    /// Starts `command` (a shell word list printing `ready <pid>`) in the
    /// group: a shell moves itself in, then execs it.
    pub fn start(&self, command: &str) -> Workload {
        let procs = self.dir.join("cgroup.procs");
        let script = format!("echo $$ > '{}' && exec {command}", procs.display());
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &script]);
        Workload::spawn(cmd)
    }
}

impl Drop for QuotaCgroup {
    fn drop(&mut self) {
        // Only the test's processes are in it (their `Workload`s are
        // usually gone first): any left are moved out and killed, then the
        // directory goes once the kernel has let them go.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in pids.lines().filter_map(|p| p.parse::<i32>().ok()) {
                let _ = fs::write(self.mount.join("cgroup.procs"), pid.to_string());
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            if Instant::now() > deadline {
                eprintln!("could not remove {:?}", self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
