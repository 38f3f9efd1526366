//! The live host's answers to the reports ([`HostFacts`]), read from
//! `/proc` and the cgroup tree when a report asks.

use crate::{
    process::{cgroups, status, tasks},
    profile::report::host_facts::HostFacts,
};

/// The host as `/proc` and the cgroup mounts show it now.
pub(super) struct LiveHost;

impl HostFacts for LiveHost {
    fn exists(&self, id: u32) -> bool {
        tasks::exists(id)
    }

    fn comm(&self, pid: u32, tid: Option<u32>) -> Option<String> {
        tasks::comm(pid, tid)
    }

    fn tids(&self, pid: u32) -> Vec<u32> {
        tasks::tids(pid)
    }

    fn is_kernel_thread(&self, pid: u32) -> bool {
        status::is_kernel_thread(pid)
    }

    fn cgroup_path(&self, id: u64) -> Option<String> {
        cgroups::system().path_of(id)
    }

    fn cgroup_id(&self, path: &str) -> Option<u64> {
        cgroups::system().id_of(path)
    }

    fn cgroup_v1_members(&self, path: &str) -> Vec<u32> {
        cgroups::v1_members(path)
    }
}
