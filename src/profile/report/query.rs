//! Selecting and grouping samples: the answers the API gives.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

pub use super::filter::Filter;
use super::{
    fold,
    rows::{self, Names},
    truncate::{Limits, Truncation},
};
use crate::{
    profile::model::state::State,
    profile::model::{store::Snapshot, window::Window},
};

/// Stacks folded root-first, with nanoseconds per stack.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Folded {
    /// `process;frame;...;leaf` -> nanoseconds.
    pub stacks: BTreeMap<String, u64>,
    pub total_ns: u64,
    /// Names of the processes that contributed, by pid.
    pub processes: BTreeMap<u32, Arc<str>>,
}

/// Folds the samples that match `filter`, whole (no bounds: tests and the
/// command line's own recordings); the root frame is the process name
/// (or, for wakeups raised in interrupt context, the interrupt).
pub fn folded(store: &Snapshot, filter: &Filter) -> Folded {
    folded_within(store, filter, Limits::NONE).0
}

/// Folds the samples that match `filter` within `limits` (see
/// [`super::fold`]); the truncation says what the bounds merged away.
pub fn folded_within(
    store: &Snapshot,
    filter: &Filter,
    limits: Limits,
) -> (Folded, Option<Truncation>) {
    let (rows, names) = rows::select(store, filter, false);
    let (mut out, truncated) = fold::fold(&rows, &names, filter, limits);
    for row in rows.iter().filter(|r| r.ns > 0) {
        if row.interrupt.is_none() && !row.is_other_process() {
            note_process(&mut out, &names, row.pid);
        }
    }
    // The process asked for names the graph even when it only shows as a
    // wakee (`kind=wakeup`, woken by others or by interrupts).
    if let (Some(pid), false) = (filter.pid, out.stacks.is_empty()) {
        note_process(&mut out, &names, pid);
    }
    (out, truncated)
}

fn note_process(out: &mut Folded, names: &Names, pid: u32) {
    out.processes
        .entry(pid)
        .or_insert_with(|| Arc::from(names.process(pid)));
}

/// The `n` processes with the most time on or waiting for a CPU (cpu,
/// runqueue and throttled), then the most wall time (all their threads'
/// states), within `window`, busiest first: a process of many idle threads
/// has much wall time but wants no CPU.
pub fn busiest(store: &Snapshot, window: Window, n: usize) -> Vec<u32> {
    let mut time: HashMap<u32, (u64, u64)> = HashMap::new();
    for slice in store.within(window) {
        for t in &slice.thread_totals {
            let e = time.entry(t.pid).or_default();
            e.0 += [State::Cpu, State::Runqueue, State::Throttled]
                .iter()
                .map(|s| t.counters.ns_in(*s))
                .sum::<u64>();
            e.1 += t.counters.wall();
        }
    }
    let mut ranked: Vec<(u32, (u64, u64))> = time.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(n);
    ranked.into_iter().map(|(pid, _)| pid).collect()
}

/// Whether anything was recorded for `pid` during the whole retention.
pub fn pid_recorded(store: &Snapshot, pid: u32) -> bool {
    store.all().any(|s| s.processes.contains_key(&pid))
}

/// Whether anything was recorded for thread `tid` during the whole retention.
pub fn tid_recorded(store: &Snapshot, tid: u32) -> bool {
    store.all().any(|s| s.threads.contains_key(&tid))
}

/// Nanoseconds to microseconds, rounded to nearest; a non-zero time never
/// rounds down to zero, so no recorded stack disappears from the output.
pub fn ns_to_us(ns: u64) -> u64 {
    if ns == 0 {
        0
    } else {
        ((ns + 500) / 1000).max(1)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::SystemTime;

    use std::time::Duration;

    use super::*;
    use crate::profile::model::counters::{RawThread, ThreadCounters};
    use crate::profile::model::kind::{Group, Kind};
    use crate::profile::model::{store::Store, Sample, Slice, Stack, Wakeup};

    fn sample(pid: u32, tid: u32, frames: &[&str], ns: u64) -> Sample {
        let stack: Stack = frames.iter().map(|f| Arc::<str>::from(*f)).collect();
        Sample {
            pid,
            tid,
            state: State::Cpu,
            stack,
            ns,
            count: 1,
        }
    }

    /// Pids 10 (threads 10 and 11) and 20 on CPU, in one slice ending at
    /// the time returned.
    pub(crate) fn store() -> (Store, SystemTime) {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        store.push(Slice {
            start: end - Duration::from_secs(1),
            end,
            samples: vec![
                sample(10, 10, &["main", "a"], 3_000),
                sample(10, 11, &["main", "a"], 1_000),
                sample(10, 11, &["main", "b"], 2_000),
                sample(20, 20, &["main"], 9_000),
            ],
            wakeups: Vec::new(),
            thread_totals: Vec::new(),
            runq_hists: Vec::new(),
            threads: [10, 11, 20]
                .map(|tid| {
                    (
                        tid,
                        crate::profile::model::ThreadInfo {
                            pid: tid / 10 * 10,
                            name: Arc::from("t"),
                        },
                    )
                })
                .into(),
            processes: [(10, Arc::from("ten")), (20, Arc::from("twenty"))].into(),
            containers: Default::default(),
            origins: Default::default(),
            kept_off: Default::default(),
            sleeps: Default::default(),
            stats: [0; crate::profile::model::state::STAT_COUNTERS],
            spans: Default::default(),
        });
        (store, end)
    }

    /// Pid 1234 is process `a` in one slice and, reused, `b` in the next.
    fn reused_pid() -> (Store, SystemTime) {
        use crate::profile::model::counters::RawThread;
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        for (i, (name, frame, sampled, total)) in
            [("a", "x", 1_000, 1_500), ("b", "y", 2_000, 2_000)]
                .into_iter()
                .enumerate()
        {
            let mut ns = [0; State::COUNT];
            ns[State::Cpu as usize] = total;
            let begin = start + Duration::from_secs(i as u64);
            store.push(Slice {
                samples: vec![sample(1234, 1234, &["main", frame], sampled)],
                thread_totals: vec![RawThread {
                    tid: 1234,
                    pid: 1234,
                    comm: name.into(),
                    counters: ThreadCounters {
                        ns,
                        switches_voluntary: 0,
                        switches_involuntary: 0,
                        wakeups_sent: 0,
                        wakeups_received: 0,
                    },
                }],
                processes: [(1234, Arc::from(name))].into(),
                ..Slice::empty(begin, begin + Duration::from_secs(1))
            });
        }
        (store, start + Duration::from_secs(2))
    }

    #[test]
    fn a_reused_pid_keeps_each_process_under_its_own_name() {
        let (reused, now) = reused_pid();
        let cpu = Filter::cpu(Some(1234), None, Window::last(30, now));
        let f = folded(&reused.snapshot(), &cpu);
        assert_eq!(
            f.stacks,
            BTreeMap::from([
                ("a;main;x".to_string(), 1_000),
                ("b;main;y".to_string(), 2_000)
            ])
        );
        // Wall graphs: each process's rest is its own, not the other's.
        let wall = with_kind("wall", Group::Process, now);
        let f = folded(
            &reused.snapshot(),
            &Filter {
                pid: Some(1234),
                ..wall
            },
        );
        let under = |name: &str| -> u64 {
            f.stacks
                .iter()
                .filter(|(k, _)| k.starts_with(&format!("{name};")))
                .map(|(_, v)| v)
                .sum()
        };
        assert_eq!((under("a"), under("b")), (1_500, 2_000), "{:?}", f.stacks);
        // One name in a window still merges into one row.
        let (one, now) = store();
        let f = folded(
            &one.snapshot(),
            &Filter::cpu(Some(10), None, Window::last(30, now)),
        );
        assert_eq!(f.stacks["ten;main;a"], 4_000);
    }

    #[test]
    fn folds_by_process_and_filters_by_pid_and_tid() {
        let (store, now) = store();
        let all = Filter::cpu(None, None, Window::last(30, now));
        let f = folded(&store.snapshot(), &all);
        assert_eq!(f.total_ns, 15_000);
        assert_eq!(
            f.stacks["ten;main;a"], 4_000,
            "threads merge under the process"
        );
        assert_eq!(f.stacks["twenty;main"], 9_000);

        let f = folded(
            &store.snapshot(),
            &Filter {
                pid: Some(10),
                tid: Some(11),
                ..all.clone()
            },
        );
        assert_eq!(f.total_ns, 3_000);
        assert_eq!(f.stacks.len(), 2);

        let later = now + Duration::from_secs(60);
        assert!(
            folded(
                &store.snapshot(),
                &Filter {
                    window: Window::last(30, later),
                    ..all.clone()
                }
            )
            .stacks
            .is_empty(),
            "outside the window"
        );
    }

    /// Pid 10 (thread 11 throttled, then woken by thread 10 and by a
    /// softirq); pid 0 is the idle task, named like it.
    pub(crate) fn offcpu_store() -> (Store, SystemTime) {
        use crate::{profile::model::state::INTERRUPT_TID, profile::model::Interrupt};
        let (mut store, end) = store();
        let frames = |names: &[&str]| -> Stack { names.iter().map(|f| Arc::from(*f)).collect() };
        let wakeup = |pid, tid, interrupt, stack: &[&str]| Wakeup {
            pid,
            tid,
            interrupt,
            peer_pid: 10,
            peer_tid: 11,
            stack: frames(stack),
            ns: 5_000,
            count: 1,
        };
        let mut ns = [0; State::COUNT];
        (ns[State::Cpu as usize], ns[State::Throttled as usize]) = (1_000, 8_000);
        store.push(Slice {
            start: end,
            end: end + Duration::from_secs(1),
            samples: vec![Sample {
                state: State::Throttled,
                ..sample(10, 11, &["main", "spin"], 6_000)
            }],
            wakeups: vec![
                wakeup(10, 10, None, &["main", "unpark"]),
                wakeup(
                    0,
                    INTERRUPT_TID,
                    Some(Interrupt::Soft),
                    &["net_rx_action_[k]", "try_to_wake_up_[k]"],
                ),
            ],
            thread_totals: vec![RawThread {
                tid: 11,
                pid: 10,
                comm: "t".into(),
                counters: ThreadCounters {
                    ns,
                    switches_voluntary: 0,
                    switches_involuntary: 0,
                    wakeups_sent: 0,
                    wakeups_received: 2,
                },
            }],
            runq_hists: Vec::new(),
            threads: HashMap::from([(
                11,
                crate::profile::model::ThreadInfo {
                    pid: 10,
                    name: Arc::from("t"),
                },
            )]),
            processes: [(0, Arc::from("swapper/0")), (10, Arc::from("ten"))].into(),
            containers: Default::default(),
            origins: Default::default(),
            kept_off: Default::default(),
            sleeps: Default::default(),
            stats: [0; crate::profile::model::state::STAT_COUNTERS],
            spans: Default::default(),
        });
        (store, end + Duration::from_secs(1))
    }

    fn with_kind(kind: &str, group: Group, now: SystemTime) -> Filter {
        Filter {
            kind: Kind::parse(kind).unwrap(),
            group,
            ..Filter::cpu(Some(10), None, Window::last(30, now))
        }
    }

    #[test]
    fn throttled_time_is_a_kind_and_a_wall_state() {
        let (store, now) = offcpu_store();
        let store = store.snapshot();
        let f = folded(&store, &with_kind("throttled", Group::Process, now));
        assert_eq!(f.stacks, BTreeMap::from([("ten;main;spin".into(), 6_000)]));
        let f = folded(&store, &with_kind("offcpu", Group::Process, now));
        assert_eq!(f.stacks["ten;main;spin"], 6_000, "off-CPU includes it");
        let f = folded(&store, &with_kind("wall", Group::Thread, now));
        assert_eq!(f.stacks["ten;t [tid 11];[throttled];main;spin"], 6_000);
        assert_eq!(
            f.stacks["ten;t [tid 11];[throttled];[unattributed]"], 2_000,
            "the rest of the thread's exact throttled time"
        );
    }

    #[test]
    fn sampled_rows_over_the_exact_time_are_scaled_to_it_in_wall_graphs() {
        let (mut store, now) = offcpu_store();
        // A second estimate for the same thread and state: 6 + 6 ms of rows
        // for 8 ms spent throttled.
        store.push(Slice {
            start: now,
            end: now + Duration::from_millis(10),
            samples: vec![Sample {
                state: State::Throttled,
                ..sample(10, 11, &["main", "wait"], 6_000)
            }],
            wakeups: Vec::new(),
            thread_totals: Vec::new(),
            runq_hists: Vec::new(),
            threads: HashMap::new(),
            processes: [(10, Arc::from("ten"))].into(),
            containers: Default::default(),
            origins: Default::default(),
            kept_off: Default::default(),
            sleeps: Default::default(),
            stats: [0; crate::profile::model::state::STAT_COUNTERS],
            spans: Default::default(),
        });
        let store = store.snapshot();
        let now = now + Duration::from_millis(10);
        for group in [Group::Thread, Group::Process] {
            let f = folded(&store, &with_kind("wall", group, now));
            let throttled: u64 = f
                .stacks
                .iter()
                .filter(|(k, _)| k.contains("[throttled]"))
                .map(|(_, v)| v)
                .sum();
            assert_eq!(throttled, 8_000, "{:?}", f.stacks);
        }
        let f = folded(&store, &with_kind("throttled", Group::Process, now));
        assert_eq!(f.stacks["ten;main;wait"], 6_000, "other kinds are unscaled");
    }

    #[test]
    fn interrupt_wakers_are_their_context_not_a_process() {
        let (store, now) = offcpu_store();
        let store = store.snapshot();
        for group in [Group::Process, Group::Thread, Group::Pool] {
            let f = folded(&store, &with_kind("wakeup", group, now));
            let irq: Vec<&String> = f.stacks.keys().filter(|k| k.contains("net_rx")).collect();
            assert_eq!(
                irq,
                ["[softirq];net_rx_action_[k];try_to_wake_up_[k];[wakes t [tid 11]]"],
                "{group:?}"
            );
            assert!(!f.stacks.keys().any(|k| k.contains("swapper")), "{f:?}");
            assert!(!f.processes.contains_key(&0), "{:?}", f.processes);
            assert_eq!(f.processes[&10].as_ref(), "ten");
        }
    }

    #[test]
    fn a_user_other_than_root_sees_no_other_process_in_wakeups() {
        let (mut store, now) = offcpu_store();
        let frames = |names: &[&str]| -> Stack { names.iter().map(|f| Arc::from(*f)).collect() };
        let wakeup = |(pid, tid), (peer_pid, peer_tid), stack: &[&str]| Wakeup {
            pid,
            tid,
            interrupt: None,
            peer_pid,
            peer_tid,
            stack: frames(stack),
            ns: 7_000,
            count: 1,
        };
        store.push(Slice {
            start: now,
            end: now + Duration::from_secs(1),
            samples: Vec::new(),
            wakeups: vec![
                // Root's daemon wakes pid 10's thread; pid 10 wakes root's.
                wakeup((20, 21), (10, 11), &["secret_fn"]),
                wakeup((10, 11), (20, 22), &["main", "notify"]),
            ],
            thread_totals: Vec::new(),
            runq_hists: Vec::new(),
            threads: HashMap::from([
                (
                    11,
                    crate::profile::model::ThreadInfo {
                        pid: 10,
                        name: Arc::from("t"),
                    },
                ),
                (
                    22,
                    crate::profile::model::ThreadInfo {
                        pid: 20,
                        name: Arc::from("secret_thread"),
                    },
                ),
            ]),
            processes: [(10, Arc::from("ten")), (20, Arc::from("secretd"))].into(),
            containers: Default::default(),
            origins: Default::default(),
            kept_off: Default::default(),
            sleeps: Default::default(),
            stats: [0; crate::profile::model::state::STAT_COUNTERS],
            spans: Default::default(),
        });
        let store = store.snapshot();
        let now = now + Duration::from_secs(1);
        let all = folded(&store, &with_kind("wakeup", Group::Thread, now));
        let text = format!("{all:?}");
        assert!(
            text.contains("secret_fn") && text.contains("secret_thread"),
            "{text}"
        );
        let own = folded(
            &store,
            &Filter {
                others_hidden: true,
                ..with_kind("wakeup", Group::Thread, now)
            },
        );
        let text = format!("{own:?}");
        assert!(!text.contains("secret"), "{text}");
        assert_eq!(own.stacks["[another process];[wakes t [tid 11]]"], 7_000);
        assert_eq!(
            own.stacks["ten;t [tid 11];main;notify;[wakes [another process]]"],
            7_000
        );
        assert_eq!(own.total_ns, all.total_ns, "the same time, fewer names");
    }

    #[test]
    fn rounding_never_loses_a_stack() {
        assert_eq!(ns_to_us(0), 0);
        assert_eq!(ns_to_us(1), 1);
        assert_eq!(ns_to_us(1_499), 1);
        assert_eq!(ns_to_us(1_500), 2);
    }
}
