//! The cgroup whose CPU quota holds a process back: the `cpu` controller's,
//! in a v1 hierarchy of its own (hybrid hosts mount one per controller) or
//! in the unified one. BPF names it by the kernfs id of its directory
//! (`ws_cpu_cgroup`), which is that directory's inode in the hierarchy's
//! mount, so ids resolve by walking that mount, not the unified one (a v1
//! id may well name another directory there). Its quota, period and
//! throttling counters are files the kernel writes in the directory.

use std::{
    io::Read,
    os::unix::fs::OpenOptionsExt,
    path::{Component, Path, PathBuf},
    sync::OnceLock,
};

use super::cgroups::{self, Cgroups, V1Paths, MAX_PATH};

/// Longest control file read (`cpu.stat` is about 200 bytes).
const MAX_CONTROL_FILE: u64 = 4096;
/// Longest `/proc/self/mountinfo` read (a host has some hundred mounts).
const MAX_MOUNTINFO: u64 = 1 << 20;
/// Members read from a cgroup's `cgroup.procs`, at most.
pub const MAX_MEMBERS: usize = 4096;

/// Which hierarchy the `cpu` controller is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Version {
    /// A v1 hierarchy, with the controllers it holds (`cpu`,
    /// `cpu,cpuacct`) as `/proc/PID/cgroup` lists them.
    V1 { controllers: String },
    /// The unified (cgroup2) hierarchy.
    V2,
}

/// A cgroup's CPU bandwidth limit and the kernel's throttling counters
/// since the cgroup was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuLimits {
    /// CPU time allowed per period; `None`: no limit (`max`, `-1`).
    pub quota_us: Option<u64>,
    pub period_us: u64,
    /// Periods with runnable threads, and those that ran out of quota.
    pub nr_periods: u64,
    pub nr_throttled: u64,
    /// Time throttled, summed over CPUs.
    pub throttled_us: u64,
}

/// The `cpu` controller's hierarchy: which one, and its ids and files.
pub struct CpuHierarchy {
    version: Version,
    ids: Cgroups,
}

impl CpuHierarchy {
    /// The hierarchy mounted at `root`.
    pub fn new(version: Version, root: impl Into<PathBuf>) -> CpuHierarchy {
        CpuHierarchy {
            version,
            ids: Cgroups::new(root),
        }
    }

    /// `v1:cpu` (`v1:cpu,cpuacct`) or `v2`.
    pub fn name(&self) -> String {
        match &self.version {
            Version::V1 { controllers } => format!("v1:{controllers}"),
            Version::V2 => "v2".to_string(),
        }
    }

    /// The path of the cgroup whose directory has kernfs id `id`.
    pub fn path_of(&self, id: u64) -> Option<String> {
        self.ids.path_of(id)
    }

    /// The path in this hierarchy of a process whose `/proc/PID/cgroup`
    /// gave the unified path `v2` and the v1 paths `v1`.
    pub fn path_in(&self, v2: Option<&str>, v1: Option<&V1Paths>) -> Option<String> {
        match &self.version {
            Version::V2 => v2.map(str::to_string),
            Version::V1 { controllers } => v1?
                .iter()
                .find(|(c, _)| c == controllers)
                .map(|(_, p)| p.to_string()),
        }
    }

    /// The limit and counters of the cgroup at `path`; `None` where it has
    /// none (the root, on v2) or is gone.
    pub fn limits(&self, path: &str) -> Option<CpuLimits> {
        let stat = self.read(path, "cpu.stat")?;
        match self.version {
            Version::V2 => parse_v2(&self.read(path, "cpu.max")?, &stat),
            Version::V1 { .. } => parse_v1(
                &self.read(path, "cpu.cfs_quota_us")?,
                &self.read(path, "cpu.cfs_period_us")?,
                &stat,
            ),
        }
    }

    /// The processes in the cgroup at `path` now (its `cgroup.procs`, not
    /// its descendants'), at most [`MAX_MEMBERS`].
    pub fn members(&self, path: &str) -> Vec<u32> {
        let max = MAX_MEMBERS as u64 * 11;
        let text = self
            .read_bounded(path, "cgroup.procs", max)
            .unwrap_or_default();
        let mut pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        pids.truncate(MAX_MEMBERS);
        pids
    }

    fn read(&self, path: &str, file: &str) -> Option<String> {
        self.read_bounded(path, file, MAX_CONTROL_FILE)
    }

    /// A control file of the cgroup at `path`: the path must stay under
    /// the mount (plain components only), and no link is followed.
    fn read_bounded(&self, path: &str, file: &str, max: u64) -> Option<String> {
        let rel = Path::new(path).strip_prefix("/").ok()?;
        let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
        if !plain || path.len() > MAX_PATH {
            return None;
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(self.ids.root().join(rel).join(file))
            .ok()?;
        let mut text = String::new();
        f.take(max).read_to_string(&mut text).ok()?;
        Some(text)
    }
}

/// The host's `cpu` hierarchy: the v1 mount holding the `cpu` controller
/// if there is one, else the unified hierarchy.
pub fn system() -> &'static CpuHierarchy {
    static SYSTEM: OnceLock<CpuHierarchy> = OnceLock::new();
    SYSTEM.get_or_init(|| {
        let read = |path: &str| {
            let f = std::fs::File::open(path).ok()?;
            let mut text = String::new();
            f.take(MAX_MOUNTINFO).read_to_string(&mut text).ok()?;
            Some(text)
        };
        let mounts = read("/proc/self/mountinfo").unwrap_or_default();
        let own = read("/proc/self/cgroup").unwrap_or_default();
        match (v1_cpu_mount(&mounts), v1_cpu_controllers(&own)) {
            (Some(mount), Some(controllers)) => {
                CpuHierarchy::new(Version::V1 { controllers }, mount)
            }
            _ => CpuHierarchy::new(Version::V2, cgroups::system().root()),
        }
    })
}

/// The mount point of a whole v1 hierarchy holding the `cpu` controller,
/// from a `mountinfo` text (`... ROOT MOUNT_POINT ... - cgroup SRC OPTS`).
pub fn v1_cpu_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split(' ');
        let (kind, options) = (fs.next()?, fs.nth(1)?);
        let mut mount = mount.split(' ').skip(3);
        let (root, point) = (mount.next()?, mount.next()?);
        // Escaped names (`\040`) are not ours to guess at.
        let whole = root == "/" && !point.contains('\\');
        (kind == "cgroup" && whole && options.split(',').any(|o| o == "cpu"))
            .then(|| PathBuf::from(point))
    })
}

/// The controllers of the v1 hierarchy holding `cpu` (`cpu,cpuacct`), from
/// a `/proc/PID/cgroup` text.
pub fn v1_cpu_controllers(cgroup_file: &str) -> Option<String> {
    V1Paths::in_file(cgroup_file)
        .iter()
        .find(|(c, _)| c.split(',').any(|c| c == "cpu"))
        .map(|(c, _)| c.to_string())
}

/// The value of `key` in a `cpu.stat` text.
fn stat_field(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A v2 cgroup's `cpu.max` (`max 100000`, `50000 100000`) and `cpu.stat`.
pub fn parse_v2(cpu_max: &str, stat: &str) -> Option<CpuLimits> {
    let mut fields = cpu_max.split_whitespace();
    let quota = fields.next()?;
    let period_us = fields.next()?.parse().ok()?;
    let quota_us = match quota {
        "max" => None,
        q => Some(q.parse().ok()?),
    };
    Some(CpuLimits {
        quota_us,
        period_us,
        nr_periods: stat_field(stat, "nr_periods")?,
        nr_throttled: stat_field(stat, "nr_throttled")?,
        throttled_us: stat_field(stat, "throttled_usec")?,
    })
}

/// A v1 cgroup's `cpu.cfs_quota_us` (`-1`: none), `cpu.cfs_period_us` and
/// `cpu.stat` (`throttled_time` in ns).
pub fn parse_v1(quota: &str, period: &str, stat: &str) -> Option<CpuLimits> {
    let quota: i64 = quota.trim().parse().ok()?;
    Some(CpuLimits {
        quota_us: u64::try_from(quota).ok(),
        period_us: period.trim().parse().ok()?,
        nr_periods: stat_field(stat, "nr_periods")?,
        nr_throttled: stat_field(stat, "nr_throttled")?,
        throttled_us: stat_field(stat, "throttled_time")? / 1000,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{fs, os::unix::fs::MetadataExt};

    const V1_STAT: &str = "nr_periods 120\nnr_throttled 90\nthrottled_time 7200000000\n\
                           nr_bursts 0\nburst_time 0\n";

    #[test]
    fn limits_parse_from_either_version() {
        let v2_stat = "usage_usec 5\nuser_usec 4\nsystem_usec 1\nnr_periods 30\n\
                       nr_throttled 12\nthrottled_usec 900000\nnr_bursts 0\nburst_usec 0\n";
        let limited = parse_v2("20000 100000\n", v2_stat).unwrap();
        assert_eq!(
            limited,
            CpuLimits {
                quota_us: Some(20_000),
                period_us: 100_000,
                nr_periods: 30,
                nr_throttled: 12,
                throttled_us: 900_000
            }
        );
        assert_eq!(parse_v2("max 100000\n", v2_stat).unwrap().quota_us, None);
        assert_eq!(parse_v2("lots 100000", v2_stat), None);
        assert_eq!(parse_v2("20000 100000", "nr_periods 1\n"), None);
        let v1 = parse_v1("50000\n", "100000\n", V1_STAT).unwrap();
        assert_eq!(
            (v1.quota_us, v1.period_us, v1.nr_throttled, v1.throttled_us),
            (Some(50_000), 100_000, 90, 7_200_000)
        );
        assert_eq!(
            parse_v1("-1\n", "100000\n", V1_STAT).unwrap().quota_us,
            None
        );
    }

    #[test]
    fn the_cpu_hierarchy_is_found_in_mountinfo_and_the_cgroup_file() {
        let hybrid = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
            32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
            33 31 0:30 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n\
            41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            v1_cpu_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        let only_cpuacct = "33 31 0:30 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n";
        assert_eq!(v1_cpu_mount(only_cpuacct), None);
        let bind_of_a_child = "32 31 0:29 /docker /c rw - cgroup cgroup rw,cpu\n";
        assert_eq!(v1_cpu_mount(bind_of_a_child), None);
        let pure_v2 = "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(v1_cpu_mount(pure_v2), None);
        let file = "4:cpu,cpuacct:/a\n3:cpuacct2:/\n0::/b\n";
        assert_eq!(v1_cpu_controllers(file).as_deref(), Some("cpu,cpuacct"));
        assert_eq!(v1_cpu_controllers("0::/b\n"), None);
    }

    /// A fake cgroup tree of either version: the files the kernel would
    /// write, in a temporary directory.
    fn fake(version: Version) -> (tempfile::TempDir, CpuHierarchy) {
        let dir = tempfile::tempdir().unwrap();
        let group = dir.path().join("app.slice/api");
        fs::create_dir_all(&group).unwrap();
        fs::write(group.join("cgroup.procs"), "41\n42\nnot a pid\n").unwrap();
        match version {
            Version::V2 => {
                fs::write(group.join("cpu.max"), "20000 100000\n").unwrap();
                let stat = "usage_usec 9\nnr_periods 50\nnr_throttled 40\nthrottled_usec 3000000\n";
                fs::write(group.join("cpu.stat"), stat).unwrap();
            }
            Version::V1 { .. } => {
                fs::write(group.join("cpu.cfs_quota_us"), "20000\n").unwrap();
                fs::write(group.join("cpu.cfs_period_us"), "100000\n").unwrap();
                fs::write(group.join("cpu.stat"), V1_STAT).unwrap();
            }
        }
        let hierarchy = CpuHierarchy::new(version, dir.path());
        (dir, hierarchy)
    }

    #[test]
    fn a_fake_v2_tree_gives_ids_paths_limits_and_members() {
        let (dir, v2) = fake(Version::V2);
        assert_eq!(v2.name(), "v2");
        let ino = fs::metadata(dir.path().join("app.slice/api"))
            .unwrap()
            .ino();
        assert_eq!(v2.path_of(ino).as_deref(), Some("/app.slice/api"));
        let limits = v2.limits("/app.slice/api").unwrap();
        assert_eq!(
            (
                limits.quota_us,
                limits.period_us,
                limits.nr_throttled,
                limits.throttled_us
            ),
            (Some(20_000), 100_000, 40, 3_000_000)
        );
        assert_eq!(v2.members("/app.slice/api"), [41, 42]);
        assert_eq!(v2.limits("/"), None, "the root has no cpu.max");
        assert_eq!(v2.limits("/app.slice/../app.slice/api"), None);
        assert_eq!(v2.limits("app.slice/api"), None, "paths are absolute");
        // A link in the tree is not followed.
        std::os::unix::fs::symlink(
            dir.path().join("app.slice/api/cpu.stat"),
            dir.path().join("app.slice/cpu.stat"),
        )
        .unwrap();
        fs::write(dir.path().join("app.slice/cpu.max"), "1 100000\n").unwrap();
        assert_eq!(v2.limits("/app.slice"), None);
        let v1 = V1Paths::in_file("1:cpu:/v1/only\n0::/app.slice/api\n");
        assert_eq!(
            v2.path_in(Some("/app.slice/api"), Some(&v1)).as_deref(),
            Some("/app.slice/api")
        );
    }

    #[test]
    fn a_fake_v1_tree_gives_the_cpu_controllers_paths() {
        let controllers = "cpu,cpuacct".to_string();
        let (_dir, v1) = fake(Version::V1 { controllers });
        assert_eq!(v1.name(), "v1:cpu,cpuacct");
        let limits = v1.limits("/app.slice/api").unwrap();
        assert_eq!(
            (limits.quota_us, limits.throttled_us),
            (Some(20_000), 7_200_000)
        );
        let file = V1Paths::in_file("5:pids:/p\n4:cpu,cpuacct:/app.slice/api\n0::/\n");
        assert_eq!(
            v1.path_in(Some("/"), Some(&file)).as_deref(),
            Some("/app.slice/api")
        );
        assert_eq!(v1.path_in(Some("/"), None), None);
    }
}
