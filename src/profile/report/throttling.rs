//! Throttling by a cgroup's CPU quota, named: the cgroup whose `cpu`
//! controller holds a process back (or each cgroup of the host that was
//! throttled), by its path in that controller's own hierarchy (`v1:cpu` on
//! hybrid hosts, where it is not the unified one), with its quota and
//! period as the cgroup sets them, the kernel's counters, its members,
//! and what the window recorded of them. A quota-bound workload shows its
//! CPU use flat at `quota / period` CPUs while its threads sit throttled.
//! A pure function of the store and the [`HostFacts`] port, for `/explain`
//! (one finding), `/runqueue?cgroup=all` and `/host`.

use std::{
    collections::{HashMap, HashSet},
    fmt::Write as _,
    time::SystemTime,
};

use serde::Serialize;

use super::{
    disclosure::Sight,
    hist::Merged,
    host_facts::{CpuCgroup, HostFacts},
    query::ns_to_us,
};
use crate::profile::model::{state::State, store::Snapshot, window::Window, HistOwner};

/// Members listed by pid, at most.
pub const LISTED_MEMBERS: usize = 10;
/// Cgroups a host-wide answer names, at most.
pub const LISTED_CGROUPS: usize = 10;

/// What one cgroup's CPU quota did to its processes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Throttling {
    /// Its path in the `cpu` controller's hierarchy.
    pub path: String,
    /// That hierarchy: `v1:cpu` (`v1:cpu,cpuacct`) or `v2`.
    pub hierarchy: String,
    /// CPU time allowed per period (`cpu.max`, `cpu.cfs_quota_us`);
    /// absent: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota_us: Option<u64>,
    pub period_us: u64,
    /// `quota_us / period_us`: the CPUs the quota allows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Its processes now (those the reader may see, busiest first), at
    /// most [`LISTED_MEMBERS`], and how many it holds.
    pub members: Vec<u32>,
    pub member_count: usize,
    /// CPU time of those members in the window, and as CPUs over the
    /// part of the window they ran in (flat at `cpus` is the signature of
    /// a quota).
    pub cpu_us: u64,
    pub cpus_used: f64,
    /// Time its threads were runnable but held back by the quota in the
    /// window, in how many intervals, and the share of its members' wall
    /// time that was.
    pub throttled_us: u64,
    pub throttled_intervals: u64,
    pub share_of_wall_throttled: f64,
    /// The kernel's counters (`cpu.stat`), since the cgroup was made:
    /// periods with runnable threads, those that ran out of quota, their
    /// share, and the time throttled summed over CPUs.
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub share_of_periods_throttled: f64,
    pub kernel_throttled_us: u64,
}

/// The throttling of `pid`'s `cpu` cgroup in `window`; `None` when the
/// process is gone, or its cgroup has no quota and was not throttled.
pub fn of_pid(
    store: &Snapshot,
    host: &dyn HostFacts,
    window: Window,
    pid: u32,
    sight: &Sight,
) -> Option<Throttling> {
    of_path(store, host, window, &host.cpu_cgroup_of(pid)?, sight)
}

/// The throttling of the `cpu` cgroup at `path` in `window`; `None` when
/// there is none, or it has no quota and was not throttled.
pub fn of_path(
    store: &Snapshot,
    host: &dyn HostFacts,
    window: Window,
    path: &str,
    sight: &Sight,
) -> Option<Throttling> {
    let recorded = throttled_by_path(store, host, window)
        .remove(path)
        .unwrap_or_default();
    facts(store, host, window, path, &recorded, sight)
}

/// Every cgroup throttled in `window`, most throttled time first, at most
/// [`LISTED_CGROUPS`].
pub fn host_wide(
    store: &Snapshot,
    host: &dyn HostFacts,
    window: Window,
    sight: &Sight,
) -> Vec<Throttling> {
    let mut by_path: Vec<(String, Merged)> =
        throttled_by_path(store, host, window).into_iter().collect();
    by_path.sort_by(|a, b| b.1.ns.cmp(&a.1.ns).then_with(|| a.0.cmp(&b.0)));
    by_path
        .iter()
        .take(LISTED_CGROUPS)
        .filter_map(|(path, recorded)| facts(store, host, window, path, recorded, sight))
        .collect()
}

/// The throttled intervals of `window` by the path of their `cpu` cgroup
/// (ids that no longer resolve are left out: the cgroup is gone).
fn throttled_by_path(
    store: &Snapshot,
    host: &dyn HostFacts,
    window: Window,
) -> HashMap<String, Merged> {
    let mut by_id: HashMap<u64, Merged> = HashMap::new();
    for slice in store.within(window) {
        for (owner, h) in &slice.runq_hists {
            if let HistOwner::CgroupThrottled(id) = *owner {
                by_id.entry(id).or_default().add(h);
            }
        }
    }
    let mut by_path: HashMap<String, Merged> = HashMap::new();
    for (id, merged) in by_id {
        if let Some(path) = host.cpu_cgroup_path(id) {
            by_path.entry(path).or_default().absorb(&merged);
        }
    }
    by_path
}

/// The facts of the `cpu` cgroup at `path`, with `recorded` its
/// throttled intervals of the window; `None` when it is gone, or has no
/// quota and nothing recorded.
fn facts(
    store: &Snapshot,
    host: &dyn HostFacts,
    window: Window,
    path: &str,
    recorded: &Merged,
    sight: &Sight,
) -> Option<Throttling> {
    let CpuCgroup {
        quota_us,
        period_us,
        nr_periods,
        nr_throttled,
        throttled_us: kernel_throttled_us,
        members,
    } = host.cpu_cgroup(path)?;
    if quota_us.is_none() && recorded.is_empty() {
        // Nothing to say, and the window need not be read.
        return None;
    }
    let now = SystemTime::now();
    let shown: HashSet<u32> = members
        .iter()
        .copied()
        .filter(|&pid| sight.sees(pid, now))
        .collect();
    let times = member_times(store, window, &shown);
    let mut seen: Vec<(u64, u32)> = shown
        .iter()
        .map(|&pid| (times.by_pid.get(&pid).copied().unwrap_or(0), pid))
        .collect();
    seen.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let (cpu, wall, held, span_ns) = (
        times.cpu_ns,
        times.wall_ns,
        times.throttled_ns,
        times.span_ns,
    );
    let ratio = |a: u64, b: u64| {
        if b > 0 {
            round3(a as f64 / b as f64)
        } else {
            0.0
        }
    };
    Some(Throttling {
        path: path.to_string(),
        hierarchy: host.cpu_hierarchy(),
        quota_us,
        period_us,
        cpus: quota_us.map(|q| ratio(q, period_us)),
        members: seen.iter().take(LISTED_MEMBERS).map(|m| m.1).collect(),
        member_count: members.len(),
        cpu_us: ns_to_us(cpu),
        cpus_used: ratio(cpu, span_ns),
        throttled_us: ns_to_us(recorded.ns),
        throttled_intervals: recorded.count(),
        share_of_wall_throttled: ratio(held, wall),
        nr_periods,
        nr_throttled,
        share_of_periods_throttled: ratio(nr_throttled, nr_periods),
        kernel_throttled_us,
    })
}

/// What the window holds of a cgroup's members: their CPU, wall and
/// throttled time, each one's CPU, and the span of the slices they ran
/// in (CPUs used while they lived, not over a window reaching before
/// them). Only their threads' totals are read, not the whole window's.
#[derive(Default)]
struct MemberTimes {
    by_pid: HashMap<u32, u64>,
    cpu_ns: u64,
    wall_ns: u64,
    throttled_ns: u64,
    span_ns: u64,
}

fn member_times(store: &Snapshot, window: Window, members: &HashSet<u32>) -> MemberTimes {
    let mut times = MemberTimes::default();
    for slice in store.within(window) {
        let mut ran = false;
        for t in slice
            .thread_totals
            .iter()
            .filter(|t| members.contains(&t.pid))
        {
            let ns = &t.counters.ns;
            let cpu = ns[State::Cpu as usize];
            *times.by_pid.entry(t.pid).or_default() += cpu;
            times.cpu_ns += cpu;
            times.wall_ns += ns.iter().sum::<u64>();
            times.throttled_ns += ns[State::Throttled as usize];
            ran = true;
        }
        if ran {
            let span = slice.end.duration_since(slice.start).unwrap_or_default();
            times.span_ns += span.as_nanos() as u64;
        }
    }
    times
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `us` as seconds, or milliseconds below one second.
pub fn duration(us: u64) -> String {
    if us >= 1_000_000 {
        format!("{:.1} s", us as f64 / 1e6)
    } else {
        format!("{:.1} ms", us as f64 / 1e3)
    }
}

/// The cgroup and its quota in words: `/batch (v1:cpu) quota 20.0 ms /
/// 100.0 ms (0.2 CPU)`, or `no quota`.
pub fn describe_cgroup(t: &Throttling) -> String {
    let quota = match (t.quota_us, t.cpus) {
        (Some(q), Some(cpus)) => format!(
            "quota {} / {} ({cpus} CPU)",
            duration(q),
            duration(t.period_us)
        ),
        _ => "no quota".to_string(),
    };
    format!("{} ({}) {quota}", t.path, t.hierarchy)
}

/// One line for a finding: `throttled by its cgroup's CPU quota: /batch
/// (v1:cpu) quota 20.0 ms / 100.0 ms (0.2 CPU), using 0.20 CPU; throttled
/// 83 % of periods (cpu.stat), 5.1 s in the last 30 s (61 % of its
/// members' wall time); members 41, 42`.
pub fn describe(t: &Throttling, window: &str) -> String {
    let mut out = format!(
        "throttled by its cgroup's CPU quota: {}, using {:.2} CPU; throttled {:.0} % of periods \
         (cpu.stat), {} in the {window} ({:.0} % of its members' wall time)",
        describe_cgroup(t),
        t.cpus_used,
        t.share_of_periods_throttled * 100.0,
        duration(t.throttled_us),
        t.share_of_wall_throttled * 100.0,
    );
    if !t.members.is_empty() {
        let pids: Vec<String> = t.members.iter().map(u32::to_string).collect();
        let more = t.member_count.saturating_sub(t.members.len());
        let _ = write!(out, "; members {}", pids.join(", "));
        if more > 0 {
            let _ = write!(out, " and {more} more");
        }
    }
    out
}

#[cfg(test)]
#[path = "throttling_tests.rs"]
mod tests;
