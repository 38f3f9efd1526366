//! What a report must ask the live host: a process's name and threads
//! now, whether an id runs, and the cgroup tree. Reports read it through
//! this port, never `/proc` or `/sys` themselves, so that each stays a
//! function of the store's snapshot and these answers; the API gives the
//! live host's, tests fixed ones.

/// [`HostFacts::cpu_hierarchy`] when the `cpu` controller is in the unified
/// hierarchy (the one BPF files runqueue waits under).
pub const UNIFIED: &str = "v2";

/// The live host's answers a report may need.
pub trait HostFacts {
    /// Whether a process or thread with this id runs now.
    fn exists(&self, id: u32) -> bool;
    /// The name (`comm`) of process `pid`, or of its thread `tid`.
    fn comm(&self, pid: u32, tid: Option<u32>) -> Option<String>;
    /// The tids of `pid`'s threads now, unordered.
    fn tids(&self, pid: u32) -> Vec<u32>;
    /// Whether `pid` is a kernel thread (false when it is gone).
    fn is_kernel_thread(&self, pid: u32) -> bool;
    /// The path of the cgroup2 with this id, under its mount.
    fn cgroup_path(&self, id: u64) -> Option<String>;
    /// The id of the cgroup2 at `path` (under its mount).
    fn cgroup_id(&self, path: &str) -> Option<u64>;
    /// The processes of a cgroup v1 directory (`path` under a v1
    /// hierarchy's mount).
    fn cgroup_v1_members(&self, path: &str) -> Vec<u32>;
    /// The hierarchy of the `cpu` controller, whose cgroups hold CPU
    /// quotas: `v1:cpu` (`v1:cpu,cpuacct`) or `v2`.
    fn cpu_hierarchy(&self) -> String;
    /// The path, in the `cpu` hierarchy, of the cgroup BPF names `id` in
    /// throttled intervals ([`crate::profile::model::HistOwner::CgroupThrottled`]).
    fn cpu_cgroup_path(&self, id: u64) -> Option<String>;
    /// `pid`'s path in the `cpu` hierarchy now.
    fn cpu_cgroup_of(&self, pid: u32) -> Option<String>;
    /// The quota, counters and members of the `cpu` cgroup at `path`.
    fn cpu_cgroup(&self, path: &str) -> Option<CpuCgroup>;
}

/// A `cpu` cgroup as its files show it now: its CPU bandwidth limit, the
/// kernel's throttling counters since it was made, its processes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuCgroup {
    /// CPU time allowed per period (`None`: no limit).
    pub quota_us: Option<u64>,
    pub period_us: u64,
    /// Periods with runnable threads, those that ran out of quota, and
    /// the time throttled (summed over CPUs): `cpu.stat`.
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_us: u64,
    /// Its processes (not its descendants'), bounded.
    pub members: Vec<u32>,
}

/// A host with nothing running and no cgroups, for tests of reports.
#[cfg(test)]
pub struct Empty;

#[cfg(test)]
impl HostFacts for Empty {
    fn exists(&self, _: u32) -> bool {
        false
    }
    fn comm(&self, _: u32, _: Option<u32>) -> Option<String> {
        None
    }
    fn tids(&self, _: u32) -> Vec<u32> {
        Vec::new()
    }
    fn is_kernel_thread(&self, _: u32) -> bool {
        false
    }
    fn cgroup_path(&self, _: u64) -> Option<String> {
        None
    }
    fn cgroup_id(&self, _: &str) -> Option<u64> {
        None
    }
    fn cgroup_v1_members(&self, _: &str) -> Vec<u32> {
        Vec::new()
    }
    fn cpu_hierarchy(&self) -> String {
        UNIFIED.to_string()
    }
    fn cpu_cgroup_path(&self, _: u64) -> Option<String> {
        None
    }
    fn cpu_cgroup_of(&self, _: u32) -> Option<String> {
        None
    }
    fn cpu_cgroup(&self, _: &str) -> Option<CpuCgroup> {
        None
    }
}

/// The v1 `cpu` id of [`Hybrid`]'s `/batch`; another id whose cgroup is
/// gone.
#[cfg(test)]
pub const BATCH: u64 = 17;
#[cfg(test)]
pub const GONE: u64 = 18;

#[cfg(test)]
/// A hybrid host: `/batch` in the v1 `cpu` hierarchy with 20 ms per
/// 100 ms, holding pids 41 (busy) and 42 (idle); pid 50 outside it.
pub struct Hybrid;

#[cfg(test)]
impl HostFacts for Hybrid {
    fn exists(&self, id: u32) -> bool {
        [41, 42, 50].contains(&id)
    }
    fn comm(&self, pid: u32, _: Option<u32>) -> Option<String> {
        self.exists(pid).then(|| "worker".to_string())
    }
    fn tids(&self, pid: u32) -> Vec<u32> {
        self.exists(pid).then_some(pid).into_iter().collect()
    }
    fn is_kernel_thread(&self, pid: u32) -> bool {
        pid == 2
    }
    fn cgroup_path(&self, id: u64) -> Option<String> {
        // The unified hierarchy has other directories under the same ids.
        (id == BATCH).then(|| "/unrelated.scope".to_string())
    }
    fn cgroup_id(&self, _: &str) -> Option<u64> {
        None
    }
    fn cgroup_v1_members(&self, _: &str) -> Vec<u32> {
        Vec::new()
    }
    fn cpu_hierarchy(&self) -> String {
        "v1:cpu".to_string()
    }
    fn cpu_cgroup_path(&self, id: u64) -> Option<String> {
        (id == BATCH).then(|| "/batch".to_string())
    }
    fn cpu_cgroup_of(&self, pid: u32) -> Option<String> {
        match pid {
            41 | 42 => Some("/batch".to_string()),
            50 => Some("/".to_string()),
            _ => None,
        }
    }
    fn cpu_cgroup(&self, path: &str) -> Option<CpuCgroup> {
        match path {
            "/batch" => Some(CpuCgroup {
                quota_us: Some(20_000),
                period_us: 100_000,
                nr_periods: 100,
                nr_throttled: 80,
                throttled_us: 8_100_000,
                members: vec![42, 41],
            }),
            "/" => Some(CpuCgroup {
                quota_us: None,
                period_us: 100_000,
                members: vec![50],
                ..Default::default()
            }),
            _ => None,
        }
    }
}
