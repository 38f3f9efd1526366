//! What a report must ask the live host: a process's name and threads
//! now, whether an id runs, and the cgroup tree. Reports read it through
//! this port, never `/proc` or `/sys` themselves, so that each stays a
//! function of the store's snapshot and these answers; the API gives the
//! live host's, tests fixed ones.

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
}
