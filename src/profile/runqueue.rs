//! Runqueue latency (`/runqueue`): how long threads of a process or cgroup
//! waited to run once woken, from the BPF log2 histograms.
//!
//! Slot 0 counts waits under 1 us, slot i > 0 waits in [2^(i-1), 2^i) us.

use std::{fmt::Write as _, time::SystemTime};

use serde::Serialize;

use super::{cgroups, store::Snapshot};
use crate::{
    bpf::abi::{Hist, HIST_SLOTS},
    collect::HistOwner,
};

/// Counts by slot, summed over slices.
pub type Slots = [u64; HIST_SLOTS];

/// Whose latency a report shows, as it appears in JSON: `{"pid": P}` or
/// `{"cgroup": ID, "path": "/system.slice/..."}` (path only if resolved).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Owner {
    Pid {
        pid: u32,
    },
    Cgroup {
        cgroup: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        path: Option<String>,
    },
}

impl Owner {
    /// The JSON owner of `owner`, resolving cgroup ids to paths.
    pub fn resolve(owner: HistOwner) -> Owner {
        match owner {
            HistOwner::Process(pid) | HistOwner::ProcessThrottled(pid) => Owner::Pid { pid },
            HistOwner::Cgroup(id) | HistOwner::CgroupThrottled(id) => Owner::Cgroup {
                cgroup: id,
                path: cgroups::system().path_of(id),
            },
        }
    }

    /// E.g. `pid 42` or `cgroup 1234 (/system.slice/ssh.service)`.
    pub fn describe(&self) -> String {
        match self {
            Owner::Pid { pid } => format!("pid {pid}"),
            Owner::Cgroup {
                cgroup,
                path: Some(path),
            } => format!("cgroup {cgroup} ({path})"),
            Owner::Cgroup { cgroup, path: None } => format!("cgroup {cgroup}"),
        }
    }
}

/// One histogram bucket, waits in [`from_us`, `to_us`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Bucket {
    pub from_us: u64,
    pub to_us: u64,
    pub count: u64,
}

/// The `/runqueue` answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunqueueReport {
    pub owner: Owner,
    pub seconds: u64,
    /// Number of waits.
    pub count: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    /// The highest non-empty bucket: the longest wait lies in it.
    pub max_bucket: Bucket,
    /// From the lowest to the highest non-empty bucket, empty ones between
    /// included.
    pub buckets: Vec<Bucket>,
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
/// under the cgroup2 mount such as `/system.slice/ssh.service`).
pub fn owner(pid: Option<u32>, cgroup: Option<&str>) -> Result<HistOwner, OwnerError> {
    let either = "give either `pid` or `cgroup`";
    match (pid, cgroup) {
        (Some(pid), None) => Ok(HistOwner::Process(pid)),
        (None, None) => Err(OwnerError::Param("pid", format!("required: {either}"))),
        (Some(_), Some(_)) => Err(OwnerError::Param("cgroup", format!("{either}, not both"))),
        (None, Some(arg)) if arg.starts_with('/') => match cgroups::system().id_of(arg) {
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
                    format!("expected an id or a path such as /system.slice, got `{arg}`");
                OwnerError::Param("cgroup", message)
            }),
    }
}

/// Bounds of `slot` in microseconds, `[from, to)`.
pub fn slot_bounds_us(slot: usize) -> (u64, u64) {
    match slot {
        0 => (0, 1),
        i => (1 << (i - 1), 1 << i),
    }
}

/// Adds `hist` into `into`.
pub fn add(into: &mut Slots, hist: &Hist) {
    for (a, b) in into.iter_mut().zip(hist.slots) {
        *a += b;
    }
}

/// The `q` quantile (0..=1) in microseconds. The bucket holding the rank
/// `q * count` is found, and waits are taken as spread evenly within it:
/// the estimate interpolates linearly between its bounds (as Prometheus'
/// `histogram_quantile` does). Error is at most the bucket width.
pub fn quantile_us(slots: &Slots, q: f64) -> Option<f64> {
    let rank = q.clamp(0.0, 1.0) * slots.iter().sum::<u64>() as f64;
    let mut below = 0u64;
    for (slot, &n) in slots.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let (from, to) = slot_bounds_us(slot);
            let within = ((rank - below as f64) / n as f64).max(0.0);
            return Some(from as f64 + (to - from) as f64 * within);
        }
        below += n;
    }
    None
}

/// The histograms of `owner` over the last `seconds`, merged.
pub fn merged(store: &Snapshot, owner: HistOwner, seconds: u64, now: SystemTime) -> Slots {
    let mut slots = [0; HIST_SLOTS];
    for slice in store.window(seconds, now) {
        for (_, hist) in slice.runq_hists.iter().filter(|(o, _)| *o == owner) {
            add(&mut slots, hist);
        }
    }
    slots
}

/// The report on merged slots; `None` if they are all empty.
pub fn from_slots(slots: &Slots, owner: Owner, seconds: u64) -> Option<RunqueueReport> {
    let first = slots.iter().position(|&n| n > 0)?;
    let last = slots.iter().rposition(|&n| n > 0)?;
    let bucket = |slot: usize| {
        let (from_us, to_us) = slot_bounds_us(slot);
        Bucket {
            from_us,
            to_us,
            count: slots[slot],
        }
    };
    // Quantiles are to 0.1 us: finer than any bucket is wide.
    let q = |q| quantile_us(slots, q).map_or(0.0, |v| (v * 10.0).round() / 10.0);
    Some(RunqueueReport {
        owner,
        seconds,
        count: slots.iter().sum(),
        p50_us: q(0.5),
        p90_us: q(0.9),
        p99_us: q(0.99),
        max_bucket: bucket(last),
        buckets: (first..=last).map(bucket).collect(),
    })
}

/// Width of the `*` bars, as in runqlat.
const BAR_WIDTH: usize = 40;

/// A summary line, then the histogram as BCC's runqlat prints it (bucket
/// bounds as inclusive whole microseconds).
pub fn render_text(r: &RunqueueReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "runqueue latency of {}, last {} s: {} waits, p50 {:.1} us, p90 {:.1} us, p99 {:.1} us\n",
        r.owner.describe(),
        r.seconds,
        r.count,
        r.p50_us,
        r.p90_us,
        r.p99_us
    );
    let _ = writeln!(out, "{:5}{:<19} : count    distribution", "", "usecs");
    let max = r.buckets.iter().map(|b| b.count).max().unwrap_or(0).max(1);
    for b in &r.buckets {
        let stars = (u128::from(b.count) * BAR_WIDTH as u128 / u128::from(max)) as usize;
        let _ = writeln!(
            out,
            "{:>10} -> {:<10} : {:<8} |{:<width$}|",
            b.from_us,
            b.to_us - 1,
            b.count,
            "*".repeat(stars),
            width = BAR_WIDTH
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, time::Duration};

    use super::*;
    use crate::profile::store::Store;
    use crate::profile::Slice;

    /// 100 waits: 10 under 1 us, 40 in [4, 8), 40 in [8, 16), 10 in [64, 128).
    fn slots() -> Slots {
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

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let s = slots();
        // Rank 50: 10 + 40 waits end at 8 us exactly; rank 90 at 16 us.
        assert_eq!(quantile_us(&s, 0.5), Some(8.0));
        assert_eq!(quantile_us(&s, 0.9), Some(16.0));
        // Rank 99: 9 of the 10 waits in [64, 128); rank 30: half of [4, 8).
        assert_eq!(quantile_us(&s, 0.99), Some(64.0 + 64.0 * 0.9));
        assert_eq!(quantile_us(&s, 0.3), Some(6.0));
        assert_eq!(quantile_us(&s, 0.05), Some(0.5));
        assert_eq!(quantile_us(&[0; HIST_SLOTS], 0.5), None);
    }

    #[test]
    fn report_merges_one_owner_over_the_window() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        let other = Hist {
            slots: [1; HIST_SLOTS],
            ns: 0,
        };
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
                            ns: 0,
                        },
                    ),
                    (HistOwner::Process(8), other),
                ],
                processes: HashMap::new(),
                stats: Default::default(),
            });
        }
        let report = |pid, seconds| {
            let slots = merged(&store.snapshot(), HistOwner::Process(pid), seconds, end);
            from_slots(&slots, Owner::Pid { pid }, seconds)
        };
        let r = report(7, 30).unwrap();
        assert_eq!((r.count, r.p50_us, r.p99_us), (100, 8.0, 121.6));
        assert_eq!(r.max_bucket, bucket(64, 128, 10));
        assert_eq!(r.buckets.len(), 8, "slots 0..=7");
        assert_eq!(r.buckets[1], bucket(1, 2, 0));
        let all = report(7, 60).unwrap();
        assert_eq!(all.count, 200);
        assert!(report(9, 60).is_none());
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
    fn owner_needs_exactly_one_of_pid_and_cgroup() {
        assert_eq!(owner(Some(3), None), Ok(HistOwner::Process(3)));
        assert_eq!(owner(None, Some("77")), Ok(HistOwner::Cgroup(77)));
        let param = |r| match r {
            Err(OwnerError::Param(param, _)) => param,
            other => panic!("{other:?}"),
        };
        assert_eq!(param(owner(None, None)), "pid");
        assert_eq!(param(owner(Some(3), Some("77"))), "cgroup");
        assert_eq!(param(owner(None, Some("x.slice"))), "cgroup");
    }

    #[test]
    fn text_looks_like_runqlat() {
        let r = from_slots(&slots(), Owner::Pid { pid: 7 }, 30).unwrap();
        let text = render_text(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "runqueue latency of pid 7, last 30 s: 100 waits, p50 8.0 us, p90 16.0 us, p99 121.6 us"
        );
        assert_eq!(lines[1], "");
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
        ];
        assert_eq!(lines[2..], expected);
    }
}
