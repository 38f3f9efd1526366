//! Who kept a process's threads off the CPU while they waited in a
//! runqueue: the processes that ran meanwhile on the CPU each wait ended
//! on (see `bpf/culprits.bpf.h`), summed by name and cgroup, so that a
//! script's thousand short-lived children count as one culprit. Culprits
//! the reader may not see are one `[other users] ×N` row
//! ([`super::disclosure`]).

use std::collections::HashMap;

use serde::Serialize;

use super::{
    disclosure::{self, Sight},
    query::ns_to_us,
};
use crate::{
    profile::model::state::State,
    profile::model::{store::Snapshot, window::Window, KeptOff},
};

/// Culprits listed, at most; the rest are summed into one row.
pub const LISTED: usize = 10;
/// Pids listed per culprit, at most.
pub(super) const LISTED_PIDS: usize = 5;

/// One culprit of a process's runqueue waits.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Culprit {
    /// The process name; `[idle]` when the CPU was idle (the wait was the
    /// wakeup's own latency), `[other CPU]` for the part of the waits no
    /// run of the CPU covered (the thread waited on another CPU's queue),
    /// `[others]` for processes past a thread's first eight in one drain
    /// (not told apart), `[rest]` for the culprits past the first
    /// [`LISTED`], `[other users] ×N` for the processes the reader may not
    /// see (no cgroup, no pids).
    pub name: String,
    /// Its cgroup (v2 path), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// How many processes of that name and cgroup ran in the window (the
    /// BPF side tells a script's short-lived children apart only while a
    /// thread's slots last: their time is theirs, not their pids).
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

/// A wait's row, and whether its culprit stays unnamed to the reader.
type Row = (KeptOff, bool);

/// Names and cgroups of the processes of `window`, and the rows of
/// `pid`'s waits, each marked hidden when `sight` may not name its culprit
/// as it was in the row's slice.
fn collect(
    store: &Snapshot,
    window: Window,
    pid: impl Fn(u32) -> bool,
    sight: &Sight,
) -> (Names, Vec<Row>) {
    let mut names: Names = Names::default();
    let mut rows: Vec<Row> = Vec::new();
    for slice in store.within(window) {
        for t in slice
            .thread_totals
            .iter()
            .filter(|t| t.counters.ns[State::Cpu as usize] > 0)
        {
            names.ran.insert(t.pid);
        }
        for (p, name) in &slice.processes {
            let cgroup = slice
                .origins
                .get(p)
                .and_then(|o| o.cgroup.as_deref().map(str::to_string));
            names.of.insert(*p, (name.to_string(), cgroup));
        }
        let hidden = |by: u32| !NOT_PROCESSES.contains(&by) && !sight.sees(by, slice.start);
        rows.extend(
            slice
                .kept_off
                .iter()
                .filter(|k| pid(k.pid))
                .map(|k| (*k, hidden(k.by))),
        );
    }
    (names, rows)
}

/// Culprits that are no process: the idle task, the part of a wait no run
/// covered, the processes past a thread's slots.
const NOT_PROCESSES: [u32; 3] = [0, KeptOff::UNSEEN, KeptOff::OTHERS];

/// Process names and cgroups by pid, and the processes that ran.
#[derive(Default)]
struct Names {
    of: HashMap<u32, (String, Option<String>)>,
    ran: std::collections::HashSet<u32>,
}

impl Names {
    /// How many processes of each name and cgroup ran.
    fn counts(&self) -> HashMap<&(String, Option<String>), u64> {
        let mut counts = HashMap::new();
        for pid in &self.ran {
            if let Some(who) = self.of.get(pid) {
                *counts.entry(who).or_default() += 1;
            }
        }
        counts
    }
}

/// The culprits of `pid`'s runqueue waits (only thread `tid`'s, if
/// given) within `window`, most first, at most `limit` and a `[rest]`.
pub fn kept_off(
    store: &Snapshot,
    window: Window,
    pid: u32,
    tid: Option<u32>,
    limit: usize,
    sight: &Sight,
) -> Vec<Culprit> {
    let (names, mut rows) = collect(store, window, |p| p == pid, sight);
    rows.retain(|(k, _)| tid.is_none_or(|t| k.tid == t));
    summarize(&rows, &names, limit, sight.limited())
}

/// The culprits of each process of `pids` within `window`, at most
/// `limit` and a `[rest]` each, by pid: one pass over the window for all.
pub fn by_process(
    store: &Snapshot,
    window: Window,
    pids: &[u32],
    limit: usize,
    sight: &Sight,
) -> HashMap<u32, Vec<Culprit>> {
    let (names, rows) = collect(store, window, |p| pids.contains(&p), sight);
    let mut by_pid: HashMap<u32, Vec<Row>> = HashMap::new();
    for row in rows {
        by_pid.entry(row.0.pid).or_default().push(row);
    }
    by_pid
        .into_iter()
        .map(|(pid, rows)| (pid, summarize(&rows, &names, limit, sight.limited())))
        .collect()
}

/// The culprits of each thread of `pid` within `window`, at most `top`
/// and a `[rest]` each, by tid.
pub fn by_thread(
    store: &Snapshot,
    window: Window,
    pid: u32,
    top: usize,
    sight: &Sight,
) -> HashMap<u32, Vec<Culprit>> {
    let (names, rows) = collect(store, window, |p| p == pid, sight);
    let mut by_tid: HashMap<u32, Vec<Row>> = HashMap::new();
    for row in rows {
        by_tid.entry(row.0.tid).or_default().push(row);
    }
    by_tid
        .into_iter()
        .map(|(tid, rows)| (tid, summarize(&rows, &names, top, sight.limited())))
        .collect()
}

/// A culprit's name and cgroup; `None` for those the reader may not see.
type Who = Option<(String, Option<String>)>;

/// `rows` summed by culprit name and cgroup (the hidden ones together),
/// most first, at most `limit` and a `[rest]`. A `limited` reader's
/// culprits count only the pids of its rows: how many processes of a name
/// ran host-wide would tell of other users'.
fn summarize(rows: &[Row], names: &Names, limit: usize, limited: bool) -> Vec<Culprit> {
    let mut sums: HashMap<Who, Sum> = HashMap::new();
    let total: u64 = rows.iter().map(|(k, _)| k.ns).sum();
    for (k, hidden) in rows {
        let who = match k.by {
            _ if *hidden => None,
            0 => Some(("[idle]".to_string(), None)),
            KeptOff::UNSEEN => Some(("[other CPU]".to_string(), None)),
            KeptOff::OTHERS => Some(("[others]".to_string(), None)),
            by => Some(
                names
                    .of
                    .get(&by)
                    .cloned()
                    .unwrap_or_else(|| (format!("[pid {by}]"), None)),
            ),
        };
        let sum = sums.entry(who).or_default();
        sum.ns += k.ns;
        if !NOT_PROCESSES.contains(&k.by) {
            *sum.by_pid.entry(k.by).or_default() += k.ns;
        }
    }
    let counts = if limited {
        HashMap::new()
    } else {
        names.counts()
    };
    let mut culprits: Vec<(u64, Culprit)> = sums
        .into_iter()
        .map(|(who, sum)| {
            let mut pids: Vec<(u32, u64)> = sum.by_pid.into_iter().collect();
            pids.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let Some((name, cgroup)) = who else {
                let culprit = Culprit {
                    name: disclosure::label(pids.len(), false),
                    cgroup: None,
                    processes: pids.len() as u64,
                    pids: Vec::new(),
                    us: ns_to_us(sum.ns),
                    share: share(sum.ns, total),
                };
                return (sum.ns, culprit);
            };
            let ran = counts.get(&(name.clone(), cgroup.clone())).copied();
            let culprit = Culprit {
                processes: ran.unwrap_or(0).max(pids.len() as u64),
                name,
                cgroup,
                pids: pids.iter().take(LISTED_PIDS).map(|p| p.0).collect(),
                us: ns_to_us(sum.ns),
                share: share(sum.ns, total),
            };
            (sum.ns, culprit)
        })
        .collect();
    culprits.sort_by(by_time);
    if culprits.len() > limit {
        // Culprits alike are grouped before the rest is summed: a busy
        // host's many small ones, together, are often what took the CPU.
        culprits = super::culprit_groups::group(culprits, limit, total);
        culprits.sort_by(by_time);
    }
    if culprits.len() > limit {
        let rest = culprits.split_off(limit);
        let ns: u64 = rest.iter().map(|c| c.0).sum();
        culprits.push((
            ns,
            Culprit {
                name: REST.into(),
                cgroup: None,
                processes: rest.iter().map(|c| c.1.processes).sum(),
                pids: Vec::new(),
                us: ns_to_us(ns),
                share: share(ns, total),
            },
        ));
    }
    culprits.into_iter().map(|c| c.1).collect()
}

/// Most time first, then by name.
fn by_time(a: &(u64, Culprit), b: &(u64, Culprit)) -> std::cmp::Ordering {
    b.0.cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name))
}

/// The name of the row that sums the culprits past those listed.
pub const REST: &str = "[rest]";

impl Culprit {
    /// How a text answer names it: `hog`, `hasher ×12`, `[rest: 981
    /// processes]`.
    pub fn label(&self) -> String {
        match (self.name.as_str(), self.processes) {
            (REST, n) => format!("[rest: {n} processes]"),
            (name, 2..) if !name.contains('×') => format!("{name} ×{}", self.processes),
            (name, _) => name.to_string(),
        }
    }
}

/// `part` of `total`, to three decimals.
pub(super) fn share(part: u64, total: u64) -> f64 {
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

    /// Victim 7 (threads 8, 9) kept off by two short-lived `hasher`s,
    /// a `hog` in another cgroup, the idle task, and a wait elsewhere;
    /// in one slice ending at 100 s.
    fn waits() -> (Store, Window) {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        let mut slice = Slice::empty(end - Duration::from_secs(1), end);
        let kept = |tid, by, ms: u64| KeptOff {
            pid: 7,
            tid,
            by,
            ns: ms * 1_000_000,
        };
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
                    ..Origin::default()
                },
            );
        }
        store.push(slice);
        (store, Window::last(30, end))
    }

    #[test]
    fn culprits_are_summed_by_name_and_cgroup_and_share_the_waits() {
        let (store, window) = waits();
        let c = kept_off(&store.snapshot(), window, 7, None, LISTED, &Sight::all());
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
        let one = kept_off(&store.snapshot(), window, 7, Some(8), LISTED, &Sight::all());
        assert_eq!((one.len(), one[0].share), (1, 1.0));
        let threads = by_thread(&store.snapshot(), window, 7, 2, &Sight::all());
        assert_eq!(threads[&8][0].name, "hasher");
        // Thread 9: the hog, [other CPU], and the idle task as the rest.
        let nine: Vec<&str> = threads[&9].iter().map(|c| c.name.as_str()).collect();
        assert_eq!(nine, ["hog", "[other CPU]", "[rest]"]);
        assert_eq!(threads[&9][2].share, 0.125);
    }

    #[test]
    fn many_small_culprits_of_one_cgroup_are_named_by_it_not_left_in_the_rest() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        let mut slice = Slice::empty(end - Duration::from_secs(1), end);
        // A hog (50 ms), then 40 build processes of 20 names (10 ms each)
        // and 30 `kworker/N:M`s (1 ms each).
        let mut add = |pid: u32, name: String, cgroup: Option<&str>, ms: u64| {
            slice.processes.insert(pid, Arc::from(name.as_str()));
            let cgroup = cgroup.map(Arc::from);
            let origin = Origin {
                parent: 1,
                cgroup,
                ..Origin::default()
            };
            slice.origins.insert(pid, origin);
            slice.kept_off.push(KeptOff {
                pid: 7,
                tid: 8,
                by: pid,
                ns: ms * 1_000_000,
            });
        };
        add(100, "hog".into(), Some("/hog"), 50);
        for i in 0..40 {
            add(200 + i, format!("tool{}", i % 20), Some("/build"), 10);
        }
        for i in 0..30 {
            add(300 + i, format!("kworker/{i}:1"), None, 1);
        }
        store.push(slice);
        let window = Window::last(30, end);
        let c = kept_off(&store.snapshot(), window, 7, None, 3, &Sight::all());
        let names: Vec<String> = c.iter().map(Culprit::label).collect();
        assert_eq!(names[0], "tool0, tool1, tool10 +17 ×40", "{names:?}");
        assert_eq!((c[0].us, c[0].cgroup.as_deref()), (400_000, Some("/build")));
        assert_eq!(names[1], "hog");
        assert_eq!((names[2].as_str(), c[2].us), ("kworker/*:* ×30", 30_000));
        assert_eq!(c.len(), 3, "nothing left for a rest: {names:?}");
        // With room for one: the rest says what it sums.
        let c = kept_off(&store.snapshot(), window, 7, None, 1, &Sight::all());
        assert_eq!(c[1].label(), "[rest: 31 processes]");
        assert_eq!(c[1].us, 80_000);
        assert_eq!(c.iter().map(|c| c.us).sum::<u64>(), 480_000);
    }

    #[test]
    fn a_user_sees_other_users_culprits_only_as_a_count() {
        let (store, window) = waits();
        let started = |secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        // The user's: the victim and one hasher. Another user's: the other
        // hasher; pid 30 is the user's now but started after the slice
        // (the hog's pid reused).
        let reader = disclosure::Reader::User {
            uid: Some(1000),
            owner_of: Arc::new(move |pid| match pid {
                7 | 20 => Some((1000, started(0))),
                21 => Some((1, started(0))),
                30 => Some((1000, started(100))),
                _ => None,
            }),
        };
        let c = kept_off(&store.snapshot(), window, 7, None, LISTED, &reader.sight());
        let shown = format!("{c:?}");
        assert!(!shown.contains("hog") && !shown.contains("/b"), "{shown}");
        assert!(c
            .iter()
            .all(|c| !c.pids.contains(&21) && !c.pids.contains(&30)));
        let others = c.iter().find(|c| c.name == "[other users] ×2").unwrap();
        assert_eq!((others.us, others.processes), (600_000, 2));
        assert!(others.pids.is_empty() && others.cgroup.is_none());
        // Its own hasher by name, counted by its own pids only.
        let hasher = c.iter().find(|c| c.name == "hasher").unwrap();
        assert_eq!((hasher.processes, hasher.pids.as_slice()), (1, &[20][..]));
        assert_eq!(c.iter().map(|c| c.us).sum::<u64>(), 1_000_000);
        let threads = by_thread(&store.snapshot(), window, 7, 2, &reader.sight());
        assert_eq!(threads[&9][0].name, "[other users] ×1");
    }
}
