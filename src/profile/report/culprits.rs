//! Who kept a process's threads off the CPU while they waited in a
//! runqueue: the processes that ran meanwhile on the CPU each wait ended
//! on (see `bpf/culprits.bpf.h`), summed by name and cgroup, so that a
//! script's thousand short-lived children count as one culprit.

use std::collections::HashMap;

use serde::Serialize;

use super::query::ns_to_us;
use crate::profile::model::{store::Snapshot, window::Window, KeptOff};

/// Culprits listed, at most; the rest are summed into one row.
pub const LISTED: usize = 10;
/// Pids listed per culprit, at most.
const LISTED_PIDS: usize = 5;

/// One culprit of a process's runqueue waits.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Culprit {
    /// The process name; `[idle]` when the CPU was idle (the wait was the
    /// wakeup's own latency), `[other CPU]` for the part of the waits no
    /// run of the CPU covered (the thread waited on another CPU's queue),
    /// `[rest]` for the culprits past the first [`LISTED`].
    pub name: String,
    /// Its cgroup (v2 path), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// How many processes of that name and cgroup.
    pub processes: u64,
    /// The first of them by time kept.
    pub pids: Vec<u32>,
    /// Time they kept the CPU while the process's threads waited for it.
    pub us: u64,
    /// Share of all the waits' time.
    pub share: f64,
}

#[derive(Default)]
struct Sum {
    ns: u64,
    by_pid: HashMap<u32, u64>,
}

/// The culprits of `pid`'s runqueue waits (only thread `tid`'s, if
/// given) within `window`, most first, at most [`LISTED`] and a `[rest]`.
pub fn kept_off(store: &Snapshot, window: Window, pid: u32, tid: Option<u32>) -> Vec<Culprit> {
    let mut names: HashMap<u32, (String, Option<String>)> = HashMap::new();
    let mut sums: HashMap<(String, Option<String>), Sum> = HashMap::new();
    let mut rows: Vec<KeptOff> = Vec::new();
    for slice in store.within(window) {
        for (p, name) in &slice.processes {
            let cgroup = slice
                .origins
                .get(p)
                .and_then(|o| o.cgroup.as_deref().map(str::to_string));
            names.insert(*p, (name.to_string(), cgroup));
        }
        rows.extend(
            slice
                .kept_off
                .iter()
                .filter(|k| k.pid == pid && tid.is_none_or(|t| k.tid == t)),
        );
    }
    let total: u64 = rows.iter().map(|k| k.ns).sum();
    for k in &rows {
        let who = match k.by {
            0 => ("[idle]".to_string(), None),
            KeptOff::UNSEEN => ("[other CPU]".to_string(), None),
            by => names
                .get(&by)
                .cloned()
                .unwrap_or_else(|| (format!("[pid {by}]"), None)),
        };
        let sum = sums.entry(who).or_default();
        sum.ns += k.ns;
        if k.by != 0 && k.by != KeptOff::UNSEEN {
            *sum.by_pid.entry(k.by).or_default() += k.ns;
        }
    }
    let mut culprits: Vec<Culprit> = sums
        .into_iter()
        .map(|((name, cgroup), sum)| {
            let mut pids: Vec<(u32, u64)> = sum.by_pid.into_iter().collect();
            pids.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            Culprit {
                name,
                cgroup,
                processes: pids.len() as u64,
                pids: pids.iter().take(LISTED_PIDS).map(|p| p.0).collect(),
                us: ns_to_us(sum.ns),
                share: share(sum.ns, total),
            }
        })
        .collect();
    culprits.sort_by(|a, b| b.us.cmp(&a.us).then_with(|| a.name.cmp(&b.name)));
    if culprits.len() > LISTED {
        let rest = culprits.split_off(LISTED);
        let us: u64 = rest.iter().map(|c| c.us).sum();
        culprits.push(Culprit {
            name: "[rest]".into(),
            cgroup: None,
            processes: rest.iter().map(|c| c.processes).sum(),
            pids: Vec::new(),
            us,
            share: share(us * 1000, total),
        });
    }
    culprits
}

/// `part` of `total`, to three decimals.
fn share(part: u64, total: u64) -> f64 {
    if total == 0 {
        return 0.0;
    }
    (part as f64 / total as f64 * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use std::{
        sync::Arc,
        time::{Duration, SystemTime},
    };

    use super::*;
    use crate::profile::model::{store::Store, Origin, Slice};

    #[test]
    fn culprits_are_summed_by_name_and_cgroup_and_share_the_waits() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        let mut slice = Slice::empty(end - Duration::from_secs(1), end);
        let kept = |tid, by, ms: u64| KeptOff {
            pid: 7,
            tid,
            by,
            ns: ms * 1_000_000,
        };
        // Victim 7 (threads 8, 9) kept off by two short-lived `hasher`s,
        // a `hog` in another cgroup, the idle task, and a wait elsewhere.
        slice.kept_off = vec![
            kept(8, 20, 100),
            kept(8, 21, 100),
            kept(9, 30, 500),
            kept(9, 0, 100),
            kept(9, KeptOff::UNSEEN, 200),
            KeptOff {
                pid: 99,
                tid: 99,
                by: 30,
                ns: 1,
            },
        ];
        for (pid, name, cgroup) in [
            (20, "hasher", "/a"),
            (21, "hasher", "/a"),
            (30, "hog", "/b"),
        ] {
            slice.processes.insert(pid, Arc::from(name));
            slice.origins.insert(
                pid,
                Origin {
                    parent: 1,
                    cgroup: Some(Arc::from(cgroup)),
                },
            );
        }
        store.push(slice);
        let window = Window::last(30, end);
        let c = kept_off(&store.snapshot(), window, 7, None);
        let row = |name: &str| c.iter().find(|c| c.name == name).unwrap().clone();
        assert_eq!(c[0].name, "hog");
        assert_eq!(
            (c[0].us, c[0].share, c[0].cgroup.as_deref()),
            (500_000, 0.5, Some("/b"))
        );
        assert_eq!((row("hasher").processes, row("hasher").us), (2, 200_000));
        assert_eq!(row("hasher").pids, [20, 21]);
        assert_eq!((row("[other CPU]").share, row("[idle]").share), (0.2, 0.1));
        assert_eq!(c.iter().map(|c| c.us).sum::<u64>(), 1_000_000);
        let one = kept_off(&store.snapshot(), window, 7, Some(8));
        assert_eq!((one.len(), one[0].share), (1, 1.0));
    }
}
