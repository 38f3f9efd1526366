//! The findings over hand-built windows whose truth is known: a GIL held
//! by one thread, a pool of eight threads reading a slow socket.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::{behind_their_pools, host, seen::Seen, Ctx, Explanation, Finding, Kind};
use crate::profile::{
    model::{
        counters::{RawThread, ThreadCounters},
        live::LiveView,
        state::State,
        store::{Snapshot, Store},
        window::Window,
        KeptOff, Sample, Slice, ThreadInfo, GIL_FRAME,
    },
    report::{disclosure::Sight, host_facts::Empty, stuck::WaitFacts},
};

const PID: u32 = 70;
const SECONDS: u64 = 10;

/// A thread's second: ns by state, and the wakeups it received.
struct Thread {
    tid: u32,
    name: &'static str,
    ns: [u64; State::COUNT],
    wakeups: u64,
    /// Its stacked rows of the second: state, stack (outermost first),
    /// ns, count.
    rows: Vec<(State, Vec<&'static str>, u64, u64)>,
}

fn ns(cpu: u64, runq: u64, futex: u64, sleep: u64) -> [u64; State::COUNT] {
    let mut ns = [0; State::COUNT];
    ns[State::Cpu as usize] = cpu;
    ns[State::Runqueue as usize] = runq;
    ns[State::Futex as usize] = futex;
    ns[State::Sleep as usize] = sleep;
    ns
}

/// `SECONDS` one-second slices, each holding `threads`' second.
fn store(threads: &[Thread], end: SystemTime, change: impl Fn(&mut Slice)) -> Snapshot {
    let mut store = Store::new(Duration::from_secs(600));
    for i in 0..SECONDS {
        let mut slice = Slice::empty(
            end - Duration::from_secs(SECONDS - i),
            end - Duration::from_secs(SECONDS - i - 1),
        );
        slice.processes.insert(PID, Arc::from("svc"));
        for t in threads {
            slice.threads.insert(
                t.tid,
                ThreadInfo {
                    pid: PID,
                    name: Arc::from(t.name),
                },
            );
            slice.thread_totals.push(RawThread {
                tid: t.tid,
                pid: PID,
                comm: t.name.to_string(),
                counters: ThreadCounters {
                    ns: t.ns,
                    wakeups_received: t.wakeups,
                    ..Default::default()
                },
            });
            for (state, stack, ns, count) in &t.rows {
                let stack: Vec<Arc<str>> = stack.iter().map(|f| Arc::from(*f)).collect();
                slice.samples.push(Sample {
                    pid: PID,
                    tid: t.tid,
                    state: *state,
                    stack: stack.into(),
                    ns: *ns,
                    count: *count,
                });
            }
        }
        change(&mut slice);
        store.push(slice);
    }
    store.snapshot()
}

fn explain(threads: &[Thread]) -> Explanation {
    explain_with(threads, |_| {})
}

/// [`explain`] with each slice changed by `change` first.
fn explain_with(threads: &[Thread], change: impl Fn(&mut Slice)) -> Explanation {
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let store = store(threads, end, change);
    let window = Window::last(SECONDS, end);
    let seen = Seen::read(&store, PID, window).unwrap();
    explain_over(&seen, &store, window)
}

/// The explanation of `seen`, the daemon being pid 1, nothing blocked now.
fn explain_over(seen: &Seen, store: &Snapshot, window: Window) -> Explanation {
    let (live, facts, sight) = (LiveView::default(), WaitFacts::default(), Sight::all());
    super::explain(&Ctx {
        seen,
        store,
        host: &Empty,
        window,
        live: &live,
        facts: &facts,
        sight: &sight,
        now: window.until,
        own_pid: 1,
    })
}

const MS: u64 = 1_000_000;

#[test]
fn gil_contention_names_the_holder_and_its_frame() {
    let waiting = |tid, name| Thread {
        tid,
        name,
        // 700 ms of the second waiting for the GIL, 200 idle.
        ns: ns(100 * MS, 0, 700 * MS, 200 * MS),
        wakeups: 100,
        rows: vec![
            (
                State::Futex,
                vec![
                    "Thread.run (threading.py:1)_[py]",
                    "handle (svc.py:5)_[py]",
                    GIL_FRAME,
                ],
                700 * MS,
                100,
            ),
            (State::Cpu, vec!["handle (svc.py:5)_[py]"], 100 * MS, 10),
        ],
    };
    let mut threads: Vec<Thread> = (0..4).map(|i| waiting(80 + i, "request")).collect();
    threads.push(Thread {
        tid: 90,
        name: "background-loop",
        ns: ns(600 * MS, 400 * MS, 0, 0),
        wakeups: 0,
        rows: vec![(
            State::Cpu,
            vec![
                "Thread.run (threading.py:1)_[py]",
                "crunch (svc.py:20)_[py]",
            ],
            600 * MS,
            60,
        )],
    });
    let e = explain(&threads);
    let first = &e.findings[0];
    assert_eq!(first.kind, Kind::Gil, "{e:#?}");
    assert_eq!(first.numbers["waiting_threads"], 4);
    let share = first.numbers["wait_share"].as_f64().unwrap();
    assert!((share - 0.7).abs() < 0.01, "{share}");
    let holder = &first.numbers["holder"];
    assert_eq!(holder["tid"], 90);
    assert_eq!(holder["name"], "background-loop");
    assert_eq!(holder["frame"], "crunch (svc.py:20)");
    // 600 of the 1,000 ms of Python run per second.
    assert!((holder["held_share"].as_f64().unwrap() - 0.6).abs() < 0.01);
    assert!(first.headline.contains("background-loop") && first.headline.contains("crunch"));
    assert!(
        first.evidence.starts_with("/threads?pid=70&seconds=10"),
        "{}",
        first.evidence
    );
    assert_eq!(first.rank, 1);
    let text = super::text::render(&e);
    assert!(text.contains("1. [gil]"), "{text}");
}

#[test]
fn a_pool_in_one_socket_read_is_saturated_with_its_capacity() {
    // Eight threads, each 20 tasks a second: 45 ms in a socket read, 5 ms
    // on a CPU. Capacity: 8 / 50 ms = 160 tasks/s.
    let reading = vec![
        "Thread.run_[j]",
        "java.util.concurrent.ThreadPoolExecutor.runWorker_[j]",
        "Client.call_[j]",
        "java.net.Socket$SocketInputStream.read_[j]",
        "read",
        "[syscall read]",
    ];
    let threads: Vec<Thread> = (0..8)
        .map(|i| Thread {
            tid: 100 + i,
            name: [
                "pool-1-thread-1",
                "pool-1-thread-2",
                "pool-1-thread-3",
                "pool-1-thread-4",
                "pool-1-thread-5",
                "pool-1-thread-6",
                "pool-1-thread-7",
                "pool-1-thread-8",
            ][i as usize],
            ns: ns(100 * MS, 0, 0, 900 * MS),
            wakeups: 20,
            rows: vec![(State::Sleep, reading.clone(), 900 * MS, 20)],
        })
        .collect();
    let e = explain(&threads);
    let first = &e.findings[0];
    assert_eq!(first.kind, Kind::PoolSaturation, "{e:#?}");
    let n = &first.numbers;
    assert_eq!(n["pool"], "pool-1-thread-*");
    assert_eq!(n["threads"], 8);
    assert_eq!(n["threads_in_wait"], 8);
    assert_eq!(n["wait"]["frame"], "Client.call");
    assert_eq!(n["wait"]["object"], "socket");
    assert!(
        (n["capacity_per_s"].as_f64().unwrap() - 160.0).abs() < 1.0,
        "{n}"
    );
    assert!(
        (n["time_per_task_ms"].as_f64().unwrap() - 50.0).abs() < 0.5,
        "{n}"
    );
    assert!(
        (n["tasks_per_s"].as_f64().unwrap() - 160.0).abs() < 1.0,
        "{n}"
    );
    // The read itself is the next finding: the downstream.
    assert!(e.findings.iter().any(|f| f.kind == Kind::IoWait));
}

#[test]
fn threads_at_rest_are_no_finding_and_the_host_ranks_by_time_lost() {
    let idle = Thread {
        tid: 7,
        name: "idle",
        ns: ns(0, 0, 0, 1000 * MS),
        wakeups: 1,
        rows: vec![(
            State::Sleep,
            vec!["main", "[syscall clock_nanosleep]"],
            1000 * MS,
            1,
        )],
    };
    let e = explain(&[idle]);
    assert!(e.findings.is_empty(), "{e:#?}");
    assert!(e.note.is_some());
    assert_eq!(e.waiting_us, 0);

    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let starved = Thread {
        tid: 8,
        name: "starved",
        ns: ns(200 * MS, 800 * MS, 0, 0),
        wakeups: 0,
        rows: vec![],
    };
    let store = store(&[starved], end, |_| {});
    let window = Window::last(SECONDS, end);
    let ranked = host::waiting_by_pid(&store, window);
    assert_eq!(ranked.get(&PID), Some(&(8_000 * MS)));
    let h = host::explain_host(&store, window, ranked, 10, |seen| {
        explain_over(seen, &store, window)
    });
    assert_eq!(h.processes.len(), 1);
    assert_eq!(h.processes[0].details, "/explain?pid=70&seconds=10");
    let range = Window::between(
        SystemTime::UNIX_EPOCH + Duration::from_millis(1_500),
        SystemTime::UNIX_EPOCH + Duration::from_secs(3),
    );
    assert_eq!(super::window_query(&range), "from=1.500&until=3.000");
    let top = h.processes[0].top.as_ref().unwrap();
    assert_eq!(top.kind, Kind::RunqueueStarvation);
}

#[test]
fn runqueue_culprits_name_the_answering_daemon() {
    let starved = Thread {
        tid: 8,
        name: "starved",
        ns: ns(200 * MS, 800 * MS, 0, 0),
        wakeups: 0,
        rows: vec![],
    };
    // Pid 1 (the daemon in `explain`) ran 600 ms of the waits, pid 2 200.
    let e = explain_with(&[starved], |slice| {
        slice.processes.insert(1, Arc::from("wallscope"));
        slice.processes.insert(2, Arc::from("yes"));
        for (by, ms) in [(1, 600), (2, 200)] {
            slice.kept_off.push(KeptOff {
                pid: PID,
                tid: 8,
                by,
                ns: ms * MS,
            });
        }
    });
    let first = &e.findings[0];
    assert_eq!(first.kind, Kind::RunqueueStarvation, "{e:#?}");
    assert!((first.numbers["wait_share"].as_f64().unwrap() - 0.8).abs() < 0.01);
    let culprits = first.numbers["culprits"].as_array().unwrap();
    assert_eq!(culprits[0]["name"], "wallscope");
    assert_eq!(culprits[0]["answering_daemon"], true);
    assert_eq!(culprits[1]["answering_daemon"], false);
    assert!(
        first
            .headline
            .contains("wallscope (the daemon answering) 75 %"),
        "{}",
        first.headline
    );
    assert!(first.evidence.starts_with("/runqueue?pid=70&"));
}

#[test]
fn lock_waits_are_contention_at_their_frame() {
    let locking = |tid| Thread {
        tid,
        name: "worker",
        ns: ns(100 * MS, 0, 600 * MS, 300 * MS),
        wakeups: 50,
        rows: vec![
            (
                State::Futex,
                vec![
                    "main",
                    "update_ledger",
                    "pthread_mutex_lock",
                    "[syscall futex]",
                ],
                600 * MS,
                50,
            ),
            (
                State::Sleep,
                vec!["main", "[syscall clock_nanosleep]"],
                300 * MS,
                5,
            ),
        ],
    };
    let e = explain(&[locking(8), locking(9), locking(10)]);
    let lock = e
        .findings
        .iter()
        .find(|f| f.kind == Kind::LockContention)
        .unwrap_or_else(|| panic!("{e:#?}"));
    assert_eq!(lock.numbers["threads"], 3);
    assert!((lock.numbers["wait_share"].as_f64().unwrap() - 0.6).abs() < 0.01);
    assert!(
        lock.headline.contains("3 threads waited 18.0 s"),
        "{}",
        lock.headline
    );
    // The lock, not the naps: 18 s lost of 30.
    assert_eq!(e.waiting_us, 18_000_000);
}

/// A finding of `kind` with `score_us`, its wait `place` and its threads.
fn ranked_finding(kind: Kind, score_us: u64, place: &str, tids: &[u32]) -> Finding {
    let wait = serde_json::json!({"class": "io", "object": "socket", "frame": place});
    Finding::new(
        kind,
        score_us,
        String::new(),
        serde_json::json!({"wait": wait, "tids": tids}),
        String::new(),
    )
}

#[test]
fn a_wait_a_pool_is_made_of_follows_the_pool_even_when_it_scores_more() {
    let pool = ranked_finding(Kind::PoolSaturation, 79_100_000, "Client.call", &[1, 2, 3]);
    // The same socket read, its time measured a little over the pool's.
    let read = ranked_finding(Kind::IoWait, 79_400_000, "Client.call", &[1, 2]);
    // A read at another place, and one at the pool's place that a thread
    // outside the pool shares: neither is part of the pool.
    let other = ranked_finding(Kind::IoWait, 90_000_000, "Logger.flush", &[1]);
    let shared = ranked_finding(Kind::IoWait, 80_000_000, "Client.call", &[1, 9]);
    let small = ranked_finding(Kind::RunqueueStarvation, 1_000, "", &[]);
    let kinds = |v: Vec<Finding>| {
        v.into_iter()
            .map(|f| (f.kind, f.score_us))
            .collect::<Vec<_>>()
    };
    let out = behind_their_pools(vec![
        other.clone(),
        shared.clone(),
        read.clone(),
        pool.clone(),
        small.clone(),
    ]);
    assert_eq!(kinds(out), kinds(vec![other, shared, pool, read, small]));
}
