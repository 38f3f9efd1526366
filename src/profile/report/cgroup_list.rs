//! Every cgroup's runqueue latency and throttled time (`/runqueue?cgroup=all`):
//! which cgroups starve for CPU, and which are held back by their quota.
//!
//! BPF files runqueue waits under a thread's unified (cgroup2) cgroup and
//! throttled intervals under its `cpu` controller's cgroup. Where the `cpu`
//! controller has a v1 hierarchy of its own, the two ids name directories
//! of different hierarchies, so a throttled cgroup is a row of its own:
//! named by its path in the `cpu` hierarchy, with the runqueue waits of
//! its members, its quota and its members.

use crate::profile::model::{store::Snapshot, window::Window};
use std::{collections::HashMap, fmt::Write as _};

use serde::Serialize;

use super::{
    hist::{self, Merged},
    host_facts::{HostFacts, UNIFIED},
    query::ns_to_us,
    runqueue::Owner,
    throttling::{self, LISTED_MEMBERS},
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
    /// The hierarchy the id and path are of: `v2`, or `v1:cpu` for a
    /// throttled cgroup of a v1 `cpu` hierarchy.
    pub hierarchy: String,
    /// Runqueue waits (wakeup or preemption to running) and their time.
    pub runqueue_waits: u64,
    pub runqueue_total_us: u64,
    pub runqueue_p99_us: f64,
    /// Intervals runnable but held back because the cgroup's CPU quota
    /// was spent, and their time (not in the waits).
    pub throttled_intervals: u64,
    pub throttled_us: u64,
    /// For a throttled cgroup that still exists: its quota per period
    /// (absent: none), its period, and its processes now (at most
    /// [`LISTED_MEMBERS`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_us: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<u32>,
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
    pub recorded: crate::profile::model::store::Recorded,
    pub cgroups: Vec<CgroupRow>,
}

/// A row's histograms: runqueue waits, throttled intervals.
#[derive(Default)]
struct Hists {
    waits: Merged,
    throttled: Merged,
}

/// Every cgroup with waits or throttled time within `window`.
pub fn list(store: &Snapshot, host: &dyn HostFacts, window: Window) -> CgroupList {
    let cpu = host.cpu_hierarchy();
    let split = cpu != UNIFIED;
    // Per (throttled id of a v1 `cpu` hierarchy, id): the histograms.
    let mut by_id: HashMap<(bool, u64), Hists> = HashMap::new();
    let mut by_pid: HashMap<u32, Merged> = HashMap::new();
    for slice in store.within(window) {
        for (owner, h) in &slice.runq_hists {
            match *owner {
                HistOwner::Cgroup(id) => by_id.entry((false, id)).or_default().waits.add(h),
                HistOwner::CgroupThrottled(id) => {
                    by_id.entry((split, id)).or_default().throttled.add(h)
                }
                HistOwner::Process(pid) if split => by_pid.entry(pid).or_default().add(h),
                HistOwner::Process(_) | HistOwner::ProcessThrottled(_) => {}
            }
        }
    }
    let mut cgroups: Vec<CgroupRow> = by_id
        .into_iter()
        .map(|((in_cpu, id), mut hists)| {
            let (path, hierarchy) = match in_cpu {
                true => (host.cpu_cgroup_path(id), cpu.clone()),
                false => (host.cgroup_path(id), UNIFIED.to_string()),
            };
            let throttled = hists.throttled.count() > 0;
            let quota = path
                .as_deref()
                .filter(|_| throttled)
                .and_then(|p| host.cpu_cgroup(p));
            let members = quota
                .as_ref()
                .map(|q| q.members.clone())
                .unwrap_or_default();
            if in_cpu {
                // Its members' waits: BPF filed them under unified ids.
                for pid in &members {
                    if let Some(h) = by_pid.get(pid) {
                        hists.waits.absorb(h);
                    }
                }
            }
            let waits = &hists.waits;
            CgroupRow {
                owner: Owner::Cgroup { cgroup: id, path },
                hierarchy,
                runqueue_waits: waits.count(),
                runqueue_total_us: ns_to_us(waits.ns),
                runqueue_p99_us: hist::quantile_rounded(&waits.slots, 0.99),
                throttled_intervals: hists.throttled.count(),
                throttled_us: ns_to_us(hists.throttled.ns),
                quota_us: quota.as_ref().and_then(|q| q.quota_us),
                period_us: quota.as_ref().map(|q| q.period_us),
                members: members.into_iter().take(LISTED_MEMBERS).collect(),
            }
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
            describe(r)
        );
    }
    out
}

/// E.g. `cgroup 17 (/batch) v1:cpu, quota 20.0 ms / 100.0 ms, members 41 42`.
fn describe(r: &CgroupRow) -> String {
    let mut out = format!("{} {}", r.owner.describe(), r.hierarchy);
    match (r.quota_us, r.period_us) {
        (Some(q), Some(p)) => {
            let (q, p) = (throttling::duration(q), throttling::duration(p));
            let _ = write!(out, ", quota {q} / {p}");
        }
        (None, Some(_)) => out.push_str(", no quota"),
        _ => {}
    }
    if !r.members.is_empty() {
        let pids: Vec<String> = r.members.iter().map(u32::to_string).collect();
        let _ = write!(out, ", members {}", pids.join(" "));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use std::time::Duration;

    use super::*;
    use crate::profile::model::state::{Hist, HIST_SLOTS};
    use crate::profile::model::{store::Store, Slice};
    use crate::profile::report::host_facts::{Empty, Hybrid, BATCH};

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
            stats: [0; crate::profile::model::state::STAT_COUNTERS],
            spans: Default::default(),
        });
        let list = list(&store.snapshot(), &Empty, Window::last(30, end));
        let ids: Vec<u64> = list.cgroups.iter().map(id).collect();
        assert_eq!(ids, [capped, busy, idle]);
        let json = serde_json::to_value(&list).unwrap();
        assert_eq!(
            json["cgroups"][0],
            serde_json::json!({
                "cgroup": capped,
                "hierarchy": "v2",
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
        let row = format!(
            "        25.0          2         10          0.1        8.0  cgroup {capped} v2"
        );
        assert_eq!(lines[3], row);
        assert!(list_is_empty_outside_the_window(&store, end));
    }

    /// A hybrid host: the throttled `cpu` cgroup is a row of its own,
    /// named in its hierarchy, with its members' waits, quota and members;
    /// the unified id BPF filed the waits under stays a `v2` row.
    #[test]
    fn a_v1_cpu_cgroup_is_named_in_its_own_hierarchy() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        let mut slice = Slice::empty(end - Duration::from_secs(1), end);
        slice.runq_hists = vec![
            (HistOwner::Cgroup(BATCH), hist(10, 4, 40_000)),
            (HistOwner::CgroupThrottled(BATCH), hist(14, 3, 30_000_000)),
            (HistOwner::Process(41), hist(10, 2, 20_000)),
            (HistOwner::Process(50), hist(10, 9, 90_000)),
        ];
        store.push(slice);
        let list = list(&store.snapshot(), &Hybrid, Window::last(30, end));
        let json = serde_json::to_value(&list).unwrap();
        assert_eq!(
            json["cgroups"][0],
            serde_json::json!({
                "cgroup": BATCH,
                "path": "/batch",
                "hierarchy": "v1:cpu",
                "runqueue_waits": 2,
                "runqueue_total_us": 20,
                "runqueue_p99_us": 1018.9,
                "throttled_intervals": 3,
                "throttled_us": 30_000,
                "quota_us": 20_000,
                "period_us": 100_000,
                "members": [42, 41],
            })
        );
        let unified = &json["cgroups"][1];
        assert_eq!(
            (
                &unified["path"],
                &unified["hierarchy"],
                &unified["runqueue_waits"]
            ),
            (
                &serde_json::json!("/unrelated.scope"),
                &serde_json::json!("v2"),
                &serde_json::json!(4)
            )
        );
        let text = render_text(&list);
        assert!(
            text.contains("cgroup 17 (/batch) v1:cpu, quota 20.0 ms / 100.0 ms, members 42 41"),
            "{text}"
        );
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
