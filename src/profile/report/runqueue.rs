//! Runqueue latency (`/runqueue`): how long threads of a process, a cgroup
//! or the host waited in the runqueue, once woken or once preempted, from
//! the BPF log2 histograms; and, apart from it, how long they were throttled (runnable, but their cgroup's CPU
//! quota was spent), which the latency histogram does not count.

use crate::profile::model::{store::Snapshot, window::Window};
use std::fmt::Write as _;

use serde::Serialize;

use super::{
    hist::{self, Bucket, Merged},
    host_facts::HostFacts,
    query::ns_to_us,
    threads::recorded_note,
};
use crate::profile::model::HistOwner;

/// Whose latency a report shows, as it appears in JSON: `{"pid": P}` or
/// `{"cgroup": ID, "path": "/system.slice/..."}` (path only if resolved).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Owner {
    /// Every process of the host: `{"host": true}`.
    Host {
        host: bool,
    },
    Pid {
        pid: u32,
    },
    /// A cgroup v1 directory, by its processes: `{"cgroup_v1": "/render",
    /// "processes": 3}`.
    CgroupV1 {
        cgroup_v1: String,
        processes: usize,
    },
    Cgroup {
        cgroup: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        path: Option<String>,
    },
}

impl Owner {
    /// The JSON owner of `owner`, resolving cgroup ids to paths.
    pub fn resolve(host: &dyn HostFacts, owner: HistOwner) -> Owner {
        match owner {
            HistOwner::Process(pid) | HistOwner::ProcessThrottled(pid) => Owner::Pid { pid },
            HistOwner::Cgroup(id) | HistOwner::CgroupThrottled(id) => Owner::Cgroup {
                cgroup: id,
                path: host.cgroup_path(id),
            },
        }
    }

    /// E.g. `pid 42` or `cgroup 1234 (/system.slice/ssh.service)`.
    pub fn describe(&self) -> String {
        match self {
            Owner::Host { .. } => "the host".to_string(),
            Owner::CgroupV1 {
                cgroup_v1,
                processes,
            } => format!("cgroup v1 {cgroup_v1} ({processes} processes)"),
            Owner::Pid { pid } => format!("pid {pid}"),
            Owner::Cgroup {
                cgroup,
                path: Some(path),
            } => format!("cgroup {cgroup} ({path})"),
            Owner::Cgroup { cgroup, path: None } => format!("cgroup {cgroup}"),
        }
    }
}

/// Throttled time of a process or cgroup: intervals it was runnable but
/// held back because its cgroup's CPU quota (CFS bandwidth) was spent.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Throttled {
    /// Number of throttled intervals.
    pub count: u64,
    /// Their total time.
    pub total_us: u64,
    /// The highest non-empty bucket: the longest interval lies in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bucket: Option<Bucket>,
    /// Interval lengths, log2 us buckets as for the waits.
    pub buckets: Vec<Bucket>,
}

/// The `/runqueue` answer for one process or cgroup.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunqueueReport {
    pub owner: Owner,
    pub seconds: u64,
    /// The window in words: `last 30 s`, or its range.
    pub window: String,
    /// Seconds of the window the daemon has records of
    /// (`recorded_seconds`: less than `seconds` when the window reaches
    /// before them), their resolution, oldest first (`resolution`), and
    /// the exact span held (`covered`).
    #[serde(flatten)]
    pub recorded: crate::profile::model::store::Recorded,
    /// Number of runqueue waits (wakeup or preemption to running).
    pub count: u64,
    /// Their total time.
    pub total_us: u64,
    /// Quantiles of the waits, interpolated within log2 buckets.
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    /// Whether the quantiles are estimates (off by up to their bucket's
    /// width; text marks them `~`): always, the waits being counted in
    /// buckets only.
    pub approx: bool,
    /// The highest non-empty bucket: the longest wait lies in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bucket: Option<Bucket>,
    /// From the lowest to the highest non-empty bucket, empty ones between
    /// included.
    pub buckets: Vec<Bucket>,
    /// Time throttled, not counted in the waits above.
    pub throttled: Throttled,
    /// The cgroup whose CPU quota holds the process (or cgroup) back,
    /// named in the `cpu` controller's hierarchy, when it has a quota.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttled_by: Option<super::throttling::Throttling>,
    /// For a process: who ran on the CPU while its threads waited for it,
    /// most first (see [`super::culprits`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_off_cpu_by: Vec<super::culprits::Culprit>,
    /// Why the report is empty, when it is (a known process that neither
    /// waited nor was throttled in the window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Why a `pid`/`cgroup` choice names no histogram owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerError {
    /// A malformed or missing parameter (HTTP 400).
    Param(&'static str, String),
    /// A well-formed path where no cgroup is (HTTP 404).
    NoSuchCgroup(String),
}

/// The owner named by exactly one of `pid` and `cgroup` (an id, or a path
/// under the cgroup2 mount such as `/system.slice/ssh.service`). The
/// listing of every cgroup (`cgroup=all`) is [`super::cgroup_list`]'s.
pub fn owner(
    host: &dyn HostFacts,
    pid: Option<u32>,
    cgroup: Option<&str>,
) -> Result<HistOwner, OwnerError> {
    let either = "give either `pid` or `cgroup`";
    match (pid, cgroup) {
        (Some(pid), None) => Ok(HistOwner::Process(pid)),
        (None, None) => Err(OwnerError::Param("pid", format!("required: {either}"))),
        (Some(_), Some(_)) => Err(OwnerError::Param("cgroup", format!("{either}, not both"))),
        (None, Some(arg)) if arg.starts_with('/') => match host.cgroup_id(arg) {
            Some(id) => Ok(HistOwner::Cgroup(id)),
            None => Err(OwnerError::NoSuchCgroup(format!("no cgroup at {arg}"))),
        },
        // Plain digits only: `str::parse` would also take `+5`.
        (None, Some(arg)) => arg
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| arg.parse().ok())
            .flatten()
            .map(HistOwner::Cgroup)
            .ok_or_else(|| {
                let message =
                    format!("expected an id, a path such as /system.slice, or `all`, got `{arg}`");
                OwnerError::Param("cgroup", message)
            }),
    }
}

/// The histogram owner holding `owner`'s throttled intervals.
pub fn throttled_owner(owner: HistOwner) -> HistOwner {
    match owner {
        HistOwner::Process(pid) | HistOwner::ProcessThrottled(pid) => {
            HistOwner::ProcessThrottled(pid)
        }
        HistOwner::Cgroup(id) | HistOwner::CgroupThrottled(id) => HistOwner::CgroupThrottled(id),
    }
}

/// The report of the whole host within `window`: every process's
/// histograms merged (each wait counts once, in its process's histogram);
/// `None` when nothing waited or was throttled.
pub fn host_report(store: &Snapshot, window: Window) -> Option<RunqueueReport> {
    let waits = hist::merged_where(store, window, |o| matches!(o, HistOwner::Process(_)));
    let throttled = hist::merged_where(store, window, |o| {
        matches!(o, HistOwner::ProcessThrottled(_))
    });
    from_merged(&waits, &throttled, Owner::Host { host: true }, window)
}

/// The report of the processes `pids` (a cgroup v1 directory's) within
/// `window`; `None` when none of them waited or was throttled.
pub fn processes_report(
    store: &Snapshot,
    owner: Owner,
    pids: &[u32],
    window: Window,
) -> Option<RunqueueReport> {
    let pids: std::collections::HashSet<u32> = pids.iter().copied().collect();
    let waits = hist::merged_where(
        store,
        window,
        |o| matches!(o, HistOwner::Process(p) if pids.contains(p)),
    );
    let throttled = hist::merged_where(
        store,
        window,
        |o| matches!(o, HistOwner::ProcessThrottled(p) if pids.contains(p)),
    );
    from_merged(&waits, &throttled, owner, window)
}

/// The report of `owner` (a [`HistOwner::Process`] or
/// [`HistOwner::Cgroup`]) within `window`; `None` when it neither
/// waited nor was throttled.
pub fn report(
    store: &Snapshot,
    host: &dyn HostFacts,
    owner: HistOwner,
    window: Window,
) -> Option<RunqueueReport> {
    let waits = hist::merged(store, owner, window);
    let throttled = hist::merged(store, throttled_owner(owner), window);
    from_merged(&waits, &throttled, Owner::resolve(host, owner), window)
}

/// The report on merged histograms; `None` if both are empty.
pub fn from_merged(
    waits: &Merged,
    throttled: &Merged,
    owner: Owner,
    window: Window,
) -> Option<RunqueueReport> {
    if waits.is_empty() && throttled.is_empty() {
        return None;
    }
    Some(summary(waits, throttled, owner, window))
}

/// `mean 37.2 us, ` (exact: total time over count), when the time is
/// known.
fn mean(total_us: u64, count: u64) -> String {
    match (total_us, count) {
        (0, _) | (_, 0) => String::new(),
        _ => format!("mean {:.1} us, ", total_us as f64 / count as f64),
    }
}

fn summary(waits: &Merged, throttled: &Merged, owner: Owner, window: Window) -> RunqueueReport {
    let q = |q| hist::quantile_rounded(&waits.slots, q);
    RunqueueReport {
        owner,
        seconds: window.seconds(),
        window: window.describe(),
        recorded: crate::profile::model::store::Recorded {
            seconds: window.seconds(),
            ..Default::default()
        },
        count: waits.count(),
        total_us: ns_to_us(waits.ns),
        p50_us: q(0.5),
        p90_us: q(0.9),
        p99_us: q(0.99),
        approx: true,
        max_bucket: waits.max_bucket(),
        buckets: waits.buckets(),
        throttled: Throttled {
            count: throttled.count(),
            total_us: ns_to_us(throttled.ns),
            max_bucket: throttled.max_bucket(),
            buckets: throttled.buckets(),
        },
        throttled_by: None,
        kept_off_cpu_by: Vec::new(),
        note: None,
    }
}

/// The report of `owner` when it neither waited nor was throttled in the
/// window: every figure 0, and `note` saying so.
pub fn empty(owner: Owner, window: Window, note: String) -> RunqueueReport {
    let none = Merged::default();
    RunqueueReport {
        note: Some(note),
        ..summary(&none, &none, owner, window)
    }
}

/// A summary line, then the histogram as BCC's runqlat prints it; then the
/// same for the throttled intervals.
pub fn render_text(r: &RunqueueReport) -> String {
    let mut out = String::new();
    let who = r.owner.describe();
    if r.count == 0 {
        let _ = writeln!(
            out,
            "runqueue latency of {who}, {}{}: no waits",
            r.window,
            recorded_note(r.seconds, r.recorded.seconds)
        );
    } else {
        let _ = writeln!(
            out,
            "runqueue latency of {who}, {}{}: {} waits, {}p50 ~{:.1} us, p90 ~{:.1} us, p99 ~{:.1} us (~: within log2 buckets)\n",
            r.window,
            recorded_note(r.seconds, r.recorded.seconds),
            r.count,
            mean(r.total_us, r.count),
            r.p50_us,
            r.p90_us,
            r.p99_us
        );
        hist::render_bars(&mut out, &r.buckets);
    }
    let t = &r.throttled;
    let _ = write!(
        out,
        "\nthrottled (CPU quota spent) of {who}, {}: ",
        r.window
    );
    if t.count == 0 {
        let _ = writeln!(out, "none");
    } else {
        let _ = writeln!(
            out,
            "{} intervals, {:.1} ms in all (not in the waits above)\n",
            t.count,
            t.total_us as f64 / 1000.0
        );
        hist::render_bars(&mut out, &t.buckets);
    }
    if let Some(quota) = &r.throttled_by {
        let _ = writeln!(out, "{}", super::throttling::describe(quota, &r.window));
    }
    if !r.kept_off_cpu_by.is_empty() {
        let _ = writeln!(
            out,
            "\nkept off the CPU by (what ran on it while {who} waited):"
        );
        for c in &r.kept_off_cpu_by {
            let cgroup = c
                .cgroup
                .as_deref()
                .map(|g| format!(" [{g}]"))
                .unwrap_or_default();
            let pids = if c.pids.is_empty() {
                String::new()
            } else {
                let list: Vec<String> = c.pids.iter().map(u32::to_string).collect();
                format!(" pid {}", list.join(","))
            };
            let _ = writeln!(
                out,
                "  {:>5.1}%  {:>10.1} ms  {}{pids}{cgroup}",
                c.share * 100.0,
                c.us as f64 / 1000.0,
                c.label()
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use std::{collections::HashMap, time::Duration};

    use super::*;
    use crate::profile::model::state::{Hist, HIST_SLOTS};
    use crate::profile::model::{store::Store, Slice};
    use crate::profile::report::host_facts::Empty;

    /// 100 waits: 10 under 1 us, 40 in [4, 8), 40 in [8, 16), 10 in [64, 128).
    fn slots() -> hist::Slots {
        let mut s = [0; HIST_SLOTS];
        (s[0], s[3], s[4], s[7]) = (10, 40, 40, 10);
        s
    }

    fn bucket(from_us: u64, to_us: u64, count: u64) -> Bucket {
        Bucket {
            from_us,
            to_us,
            count,
        }
    }

    /// Two slices, 50 s and 1 s old: pid 7 waits (and is throttled 3
    /// times for 30 ms in all, 1 ms to 16 ms each); pid 8 waits; pid 9 is
    /// only throttled.
    fn store(end: SystemTime) -> Store {
        let mut store = Store::new(Duration::from_secs(600));
        let other = Hist {
            slots: [1; HIST_SLOTS],
            ns: 0,
        };
        let mut throttled = Hist {
            slots: [0; HIST_SLOTS],
            ns: 30_000_000,
        };
        (throttled.slots[11], throttled.slots[14]) = (2, 1);
        for age in [50, 1] {
            store.push(Slice {
                start: end - Duration::from_secs(age + 1),
                end: end - Duration::from_secs(age),
                samples: vec![],
                wakeups: vec![],
                threads: HashMap::new(),
                thread_totals: vec![],
                runq_hists: vec![
                    (
                        HistOwner::Process(7),
                        Hist {
                            slots: slots(),
                            ns: 2_000_000,
                        },
                    ),
                    (HistOwner::Process(8), other),
                    (HistOwner::ProcessThrottled(7), throttled),
                    (HistOwner::ProcessThrottled(9), throttled),
                ],
                processes: HashMap::new(),
                containers: Default::default(),
                origins: Default::default(),
                kept_off: Default::default(),
                sleeps: Default::default(),
                stats: [0; crate::profile::model::state::STAT_COUNTERS],
                spans: Default::default(),
            });
        }
        store
    }

    #[test]
    fn report_merges_one_owner_over_the_window() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let store = store(end);
        let report = |pid, seconds| {
            report(
                &store.snapshot(),
                &Empty,
                HistOwner::Process(pid),
                Window::last(seconds, end),
            )
        };
        let r = report(7, 30).unwrap();
        assert_eq!((r.count, r.p50_us, r.p99_us), (100, 8.0, 121.6));
        assert_eq!(r.total_us, 2_000);
        assert_eq!(r.max_bucket, Some(bucket(64, 128, 10)));
        assert_eq!(r.buckets.len(), 8, "slots 0..=7");
        assert_eq!(r.buckets[1], bucket(1, 2, 0));
        let all = report(7, 60).unwrap();
        assert_eq!(all.count, 200, "throttled intervals are not waits");
        assert!(report(10, 60).is_none());
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["owner"], serde_json::json!({"pid": 7}));
        let b3 = serde_json::json!({"from_us": 4, "to_us": 8, "count": 40});
        assert_eq!(json["buckets"][3], b3);
        let cg = serde_json::to_value(Owner::Cgroup {
            cgroup: 5,
            path: None,
        })
        .unwrap();
        assert_eq!(cg, serde_json::json!({"cgroup": 5}));
    }

    #[test]
    fn throttled_time_is_reported_apart_from_the_waits() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let store = store(end);
        let r = report(
            &store.snapshot(),
            &Empty,
            HistOwner::Process(7),
            Window::last(60, end),
        )
        .unwrap();
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["throttled"],
            serde_json::json!({
                "count": 6,
                "total_us": 60_000,
                "max_bucket": {"from_us": 8192, "to_us": 16384, "count": 2},
                "buckets": [
                    {"from_us": 1024, "to_us": 2048, "count": 4},
                    {"from_us": 2048, "to_us": 4096, "count": 0},
                    {"from_us": 4096, "to_us": 8192, "count": 0},
                    {"from_us": 8192, "to_us": 16384, "count": 2},
                ],
            })
        );
        let r = report(
            &store.snapshot(),
            &Empty,
            HistOwner::Process(8),
            Window::last(60, end),
        )
        .unwrap();
        assert_eq!((r.throttled.count, r.throttled.total_us), (0, 0));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["throttled"],
            serde_json::json!({"count": 0, "total_us": 0, "buckets": []})
        );
        // Only throttled: a report with no waits, not a 404.
        let r = report(
            &store.snapshot(),
            &Empty,
            HistOwner::Process(9),
            Window::last(60, end),
        )
        .unwrap();
        assert_eq!((r.count, r.max_bucket, r.throttled.count), (0, None, 6));
        let text = render_text(&r);
        assert!(
            text.starts_with("runqueue latency of pid 9, last 60 s: no waits\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "throttled (CPU quota spent) of pid 9, last 60 s: 6 intervals, 60.0 ms in all"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "      8192 -> 16383      : 2        |********************                    |"
            ),
            "{text}"
        );
    }

    #[test]
    fn owner_needs_exactly_one_of_pid_and_cgroup() {
        assert_eq!(owner(&Empty, Some(3), None), Ok(HistOwner::Process(3)));
        assert_eq!(owner(&Empty, None, Some("77")), Ok(HistOwner::Cgroup(77)));
        let param = |r| match r {
            Err(OwnerError::Param(param, _)) => param,
            other => panic!("{other:?}"),
        };
        assert_eq!(param(owner(&Empty, None, None)), "pid");
        assert_eq!(param(owner(&Empty, Some(3), Some("77"))), "cgroup");
        assert_eq!(param(owner(&Empty, None, Some("x.slice"))), "cgroup");
        assert_eq!(
            throttled_owner(HistOwner::Cgroup(4)),
            HistOwner::CgroupThrottled(4)
        );
    }

    #[test]
    fn text_looks_like_runqlat() {
        let waits = Merged {
            slots: slots(),
            ns: 0,
        };
        let r = from_merged(
            &waits,
            &Merged::default(),
            Owner::Pid { pid: 7 },
            Window::last(
                30,
                SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(100),
            ),
        )
        .unwrap();
        let text = render_text(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "runqueue latency of pid 7, last 30 s: 100 waits, p50 ~8.0 us, p90 ~16.0 us, p99 ~121.6 us (~: within log2 buckets)"
        );
        assert_eq!(lines[1], "");
        assert_eq!(
            (mean(3_720, 100), mean(0, 100)),
            ("mean 37.2 us, ".into(), "".into())
        );
        let expected = [
            "     usecs               : count    distribution",
            "         0 -> 0          : 10       |**********                              |",
            "         1 -> 1          : 0        |                                        |",
            "         2 -> 3          : 0        |                                        |",
            "         4 -> 7          : 40       |****************************************|",
            "         8 -> 15         : 40       |****************************************|",
            "        16 -> 31         : 0        |                                        |",
            "        32 -> 63         : 0        |                                        |",
            "        64 -> 127        : 10       |**********                              |",
            "",
            "throttled (CPU quota spent) of pid 7, last 30 s: none",
        ];
        assert_eq!(lines[2..], expected);
    }
}
