//! Every cgroup's runqueue latency and throttled time (`/runqueue?cgroup=all`):
//! which cgroups starve for CPU, and which are held back by their quota.

use crate::profile::model::{store::Snapshot, window::Window};
use std::{collections::HashMap, fmt::Write as _};

use serde::Serialize;

use super::{
    hist::{self, Merged},
    host_facts::HostFacts,
    query::ns_to_us,
    runqueue::Owner,
};
use crate::profile::model::HistOwner;

/// The `cgroup` value that asks for the listing (no id or path looks so).
pub const ALL: &str = "all";

/// One cgroup's row.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CgroupRow {
    /// `cgroup` (id) and `path` (when it resolves).
    #[serde(flatten)]
    pub owner: Owner,
    /// Runqueue waits (wakeup or preemption to running) and their time.
    pub runqueue_waits: u64,
    pub runqueue_total_us: u64,
    pub runqueue_p99_us: f64,
    /// Intervals runnable but held back because the cgroup's CPU quota
    /// was spent, and their time (not in the waits).
    pub throttled_intervals: u64,
    pub throttled_us: u64,
}

/// The listing: throttled cgroups first (most throttled time first), then
/// by runqueue time.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CgroupList {
    pub seconds: u64,
    /// The window in words: `last 30 s`, or its range.
    pub window: String,
    /// Seconds of the window the daemon has records of
    /// (`recorded_seconds`: less than `seconds` when the window reaches
    /// before them), their resolution, oldest first (`resolution`), and
    /// the exact span held (`covered`).
    #[serde(flatten)]
    pub recorded: crate::profile::store::Recorded,
    pub cgroups: Vec<CgroupRow>,
}

/// Every cgroup with waits or throttled time within `window`.
pub fn list(store: &Snapshot, host: &dyn HostFacts, window: Window) -> CgroupList {
    // Per cgroup id: waits, throttled.
    let mut by_id: HashMap<u64, (Merged, Merged)> = HashMap::new();
    for slice in store.within(window) {
        for (owner, h) in &slice.runq_hists {
            match *owner {
                HistOwner::Cgroup(id) => by_id.entry(id).or_default().0.add(h),
                HistOwner::CgroupThrottled(id) => by_id.entry(id).or_default().1.add(h),
                HistOwner::Process(_) | HistOwner::ProcessThrottled(_) => {}
            }
        }
    }
    let mut cgroups: Vec<CgroupRow> = by_id
        .into_iter()
        .map(|(id, (waits, throttled))| CgroupRow {
            owner: Owner::resolve(host, HistOwner::Cgroup(id)),
            runqueue_waits: waits.count(),
            runqueue_total_us: ns_to_us(waits.ns),
            runqueue_p99_us: hist::quantile_rounded(&waits.slots, 0.99),
            throttled_intervals: throttled.count(),
            throttled_us: ns_to_us(throttled.ns),
        })
        .collect();
    cgroups.sort_by(|a, b| {
        let key = |r: &CgroupRow| (r.throttled_us, r.throttled_intervals, r.runqueue_total_us);
        key(b).cmp(&key(a)).then_with(|| id(a).cmp(&id(b)))
    });
    CgroupList {
        seconds: window.seconds(),
        window: window.describe(),
        recorded: Default::default(),
        cgroups,
    }
}

fn id(row: &CgroupRow) -> u64 {
    match row.owner {
        Owner::Cgroup { cgroup, .. } => cgroup,
        Owner::Pid { pid } => u64::from(pid),
        Owner::Host { .. } | Owner::CgroupV1 { .. } => 0,
    }
}

/// A table for a terminal, in the listing's order.
pub fn render_text(list: &CgroupList) -> String {
    let mut out = String::new();
    let throttled = list.cgroups.iter().filter(|r| r.throttled_intervals > 0);
    let _ = writeln!(
        out,
        "cgroups, {}: {} with runqueue waits or throttling, {} throttled (CPU quota spent)\n",
        list.window,
        list.cgroups.len(),
        throttled.count()
    );
    let _ = writeln!(
        out,
        "{:>12} {:>10} {:>10} {:>12} {:>10}  CGROUP",
        "THROTTLED ms", "INTERVALS", "RUNQ WAITS", "RUNQ ms", "p99 us"
    );
    for r in &list.cgroups {
        let _ = writeln!(
            out,
            "{:>12.1} {:>10} {:>10} {:>12.1} {:>10.1}  {}",
            r.throttled_us as f64 / 1000.0,
            r.throttled_intervals,
            r.runqueue_waits,
            r.runqueue_total_us as f64 / 1000.0,
            r.runqueue_p99_us,
            r.owner.describe()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use std::time::Duration;

    use super::*;
    use crate::bpf::abi::{Hist, HIST_SLOTS};
    use crate::profile::model::{store::Store, Slice};
    use crate::profile::report::host_facts::Empty;

    fn hist(slot: usize, n: u64, ns: u64) -> Hist {
        let mut h = Hist {
            slots: [0; HIST_SLOTS],
            ns,
        };
        h.slots[slot] = n;
        h
    }

    #[test]
    fn throttled_cgroups_come_first() {
        // Ids no cgroup2 mount has: they stay unresolved.
        let (busy, capped, idle) = (u64::MAX - 3, u64::MAX - 4, u64::MAX - 5);
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        store.push(Slice {
            start: end - Duration::from_secs(1),
            end,
            samples: vec![],
            wakeups: vec![],
            threads: HashMap::new(),
            thread_totals: vec![],
            runq_hists: vec![
                (HistOwner::Cgroup(busy), hist(10, 50, 40_000_000)),
                (HistOwner::Cgroup(capped), hist(3, 10, 60_000)),
                (HistOwner::CgroupThrottled(capped), hist(14, 2, 25_000_000)),
                (HistOwner::Cgroup(idle), hist(0, 1, 300)),
                (HistOwner::Process(7), hist(20, 9, 1)),
                (HistOwner::ProcessThrottled(7), hist(20, 9, 1)),
            ],
            processes: HashMap::new(),
            containers: Default::default(),
            origins: Default::default(),
            kept_off: Default::default(),
            sleeps: Default::default(),
            stats: [0; crate::bpf::abi::Stat::COUNT],
        });
        let list = list(&store.snapshot(), &Empty, Window::last(30, end));
        let ids: Vec<u64> = list.cgroups.iter().map(id).collect();
        assert_eq!(ids, [capped, busy, idle]);
        let json = serde_json::to_value(&list).unwrap();
        assert_eq!(
            json["cgroups"][0],
            serde_json::json!({
                "cgroup": capped,
                "runqueue_waits": 10,
                "runqueue_total_us": 60,
                "runqueue_p99_us": 8.0,
                "throttled_intervals": 2,
                "throttled_us": 25_000,
            })
        );
        assert_eq!(json["cgroups"][1]["throttled_us"], 0);
        let text = render_text(&list);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "cgroups, last 30 s: 3 with runqueue waits or throttling, 1 throttled (CPU quota spent)"
        );
        assert!(lines[2].starts_with("THROTTLED ms  INTERVALS"), "{text}");
        let row =
            format!("        25.0          2         10          0.1        8.0  cgroup {capped}");
        assert_eq!(lines[3], row);
        assert!(list_is_empty_outside_the_window(&store, end));
    }

    fn list_is_empty_outside_the_window(store: &Store, end: SystemTime) -> bool {
        list(
            &store.snapshot(),
            &Empty,
            Window::last(30, end + Duration::from_secs(60)),
        )
        .cgroups
        .is_empty()
    }
}
