//! The live host's answers to the reports ([`HostFacts`]): the process
//! table's for processes, threads and cgroup v1 members, the cgroup2
//! tree's for cgroup2 ids and paths, the `cpu` controller's hierarchy's
//! for the cgroups that hold CPU quotas.

use std::sync::Arc;

use super::ApiState;
use crate::{
    process::{cgroups, cpu_cgroup, ProcessTable},
    profile::report::host_facts::{CpuCgroup, HostFacts},
};

/// The host as the process table and the cgroup mounts show it now.
pub(super) struct LiveHost(Arc<ProcessTable>);

impl LiveHost {
    pub fn of(state: &ApiState) -> LiveHost {
        LiveHost(state.shared.processes.clone())
    }
}

impl HostFacts for LiveHost {
    fn exists(&self, id: u32) -> bool {
        self.0.running(id)
    }

    fn comm(&self, pid: u32, tid: Option<u32>) -> Option<String> {
        self.0.thread_name(pid, tid)
    }

    fn tids(&self, pid: u32) -> Vec<u32> {
        self.0.threads(pid)
    }

    fn is_kernel_thread(&self, pid: u32) -> bool {
        self.0.is_kernel_thread(pid)
    }

    fn cgroup_path(&self, id: u64) -> Option<String> {
        cgroups::system().path_of(id)
    }

    fn cgroup_id(&self, path: &str) -> Option<u64> {
        cgroups::system().id_of(path)
    }

    fn cgroup_v1_members(&self, path: &str) -> Vec<u32> {
        self.0.cgroup_v1_members(path)
    }

    fn cpu_hierarchy(&self) -> String {
        cpu_cgroup::system().name()
    }

    fn cpu_cgroup_path(&self, id: u64) -> Option<String> {
        cpu_cgroup::system().path_of(id)
    }

    fn cpu_cgroup_of(&self, pid: u32) -> Option<String> {
        self.0.cpu_cgroup_of(pid)
    }

    fn cpu_cgroup(&self, path: &str) -> Option<CpuCgroup> {
        let hierarchy = cpu_cgroup::system();
        let limits = hierarchy.limits(path)?;
        Some(CpuCgroup {
            quota_us: limits.quota_us,
            period_us: limits.period_us,
            nr_periods: limits.nr_periods,
            nr_throttled: limits.nr_throttled,
            throttled_us: limits.throttled_us,
            members: hierarchy.members(path),
        })
    }
}
