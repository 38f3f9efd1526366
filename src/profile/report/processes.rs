//! `/processes`: every process recorded in a window with its time by
//! state, sorted by the state asked for and filtered by name, so that an
//! idle or stuck process is as easy to find as a busy one. A reader who
//! may not see every process gets their own, each with its own process's
//! time only (not an earlier one's of the same pid), and the rest as one
//! `[other users] ×N` row ([`super::disclosure`]).

use std::{collections::HashMap, sync::Arc};

use serde::Serialize;

use super::{
    disclosure::{Hidden, Sight},
    identity::{self, Name, Shown},
    query::ns_to_us,
};
use crate::{
    process::container::Container,
    profile::model::state::State,
    profile::model::{
        counters::ThreadCounters, kind::STATES_CPU_FIRST, store::Snapshot, window::Window, Origin,
    },
};

/// What `/processes` sorts by (`sort=`), most first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum SortBy {
    /// Sampled CPU time (the default).
    Cpu,
    /// Named as the state; `cpu` is [`SortBy::Cpu`].
    State(State),
    /// Futex, I/O and sleep together: waiting on something else.
    Blocked,
    /// Every state together.
    Wall,
    /// Time that is not plain idle: CPU, runqueue, throttled and I/O, then
    /// (between equals, such as processes that only wait) futex: a busy or
    /// starved process comes before one with many idle threads. The web
    /// UI's default.
    Active,
}

impl SortBy {
    /// Every order, as the API lists them: sampled CPU, the other states
    /// ([`STATES_CPU_FIRST`]), then the unions (`blocked`, `wall`, `active`).
    pub const ALL: [SortBy; State::COUNT + 3] = {
        let mut all = [SortBy::Wall; State::COUNT + 3];
        // STATES_CPU_FIRST[0] is the CPU: sampled, it is `SortBy::Cpu`.
        let mut i = 1;
        while i < State::COUNT {
            all[i] = SortBy::State(STATES_CPU_FIRST[i]);
            i += 1;
        }
        all[0] = SortBy::Cpu;
        all[i] = SortBy::Blocked;
        all[i + 2] = SortBy::Active;
        all
    };

    /// The API's name of the order.
    pub fn name(self) -> &'static str {
        match self {
            SortBy::State(s) => s.name(),
            other => other.into(),
        }
    }

    /// Names accepted by the API, in [`SortBy::ALL`] order.
    pub fn names() -> [&'static str; State::COUNT + 3] {
        SortBy::ALL.map(SortBy::name)
    }

    /// Parses an API name.
    pub fn parse(name: &str) -> Option<SortBy> {
        SortBy::ALL.into_iter().find(|s| s.name() == name)
    }

    fn key(self, row: &ProcessSummary) -> u128 {
        self.key_of(row.cpu_us, &row.time)
    }

    /// The value sorted on, of a row with sampled CPU `cpu_us` and `time`
    /// (wide enough for [`SortBy::Active`]'s two figures).
    pub(super) fn key_of(self, cpu_us: u64, time: &StateTimes) -> u128 {
        let figure = match self {
            SortBy::Cpu => cpu_us,
            SortBy::State(State::Cpu) => time.cpu_us,
            SortBy::State(State::Runqueue) => time.runqueue_us,
            SortBy::State(State::Throttled) => time.throttled_us,
            SortBy::State(State::Futex) => time.futex_us,
            SortBy::State(State::Io) => time.io_us,
            SortBy::State(State::Sleep) => time.sleep_us,
            SortBy::Blocked => time.blocked_us,
            SortBy::Wall => time.wall_us,
            SortBy::Active => {
                return (u128::from(time.active_us) << 64) | u128::from(time.futex_us);
            }
        };
        u128::from(figure)
    }
}

/// A process's exact time by state in the window, from its threads'
/// totals (µs, all threads added up).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct StateTimes {
    pub cpu_us: u64,
    pub runqueue_us: u64,
    pub throttled_us: u64,
    pub futex_us: u64,
    pub io_us: u64,
    pub sleep_us: u64,
    /// `futex_us + io_us + sleep_us`.
    pub blocked_us: u64,
    /// `cpu_us + runqueue_us + throttled_us + io_us`: not idle, not parked.
    pub active_us: u64,
    pub wall_us: u64,
}

impl StateTimes {
    pub(super) fn of(ns: &[u64; State::COUNT]) -> StateTimes {
        let us = |s: State| ns_to_us(ns[s as usize]);
        StateTimes {
            cpu_us: us(State::Cpu),
            runqueue_us: us(State::Runqueue),
            throttled_us: us(State::Throttled),
            futex_us: us(State::Futex),
            io_us: us(State::Io),
            sleep_us: us(State::Sleep),
            blocked_us: ns_to_us(
                ns[State::Futex as usize] + ns[State::Io as usize] + ns[State::Sleep as usize],
            ),
            active_us: ns_to_us(
                [State::Cpu, State::Runqueue, State::Throttled, State::Io]
                    .iter()
                    .map(|s| ns[*s as usize])
                    .sum(),
            ),
            wall_us: ns_to_us(ns.iter().sum()),
        }
    }
}

/// One row of `/processes`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProcessSummary {
    pub pid: u32,
    pub comm: String,
    /// Sampled CPU time (the flame graphs' total).
    pub cpu_us: u64,
    /// Exact time by state.
    pub time: StateTimes,
    /// What wallscope knows of the process as a JVM, when it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jvm: Option<crate::jvm::JvmReport>,
    /// Its container and pod, when it runs in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<Arc<Container>>,
    /// Its command line, executable, program and cgroups, as the newest
    /// slice that recorded them has them (`cmdline`, `executable`, `main`,
    /// `cgroups`).
    #[serde(flatten)]
    pub identity: Option<Shown>,
    /// A kernel thread (set by the API, which reads `/proc`; sent when true).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kernel: bool,
    /// Its state over the window, one letter a stretch (see
    /// [`super::strip`]), when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strip: Option<String>,
}

/// What the window holds of one process.
#[derive(Default)]
pub(super) struct Acc {
    pub name: Option<Arc<str>>,
    pub cpu_ns: u64,
    pub counters: ThreadCounters,
    pub container: Option<Arc<Container>>,
    pub origin: Option<Origin>,
}

impl Acc {
    pub(super) fn comm(&self) -> String {
        self.name.as_deref().unwrap_or("[unknown]").to_string()
    }
}

/// What the window holds of the processes a reader may not see: how many,
/// and their time together.
#[derive(Default)]
pub(super) struct Unseen {
    pub hidden: Hidden,
    pub cpu_ns: u64,
    pub counters: ThreadCounters,
}

/// Every process with samples or thread totals within `window` that
/// `sight` sees (in each slice, as the process was then), by pid; the
/// others summed.
pub(super) fn accumulate(
    store: &Snapshot,
    window: Window,
    sight: &Sight,
) -> (HashMap<u32, Acc>, Unseen) {
    let mut by_pid: HashMap<u32, Acc> = HashMap::new();
    let mut unseen = Unseen::default();
    for slice in store.within(window) {
        // Monotone in time (seen once started): a pid seen in a slice is
        // seen in every later one, so names below come from seen slices.
        let sees = |pid: u32| sight.sees(pid, slice.start);
        for s in slice.samples.iter().filter(|s| s.state == State::Cpu) {
            if sees(s.pid) {
                by_pid.entry(s.pid).or_default().cpu_ns += s.ns;
            } else {
                unseen.hidden.note(s.pid);
                unseen.cpu_ns += s.ns;
            }
        }
        for t in &slice.thread_totals {
            if sees(t.pid) {
                by_pid.entry(t.pid).or_default().counters += &t.counters;
            } else {
                unseen.hidden.note(t.pid);
                unseen.counters += &t.counters;
            }
        }
        // Slices come oldest first: the newest name wins (a program
        // exec'd under the same pid, or a pid reused).
        for (pid, name) in &slice.processes {
            if let Some(acc) = by_pid.get_mut(pid) {
                acc.name = Some(name.clone());
            }
        }
        for (pid, c) in &slice.containers {
            if let Some(acc) = by_pid.get_mut(pid) {
                acc.container = Some(c.clone());
            }
        }
        for (pid, o) in &slice.origins {
            if let Some(acc) = by_pid.get_mut(pid) {
                acc.origin = Some(o.clone());
            }
        }
    }
    (by_pid, unseen)
}

/// Every process with samples or thread totals within `window` whose name
/// contains `comm` and whose names contain `name` ([`identity::matches`])
/// (all without), by `sort` (most first, then by pid); those `sight` may
/// not see in one `[other users] ×N` row (pid 0) last, unless `comm` or
/// `name` is given (their names are not theirs to match).
pub fn processes(
    store: &Snapshot,
    window: Window,
    sort: SortBy,
    (comm, name): (Option<&str>, Option<&Name>),
    sight: &Sight,
) -> Vec<ProcessSummary> {
    let (seen, unseen) = accumulate(store, window, sight);
    let mut rows: Vec<ProcessSummary> = seen
        .into_iter()
        .map(|(pid, acc)| ProcessSummary {
            pid,
            comm: acc.comm(),
            cpu_us: ns_to_us(acc.cpu_ns),
            time: StateTimes::of(&acc.counters.ns),
            jvm: None,
            identity: acc.origin.as_ref().and_then(Shown::of),
            container: acc.container,
            kernel: false,
            strip: None,
        })
        .filter(|r| comm.is_none_or(|c| r.comm.contains(c)))
        .filter(|r| {
            name.is_none_or(|n| {
                identity::matches(n, &r.comm, r.identity.as_ref(), r.container.as_deref())
            })
        })
        .collect();
    rows.sort_by(|a, b| sort.key(b).cmp(&sort.key(a)).then(a.pid.cmp(&b.pid)));
    if comm.is_none() && name.is_none() && !unseen.hidden.is_empty() {
        rows.push(ProcessSummary {
            pid: 0,
            comm: unseen.hidden.label(),
            cpu_us: ns_to_us(unseen.cpu_ns),
            time: StateTimes::of(&unseen.counters.ns),
            jvm: None,
            container: None,
            identity: None,
            kernel: false,
            strip: None,
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::profile::model::counters::{RawThread, ThreadCounters};
    use crate::profile::{
        model::{store::Store, Slice},
        report::query::{pid_recorded, tests::store, tid_recorded},
    };

    #[test]
    fn processes_sorted_by_cpu() {
        let (store, now) = store();
        let rows = processes(
            &store.snapshot(),
            Window::last(30, now),
            SortBy::Cpu,
            (None, None),
            &Sight::all(),
        );
        assert_eq!(
            (rows[0].pid, rows[0].comm.as_str(), rows[0].cpu_us),
            (20, "twenty", 9)
        );
        assert_eq!(rows[1].pid, 10);
        assert!(pid_recorded(&store.snapshot(), 10) && !pid_recorded(&store.snapshot(), 11));
        assert!(tid_recorded(&store.snapshot(), 11) && !tid_recorded(&store.snapshot(), 99));
    }

    /// Pid 1 burns CPU; pid 2 ("stuck-db") has every thread on a futex and
    /// no CPU sample at all; pid 3 sleeps.
    fn mixed() -> (Store, SystemTime) {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        let mut slice = Slice::empty(end - Duration::from_secs(1), end);
        let thread = |pid, tid, state: State, ms: u64| {
            let mut ns = [0; State::COUNT];
            ns[state as usize] = ms * 1_000_000;
            RawThread {
                tid,
                pid,
                comm: String::new(),
                counters: ThreadCounters {
                    ns,
                    switches_voluntary: 0,
                    switches_involuntary: 0,
                    wakeups_sent: 0,
                    wakeups_received: 0,
                },
            }
        };
        slice.thread_totals = vec![
            thread(1, 1, State::Cpu, 900),
            thread(2, 2, State::Futex, 1000),
            thread(2, 21, State::Futex, 1000),
            thread(3, 3, State::Sleep, 700),
            thread(3, 3, State::Io, 100),
        ];
        for (pid, name) in [(1, "burner"), (2, "stuck-db"), (3, "napper")] {
            slice.processes.insert(pid, Arc::from(name));
        }
        store.push(slice);
        (store, end)
    }

    #[test]
    fn sorting_by_a_state_puts_the_stuck_process_first() {
        let (store, now) = mixed();
        let window = Window::last(30, now);
        let order = |sort| -> Vec<u32> {
            let rows = processes(&store.snapshot(), window, sort, (None, None), &Sight::all());
            rows.iter().map(|r| r.pid).collect()
        };
        assert_eq!(order(SortBy::parse("futex").unwrap()), [2, 1, 3]);
        assert_eq!(order(SortBy::parse("blocked").unwrap()), [2, 3, 1]);
        assert_eq!(order(SortBy::parse("sleep").unwrap()), [3, 1, 2]);
        assert_eq!(order(SortBy::parse("io").unwrap()), [3, 1, 2]);
        assert_eq!(order(SortBy::parse("wall").unwrap()), [2, 1, 3]);
        let rows = processes(
            &store.snapshot(),
            window,
            SortBy::Blocked,
            (None, None),
            &Sight::all(),
        );
        assert_eq!(rows[0].time.futex_us, 2_000_000);
        assert_eq!(rows[0].time.blocked_us, 2_000_000);
        assert_eq!(rows[1].time.blocked_us, 800_000);
        let names = SortBy::names();
        let want = [
            "cpu",
            "runqueue",
            "throttled",
            "futex",
            "io",
            "sleep",
            "blocked",
        ];
        assert_eq!(names[..7], want);
        assert_eq!(names[7..], ["wall", "active"]);
        // Active: the burner (CPU), then the napper (I/O), then the one
        // that only waits on a futex.
        assert_eq!(order(SortBy::Active), [1, 3, 2]);
        for name in names {
            assert_eq!(SortBy::parse(name).map(SortBy::name), Some(name));
        }
        assert!(SortBy::parse("park").is_none());
    }

    #[test]
    fn comm_filters_by_name() {
        let (store, now) = mixed();
        let window = Window::last(30, now);
        let rows = processes(
            &store.snapshot(),
            window,
            SortBy::Cpu,
            (Some("db"), None),
            &Sight::all(),
        );
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].comm, "stuck-db");
        assert!(processes(
            &store.snapshot(),
            window,
            SortBy::Cpu,
            (Some("nope"), None),
            &Sight::all()
        )
        .is_empty());
    }

    /// Pid 5 was another user's process (`victim`, 900 ms) until the
    /// reader's own (`mine`, 300 ms) took it at 95 s; pid 6 is another
    /// user's (100 ms).
    #[test]
    fn a_reused_pid_shows_only_the_readers_process_and_others_are_a_count() {
        let at = |secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        let mut store = Store::new(Duration::from_secs(600));
        let slice = |end: u64, rows: &[(u32, &str, u64)]| {
            let mut slice = Slice::empty(at(end - 1), at(end));
            for (pid, name, ms) in rows {
                let mut ns = [0; State::COUNT];
                ns[State::Sleep as usize] = ms * 1_000_000;
                slice.thread_totals.push(RawThread {
                    tid: *pid,
                    pid: *pid,
                    comm: String::new(),
                    counters: ThreadCounters {
                        ns,
                        ..ThreadCounters::default()
                    },
                });
                slice.processes.insert(*pid, Arc::from(*name));
            }
            slice
        };
        store.push(slice(91, &[(5, "victim", 900), (6, "other", 100)]));
        store.push(slice(100, &[(5, "mine", 300)]));
        let reader = crate::profile::report::disclosure::Reader::User {
            uid: Some(1000),
            owner_of: Arc::new(move |pid| (pid == 5).then_some((1000, at(95)))),
        };
        let window = Window::last(30, at(100));
        let rows = processes(
            &store.snapshot(),
            window,
            SortBy::Wall,
            (None, None),
            &reader.sight(),
        );
        let shown: Vec<(u32, &str, u64)> = rows
            .iter()
            .map(|r| (r.pid, r.comm.as_str(), r.time.wall_us))
            .collect();
        assert_eq!(
            shown,
            [(5, "mine", 300_000), (0, "[other users] ×2", 1_000_000)]
        );
        // Asked by name: no count row (other users' names are not matched).
        let named = processes(
            &store.snapshot(),
            window,
            SortBy::Wall,
            (Some("i"), None),
            &reader.sight(),
        );
        assert_eq!(named.len(), 1);
        let root = processes(
            &store.snapshot(),
            window,
            SortBy::Wall,
            (None, None),
            &Sight::all(),
        );
        assert_eq!((root.len(), root[0].time.wall_us), (2, 1_200_000));
    }
}
