//! The live host's answers to the reports ([`HostFacts`]): the process
//! table's for processes and threads, the cgroup tree's for cgroups.

use std::sync::Arc;

use super::ApiState;
use crate::{
    process::{cgroups, ProcessTable},
    profile::report::host_facts::HostFacts,
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
        cgroups::v1_members(path)
    }
}
