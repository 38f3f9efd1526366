//! `/processes?group=`: processes summed by name, parent, cgroup or
//! container, so that a swarm of short-lived processes (a script forking
//! thirty a second) adds up to what it costs instead of thousands of small
//! rows. Each process is in exactly one group: a group's time is the sum of
//! its members'.

use std::{collections::HashMap, time::SystemTime};

use serde::Serialize;

use super::{
    disclosure::Sight,
    host_facts::{HostFacts, UNIFIED},
    processes::{accumulate, Acc, SortBy, StateTimes},
    query::ns_to_us,
};
use crate::{
    profile::model::state::State,
    profile::model::{store::Snapshot, window::Window},
};

/// Members listed by pid in a group, at most.
pub const LISTED_MEMBERS: usize = 10;

/// What processes are grouped by (`group=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "lowercase")]
pub enum GroupBy {
    /// The process name.
    Comm,
    /// The parent process: a forking script with its children.
    Parent,
    /// The cgroup that limits CPU: the `cpu` controller's path (its v1
    /// hierarchy's on hybrid hosts, else the unified one's).
    Cgroup,
    /// The container (processes outside one form one group).
    Container,
}

impl GroupBy {
    /// Names accepted by the API.
    pub const NAMES: [&'static str; 4] = ["comm", "parent", "cgroup", "container"];
}

/// One row of `/processes?group=`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProcessGroup {
    /// What the members share: a name, `bash (pid 7)`, a cgroup path, a
    /// container name.
    pub group: String,
    /// The parent's pid, when grouped by parent and it is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_pid: Option<u32>,
    /// How many processes it holds.
    pub processes: u64,
    /// Its busiest members by pid (at most [`LISTED_MEMBERS`]).
    pub pids: Vec<u32>,
    /// Sampled CPU time of all members.
    pub cpu_us: u64,
    /// Exact time by state of all members.
    pub time: StateTimes,
}

#[derive(Default)]
struct Sum {
    parent_pid: Option<u32>,
    members: Vec<(u64, u32)>,
    cpu_ns: u64,
    ns: [u64; State::COUNT],
}

/// What a reader who may not see a group's parent reads as its name.
const HIDDEN_PARENT: &str = "[another user's process]";

/// The processes of `window` that `sight` sees (and whose name contains
/// `comm`, if given) summed by `by`, by `sort` (most first, then by name);
/// without `comm`, the processes it does not see as one
/// `[other users] ×N` group, last.
pub fn groups(
    store: &Snapshot,
    host: &dyn HostFacts,
    window: Window,
    by: GroupBy,
    sort: SortBy,
    comm: Option<&str>,
    sight: &Sight,
) -> Vec<ProcessGroup> {
    let (all, unseen) = accumulate(store, window, sight);
    let mut sums: HashMap<String, Sum> = HashMap::new();
    for (pid, acc) in &all {
        let name = acc.comm();
        if comm.is_some_and(|c| !name.contains(c)) {
            continue;
        }
        let (key, parent_pid) = match key_of(host, by, *pid, &name, acc, &all) {
            (_, Some(parent)) if !sight.sees(parent, SystemTime::now()) => {
                (HIDDEN_PARENT.to_string(), None)
            }
            key => key,
        };
        let sum = sums.entry(key).or_default();
        sum.parent_pid = parent_pid;
        sum.members.push((acc.cpu_ns, *pid));
        sum.cpu_ns += acc.cpu_ns;
        for (total, v) in sum.ns.iter_mut().zip(acc.counters.ns) {
            *total += v;
        }
    }
    let mut rows: Vec<ProcessGroup> = sums
        .into_iter()
        .map(|(group, mut sum)| {
            sum.members
                .sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            ProcessGroup {
                group,
                parent_pid: sum.parent_pid,
                processes: sum.members.len() as u64,
                pids: sum
                    .members
                    .iter()
                    .take(LISTED_MEMBERS)
                    .map(|m| m.1)
                    .collect(),
                cpu_us: ns_to_us(sum.cpu_ns),
                time: StateTimes::of(&sum.ns),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        let key = |r: &ProcessGroup| sort.key_of(r.cpu_us, &r.time);
        key(b).cmp(&key(a)).then_with(|| a.group.cmp(&b.group))
    });
    if comm.is_none() && !unseen.hidden.is_empty() {
        rows.push(ProcessGroup {
            group: unseen.hidden.label(),
            parent_pid: None,
            processes: unseen.hidden.count() as u64,
            pids: Vec::new(),
            cpu_us: ns_to_us(unseen.cpu_ns),
            time: StateTimes::of(&unseen.counters.ns),
        });
    }
    rows
}

/// The group of one process, and its parent's pid when grouped by parent.
fn key_of(
    host: &dyn HostFacts,
    by: GroupBy,
    pid: u32,
    name: &str,
    acc: &Acc,
    all: &HashMap<u32, Acc>,
) -> (String, Option<u32>) {
    let origin = acc.origin.as_ref();
    match by {
        GroupBy::Comm => (name.to_string(), None),
        GroupBy::Parent => match origin.map(|o| o.parent).filter(|&p| p != 0) {
            Some(parent) => {
                let parent_name = all
                    .get(&parent)
                    .and_then(|p| p.name.as_deref())
                    .map(str::to_string)
                    .or_else(|| host.comm(parent, None))
                    .unwrap_or_else(|| "[gone]".into());
                (format!("{parent_name} (pid {parent})"), Some(parent))
            }
            None => ("[parent unknown]".into(), None),
        },
        // Where the `cpu` controller has a v1 hierarchy, its cgroup is the
        // one that limits CPU (the unified path says nothing of it): asked
        // of the live process, the recorded unified path for one gone.
        GroupBy::Cgroup => {
            let cpu = (host.cpu_hierarchy() != UNIFIED)
                .then(|| host.cpu_cgroup_of(pid))
                .flatten();
            let recorded = origin.and_then(|o| o.cgroup.as_deref()).map(str::to_string);
            let path = cpu.or(recorded);
            (path.unwrap_or_else(|| "[cgroup unknown]".to_string()), None)
        }
        GroupBy::Container => (
            acc.container
                .as_ref()
                .map_or_else(|| "[no container]".to_string(), |c| c.describe()),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::Arc,
        time::{Duration, SystemTime},
    };

    use super::*;
    use crate::profile::model::{
        counters::{RawThread, ThreadCounters},
        store::Store,
        Origin, Slice,
    };
    use crate::profile::report::host_facts::Empty;

    /// A script (pid 10) forks three short-lived `hasher`s over two slices;
    /// a daemon (pid 20, its own parent 1) runs beside them.
    fn forks() -> (Store, SystemTime) {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        let members = [
            (10, 1, "script", "/user.slice/s.scope", 5),
            (11, 10, "hasher", "/user.slice/s.scope", 300),
            (12, 10, "hasher", "/user.slice/s.scope", 200),
            (13, 10, "hasher", "/user.slice/s.scope", 100),
            (20, 1, "daemon", "/system.slice/d.service", 400),
        ];
        for (i, chunk) in [&members[..3], &members[3..]].into_iter().enumerate() {
            let at = end - Duration::from_secs(2 - i as u64);
            let mut slice = Slice::empty(at - Duration::from_secs(1), at);
            for &(pid, parent, name, cgroup, cpu_ms) in chunk {
                let mut ns = [0; State::COUNT];
                ns[State::Cpu as usize] = cpu_ms * 1_000_000;
                slice.thread_totals.push(RawThread {
                    tid: pid,
                    pid,
                    comm: name.into(),
                    counters: ThreadCounters {
                        ns,
                        ..Default::default()
                    },
                });
                slice.processes.insert(pid, Arc::from(name));
                let origin = Origin {
                    parent,
                    cgroup: Some(Arc::from(cgroup)),
                    ..Origin::default()
                };
                slice.origins.insert(pid, origin);
            }
            store.push(slice);
        }
        (store, end)
    }

    fn grouped(by: GroupBy) -> Vec<ProcessGroup> {
        let (store, now) = forks();
        let sort = SortBy::State(State::Cpu);
        groups(
            &store.snapshot(),
            &Empty,
            Window::last(30, now),
            by,
            sort,
            None,
            &Sight::all(),
        )
    }

    #[test]
    fn a_forking_scripts_children_add_up_under_it() {
        let rows = grouped(GroupBy::Parent);
        assert_eq!(rows[0].group, "script (pid 10)");
        assert_eq!(rows[0].parent_pid, Some(10));
        assert_eq!((rows[0].processes, rows[0].time.cpu_us), (3, 600_000));
        assert_eq!(rows[0].pids, [11, 12, 13]);
        // The script and the daemon share pid 1, which recorded nothing.
        assert_eq!(rows[1].processes, 2);
        assert_eq!(rows[1].time.cpu_us, 405_000);
    }

    #[test]
    fn every_process_is_in_one_group_whatever_the_grouping() {
        let total = |rows: &[ProcessGroup]| {
            let n: u64 = rows.iter().map(|r| r.processes).sum();
            (n, rows.iter().map(|r| r.time.cpu_us).sum::<u64>())
        };
        for by in [
            GroupBy::Comm,
            GroupBy::Parent,
            GroupBy::Cgroup,
            GroupBy::Container,
        ] {
            assert_eq!(total(&grouped(by)), (5, 1_005_000), "{by:?}");
        }
        let by_name = grouped(GroupBy::Comm);
        assert_eq!(
            (by_name[0].group.as_str(), by_name[0].processes),
            ("hasher", 3)
        );
        let by_cgroup = grouped(GroupBy::Cgroup);
        assert_eq!(by_cgroup[0].group, "/user.slice/s.scope");
        assert_eq!(grouped(GroupBy::Container)[0].group, "[no container]");
    }

    #[test]
    fn on_a_hybrid_host_processes_group_by_their_cpu_cgroup() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        let mut slice = Slice::empty(end - Duration::from_secs(1), end);
        // Both in the unified root; only 41 is in the v1 `cpu` `/batch`;
        // 60 is gone: its recorded unified path.
        for (pid, unified) in [(41, "/"), (50, "/"), (60, "/gone.scope")] {
            let mut ns = [0; State::COUNT];
            ns[State::Cpu as usize] = 1_000_000;
            slice.thread_totals.push(RawThread {
                tid: pid,
                pid,
                comm: "w".into(),
                counters: ThreadCounters {
                    ns,
                    ..Default::default()
                },
            });
            let origin = Origin {
                parent: 1,
                cgroup: Some(Arc::from(unified)),
                ..Origin::default()
            };
            slice.origins.insert(pid, origin);
        }
        store.push(slice);
        let sort = SortBy::State(State::Cpu);
        let window = Window::last(30, end);
        let rows = groups(
            &store.snapshot(),
            &crate::profile::report::host_facts::Hybrid,
            window,
            GroupBy::Cgroup,
            sort,
            None,
            &Sight::all(),
        );
        let by: Vec<(&str, &[u32])> = rows
            .iter()
            .map(|r| (r.group.as_str(), &r.pids[..]))
            .collect();
        assert_eq!(
            by,
            [("/", &[50][..]), ("/batch", &[41]), ("/gone.scope", &[60])]
        );
    }

    #[test]
    fn a_user_reads_other_users_processes_and_parents_as_counts() {
        let (store, now) = forks();
        // The reader's: two of the script's hashers; the script is not.
        let reader = crate::profile::report::disclosure::Reader::User {
            uid: Some(1000),
            owner_of: Arc::new(|pid| {
                [11, 12]
                    .contains(&pid)
                    .then_some((1000, SystemTime::UNIX_EPOCH))
            }),
        };
        let window = Window::last(30, now);
        let sort = SortBy::State(State::Cpu);
        let rows = groups(
            &store.snapshot(),
            &Empty,
            window,
            GroupBy::Parent,
            sort,
            None,
            &reader.sight(),
        );
        let shown: Vec<(&str, u64, u64)> = rows
            .iter()
            .map(|r| (r.group.as_str(), r.processes, r.time.cpu_us))
            .collect();
        assert_eq!(
            shown,
            [
                ("[another user's process]", 2, 500_000),
                ("[other users] ×3", 3, 505_000)
            ]
        );
        assert!(rows.iter().all(|r| r.parent_pid.is_none()));
    }
}
