//! Compaction: a store under a small budget keeps its whole retention,
//! with exact per-thread and per-process totals and the promised
//! resolution at each age.
use std::{collections::HashMap, sync::Arc};

use super::{compact::step_for, merge::is_pool_tid, *};
use crate::profile::model::counters::{RawThread, ThreadCounters};
use crate::profile::model::HistOwner;
use crate::{
    profile::model::state::{Hist, State},
    profile::model::{Sample, ThreadInfo, Wakeup},
};

const PIDS: [u32; 4] = [1000, 2000, 3000, 4000];
const THREADS: u32 = 25;
const STACKS: usize = 40;

fn at(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(s)
}

/// A slice ending at `end_s` from 4 processes of 25 threads each
/// (`worker-N`, one pool a process): each thread with 3 sample rows in
/// stacks that change from second to second, a wakeup and its totals.
fn busy(end_s: u64, stacks: &[Stack]) -> Slice {
    let mut s = Slice::empty(at(end_s - 1), at(end_s));
    for pid in PIDS {
        s.processes.insert(pid, Arc::from(format!("app{pid}")));
        for n in 0..THREADS {
            let tid = pid + 1 + n;
            let name: Arc<str> = Arc::from(format!("worker-{n}"));
            s.threads.insert(tid, ThreadInfo { pid, name });
            for (k, state) in [State::Cpu, State::Futex, State::Sleep]
                .into_iter()
                .enumerate()
            {
                let stack = stacks[(tid as usize + end_s as usize + k * 7) % stacks.len()].clone();
                let ns = 1_000 + u64::from(tid) + end_s + k as u64;
                let count = 1;
                s.samples.push(Sample {
                    pid,
                    tid,
                    state,
                    stack,
                    ns,
                    count,
                });
            }
            s.wakeups.push(Wakeup {
                pid,
                tid,
                interrupt: None,
                peer_pid: pid,
                peer_tid: pid + 1 + (n + 1) % THREADS,
                stack: stacks[(tid as usize + end_s as usize) % stacks.len()].clone(),
                ns: 500,
                count: 1,
            });
            let mut ns = [0; State::COUNT];
            ns[State::Cpu as usize] = 1_000 + u64::from(tid) + end_s;
            ns[State::Futex as usize] = 2_000 + end_s;
            ns[State::Sleep as usize] = 3_000 + u64::from(n);
            s.thread_totals.push(RawThread {
                tid,
                pid,
                comm: format!("worker-{n}"),
                counters: ThreadCounters {
                    ns,
                    switches_voluntary: 2,
                    switches_involuntary: 1,
                    wakeups_sent: 1,
                    wakeups_received: 1,
                },
            });
        }
        let mut hist = Hist {
            slots: [0; crate::profile::model::state::HIST_SLOTS],
            ns: 0,
        };
        hist.slots[3] = end_s;
        hist.ns = 10;
        s.runq_hists.push((HistOwner::Process(pid), hist));
    }
    s
}

fn stacks() -> Vec<Stack> {
    (0..STACKS)
        .map(|i| {
            ["main", "loop", &format!("work{i}"), "leaf"]
                .map(Arc::<str>::from)
                .into()
        })
        .collect()
}

/// Per thread: ns by state, switches, wakeups received.
type Totals = HashMap<(u32, u32), ([u64; State::COUNT], u64, u64)>;

fn add_totals(into: &mut Totals, s: &Slice) {
    for t in &s.thread_totals {
        let e = into.entry((t.pid, t.tid)).or_default();
        for (a, b) in e.0.iter_mut().zip(t.counters.ns) {
            *a += b;
        }
        e.1 += t.counters.switches_voluntary + t.counters.switches_involuntary;
        e.2 += t.counters.wakeups_received;
    }
}

/// Sample ns by process and state (folding keeps them, under pools).
fn sample_ns(slices: &[&Slice]) -> HashMap<(u32, State), u64> {
    let mut out = HashMap::new();
    for s in slices {
        for r in &s.samples {
            *out.entry((r.pid, r.state)).or_default() += r.ns;
        }
    }
    out
}

#[test]
fn a_small_budget_keeps_the_whole_retention_with_exact_totals() {
    const RETENTION: u64 = 600;
    // Compressed, a busy second is some 15 KB and merged 10 s blocks hold
    // the retention in some 330 KB: 256 KiB needs 60 s blocks too.
    const MAX: usize = 256 << 10;
    let stacks = stacks();
    let one = {
        let mut probe = Store::new(Duration::from_secs(RETENTION));
        probe.push(busy(1, &stacks));
        probe.bytes()
    };
    // Eviction alone would have held a fraction of the retention.
    assert!(
        one * (RETENTION as usize) > 4 * MAX,
        "slices of {one} bytes: not enough to need compaction"
    );
    let mut store = Store::new(Duration::from_secs(RETENTION)).with_max_bytes(MAX);
    let mut pushed = Vec::new();
    let mut process_ns: HashMap<u32, u64> = HashMap::new();
    let start = 10_000;
    for t in start..start + 700 {
        let s = busy(t, &stacks);
        for r in &s.thread_totals {
            *process_ns.entry(r.pid).or_default() += r.counters.ns.iter().sum::<u64>();
        }
        pushed.push(s.clone());
        store.push(s);
        assert!(
            store.bytes() <= MAX,
            "{} > {MAX} after push {t}",
            store.bytes()
        );
    }
    let stats = store.stats();
    assert!(stats.history_s + 2 >= RETENTION, "{stats:?}");
    assert_eq!((stats.evicted_slices, stats.shed_rows), (0, 0), "{stats:?}");
    // Merged in time; compressed, it rarely needs folding into pools too
    // (folding is tested below and in `share`).
    assert!(stats.compacted_slices > 0, "{stats:?}");

    // Per-thread totals over what the store holds: exactly the pushed ones.
    let oldest = store.all().next().unwrap().start;
    let mut want = Totals::new();
    let held_pushed: Vec<&Slice> = pushed.iter().filter(|s| s.end > oldest).collect();
    held_pushed.iter().for_each(|s| add_totals(&mut want, s));
    let mut got = Totals::new();
    store.all().for_each(|s| add_totals(&mut got, &s));
    assert_eq!(got.len(), PIDS.len() * THREADS as usize);
    assert_eq!(got, want, "per-thread totals exact");
    let held: Vec<Slice> = store.all().collect();
    let held: Vec<&Slice> = held.iter().collect();
    assert_eq!(
        sample_ns(&held),
        sample_ns(&held_pushed),
        "no sample time lost"
    );
    // Per-process totals since first seen: every push counted.
    for (pid, ns) in process_ns {
        assert_eq!(
            store.process_totals()[&pid].counters.ns.iter().sum::<u64>(),
            ns
        );
    }

    // The resolution: the newest seconds at 1 s per thread, 60 s past a
    // minute, no slice spanning more than its step; what answers say.
    let now = store.all().last().unwrap().end;
    let snap = store.snapshot();
    for e in &snap.entries {
        let (s, step, folded) = (e.slice(), &e.step_s, &e.folded);
        let age = now.duration_since(s.end).unwrap().as_secs();
        let span = s.end.duration_since(s.start).unwrap().as_secs();
        assert!(span <= u64::from(*step), "{span} s in a {step} s slice");
        if age < compact::KEEP_FINE_S {
            assert_eq!(*step, 1, "age {age}");
        }
        if age >= 120 {
            assert_eq!(*step, 60, "age {age}");
        }
        let pool_rows = s.samples.iter().any(|r| is_pool_tid(r.tid));
        assert_eq!(
            pool_rows,
            folded.any(),
            "age {age}: folded rows as labelled"
        );
    }
    let parts = snap.resolution(Window::last(RETENTION, now), now);
    assert!(parts.len() >= 2, "{parts:?}");
    assert!(parts.windows(2).all(|w| w[0].to_s_ago == w[1].from_s_ago));
    // Never finer toward the past, though pressure merged out of the age
    // rule's order.
    assert!(
        parts.windows(2).all(|w| w[0].step_s >= w[1].step_s),
        "{parts:?}"
    );
    assert_eq!(parts.last().unwrap().to_s_ago, 0);
    assert!(parts[0].from_s_ago + 2 >= RETENTION, "{parts:?}");
    // Merged in time, the retention fits: four like processes, none of
    // them folded (nobody holds a part worth folding).
    assert_eq!(
        (parts[0].step_s, parts[0].rows),
        (60, "thread"),
        "{parts:?}"
    );
    let newest = parts.last().unwrap();
    assert_eq!(newest.step_s, 1);
    let line = describe_resolution(&parts);
    println!("{stats:?}\n{line}");
    assert!(line.starts_with("1s:0-"), "{line}");
    assert!(line.contains("60s:") && !line.contains("(pools)"), "{line}");
}

#[test]
fn without_pressure_the_age_rule_holds() {
    let mut store = Store::new(Duration::from_secs(600));
    let stacks = stacks();
    let start = 20_000;
    for t in start..start + 800 {
        let mut s = busy(t, &stacks[..1]);
        s.samples.truncate(3);
        s.wakeups.clear();
        s.thread_totals.truncate(2);
        store.push(s);
    }
    let stats = store.stats();
    assert!((600..=660).contains(&stats.history_s), "{stats:?}");
    assert_eq!(stats.folded_slices, 0);
    let snap = store.snapshot();
    let now = at(start + 799);
    for e in &snap.entries {
        let (s, step) = (e.slice(), &e.step_s);
        let age = now.duration_since(s.end).unwrap().as_secs();
        // A bucket merges once its newest slice is due: up to one step
        // of the coarser tier late.
        assert!(*step <= step_for(age), "age {age}: {step}");
        assert!(
            *step >= step_for(age.saturating_sub(60)),
            "age {age}: {step}"
        );
        let span = s.end.duration_since(s.start).unwrap().as_secs();
        assert!(span <= u64::from(*step) && span >= 1);
    }
    let line = describe_resolution(&snap.resolution(Window::last(600, now), now));
    assert!(line.starts_with("1s:0-12"), "{line}");
    // 10 s blocks to the end of the retention (60 s ones past it).
    assert!(line.contains(", 10s:") && !line.contains("60s:"), "{line}");
    println!("{stats:?}\n{line}");
    assert!(!line.contains("pools"), "{line}");
}

#[test]
fn queries_over_folded_rows_show_pools_and_keep_process_totals() {
    use crate::profile::{
        model::kind::{Group, Kind},
        report::query::{folded, Filter},
    };
    let stacks = stacks();
    let parts: Vec<Slice> = (1..=3).map(|t| busy(30_000 + t, &stacks)).collect();
    let refs: Vec<&Slice> = parts.iter().collect();
    let mut store = Store::new(Duration::from_secs(600));
    store.push(super::merge::merge(
        &refs,
        &super::merge::FoldedPids::of(PIDS),
    ));
    let now = at(30_003);
    let pid = PIDS[0];
    let total = |tid: Option<u32>| -> u64 {
        let rows = parts.iter().flat_map(|s| &s.thread_totals);
        let rows = rows.filter(|t| t.pid == pid && tid.is_none_or(|x| x == t.tid));
        rows.map(|t| t.counters.ns.iter().sum::<u64>()).sum()
    };
    let filter = |tid, group| Filter {
        kind: Kind::Wall,
        group,
        ..Filter::cpu(Some(pid), tid, Window::last(60, now))
    };
    let snap = store.snapshot();
    let close = |got: u64, want: u64| got.abs_diff(want) <= 1_000;
    // By thread: the pool's rows under the pool, the threads' exact time.
    let f = folded(&snap, &filter(None, Group::Thread));
    assert!(
        close(f.total_ns, total(None)),
        "{} vs {}",
        f.total_ns,
        total(None)
    );
    assert!(f
        .stacks
        .keys()
        .all(|k| k.starts_with("app1000;worker-* (folded);")));
    // One thread: its time is its pool's now, none of it read as another's.
    let f = folded(&snap, &filter(Some(pid + 1), Group::Thread));
    assert_eq!(f.total_ns, 0, "{:?}", f.stacks);
    // By pool: the same pool as unfolded rows would give.
    let f = folded(&snap, &filter(None, Group::Pool));
    assert!(f.stacks.keys().all(|k| k.starts_with("app1000;worker-*;")));
    // A CPU profile: the sample rows' time, all of it.
    let cpu = Filter::cpu(Some(pid), None, Window::last(60, now));
    let want: u64 = (parts.iter().flat_map(|s| &s.samples))
        .filter(|r| r.pid == pid && r.state == State::Cpu)
        .map(|r| r.ns)
        .sum();
    assert_eq!(folded(&snap, &cpu).total_ns, want);
}

/// Pid of the process of [`SLEEPERS`] threads beside the four small ones.
const BIG: u32 = 90_000;
const SLEEPERS: u32 = 3_000;

/// [`busy`] plus a process of [`SLEEPERS`] sleeping threads (`sleeper-N`,
/// one pool): a sample row and a total each.
fn busy_beside_a_crowd(end_s: u64, stacks: &[Stack]) -> Slice {
    let mut s = busy(end_s, stacks);
    s.processes.insert(BIG, Arc::from("crowd"));
    for n in 0..SLEEPERS {
        let tid = BIG + 1 + n;
        let name: Arc<str> = Arc::from(format!("sleeper-{n}"));
        s.threads.insert(tid, ThreadInfo { pid: BIG, name });
        let ns = 1_000_000 + u64::from(n % 97) * 13 + end_s;
        s.samples.push(Sample {
            pid: BIG,
            tid,
            state: State::Sleep,
            stack: stacks[0].clone(),
            ns,
            count: 1,
        });
        let mut counters = ThreadCounters::default();
        counters.ns[State::Sleep as usize] = ns;
        counters.switches_voluntary = 1;
        let comm = format!("sleeper-{n}");
        s.thread_totals.push(RawThread {
            tid,
            pid: BIG,
            comm,
            counters,
        });
    }
    s
}

#[test]
fn under_pressure_only_the_largest_process_is_folded() {
    const RETENTION: u64 = 300;
    const MAX: usize = 512 << 10;
    let stacks = stacks();
    let mut store = Store::new(Duration::from_secs(RETENTION)).with_max_bytes(MAX);
    let mut pushed = Vec::new();
    for t in 20_000..20_000 + 360 {
        let s = busy_beside_a_crowd(t, &stacks);
        pushed.push(s.clone());
        store.push(s);
        assert!(store.bytes() <= MAX, "{} > {MAX} after {t}", store.bytes());
    }
    let stats = store.stats();
    assert!(stats.history_s + 2 >= RETENTION, "{stats:?}");
    assert_eq!((stats.evicted_slices, stats.shed_rows), (0, 0), "{stats:?}");
    assert!(
        stats.folded_parts > 0,
        "the crowd paid for its room: {stats:?}"
    );
    let held: Vec<Slice> = store.all().collect();
    let oldest = held[0].start;
    let held_pushed: Vec<&Slice> = pushed.iter().filter(|s| s.end > oldest).collect();
    // The small processes: every thread's totals exact, no pool anywhere.
    let small = |t: &Totals| -> Totals {
        t.iter()
            .filter(|((pid, _), _)| *pid != BIG)
            .map(|(k, v)| (*k, *v))
            .collect()
    };
    let (mut want, mut got) = (Totals::new(), Totals::new());
    held_pushed.iter().for_each(|s| add_totals(&mut want, s));
    held.iter().for_each(|s| add_totals(&mut got, s));
    assert_eq!(small(&got), small(&want), "small processes' threads exact");
    let pooled = |s: &Slice| s.samples.iter().any(|r| r.pid != BIG && is_pool_tid(r.tid));
    assert!(!held.iter().any(pooled), "a small process was folded");
    // The crowd: folded into its pool in the older slices, its time exact.
    let crowd_pool = |s: &Slice| s.samples.iter().any(|r| r.pid == BIG && is_pool_tid(r.tid));
    assert!(held.iter().any(crowd_pool), "the crowd was never folded");
    let crowd_ns = |t: &Totals| -> u64 {
        t.iter()
            .filter(|((pid, _), _)| *pid == BIG)
            .map(|(_, v)| v.0.iter().sum::<u64>())
            .sum()
    };
    assert_eq!(crowd_ns(&got), crowd_ns(&want), "the crowd's time exact");
    let refs: Vec<&Slice> = held.iter().collect();
    assert_eq!(
        sample_ns(&refs),
        sample_ns(&held_pushed),
        "no sample time lost"
    );
    // What answers say: pools for the host and the crowd, threads for a
    // small process.
    let (snap, now) = (store.snapshot(), held.last().unwrap().end);
    let window = Window::last(RETENTION, now);
    let rows = |pid| -> Vec<&'static str> {
        let parts = snap.recorded_of(window, now, pid).resolution;
        parts.iter().map(|p| p.rows).collect()
    };
    assert!(rows(None).contains(&"pool"), "{:?}", rows(None));
    assert!(rows(Some(BIG)).contains(&"pool"), "{:?}", rows(Some(BIG)));
    let small = rows(Some(PIDS[0]));
    assert!(small.iter().all(|r| *r == "thread"), "{small:?}");
}
