//! Goldens of wallscope's own text formats, in-process over a synthetic
//! store (no root, no BPF): `/threads?format=text`, `/runqueue?format=text`
//! and `/metrics` (its families, HELP, TYPE and label sets; values that
//! vary are masked). `BLESS=1` rewrites them (`just bless`).

use std::{
    collections::HashMap,
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::support::api::call_on;
use wallscope::{
    api,
    profile::model::state::{Hist, State, HIST_SLOTS, INTERRUPT_TID},
    profile::model::{
        counters::{RawThread, ThreadCounters},
        HistOwner,
    },
    profile::model::{store::Store, Interrupt, Sample, Slice, Stack, ThreadInfo, Wakeup},
    state::Shared,
};

/// A JVM-like `java` process with a throttled pool.
const PID: u32 = 4_194_300;
/// A cgroup id no cgroup2 mount will have: it stays unresolved.
const CAPPED: u64 = u64::MAX - 7;
const MS: u64 = 1_000_000;

fn stack(names: &[&str]) -> Stack {
    names.iter().map(|n| Arc::<str>::from(*n)).collect()
}

fn hist(slots: &[(usize, u64)], ns: u64) -> Hist {
    let mut h = Hist {
        slots: [0; HIST_SLOTS],
        ns,
    };
    for &(slot, n) in slots {
        h.slots[slot] = n;
    }
    h
}

/// Two slices, 3 s and 1 s old: `main` (tid PID) sleeps, `worker-1` runs,
/// is throttled and waits on a futex, woken by `main`, a network softirq
/// and a timer interrupt; `worker-2` waits for the CPU. With the time the
/// slices are aged from, which the queries pin their window to: the text
/// formats print durations, never the clock.
fn app() -> (axum::Router, SystemTime) {
    let [main, w1, w2] = [PID, PID + 1, PID + 2];
    let sample = |tid, state, frames: &[&str], ns| Sample {
        pid: PID,
        tid,
        state,
        stack: stack(frames),
        ns,
        count: 1,
    };
    let wakeup = |pid, tid, interrupt, frames: &[&str]| Wakeup {
        pid,
        tid,
        interrupt,
        peer_pid: PID,
        peer_tid: w1,
        stack: stack(frames),
        ns: 10 * MS,
        count: 2,
    };
    let total = |tid, comm: &str, by_state: &[(State, u64)]| {
        let mut ns = [0; State::COUNT];
        for &(state, n) in by_state {
            ns[state as usize] = n;
        }
        RawThread {
            tid,
            pid: PID,
            comm: comm.into(),
            counters: ThreadCounters {
                ns,
                switches_voluntary: 5,
                switches_involuntary: 1,
                wakeups_sent: 0,
                wakeups_received: 6,
            },
        }
    };
    let name = |name: &str| ThreadInfo {
        pid: PID,
        name: Arc::from(name),
    };
    let now = SystemTime::now();
    let mut store = Store::new(Duration::from_secs(600));
    for age in [3, 1] {
        store.push(Slice {
            start: now - Duration::from_secs(age + 1),
            end: now - Duration::from_secs(age),
            samples: vec![
                sample(
                    main,
                    State::Sleep,
                    &["main", "[syscall nanosleep]"],
                    900 * MS,
                ),
                sample(w1, State::Cpu, &["run", "compute"], 100 * MS),
                sample(w1, State::Throttled, &["run", "compute"], 200 * MS),
                sample(
                    w1,
                    State::Futex,
                    &["run", "park", "[syscall futex]"],
                    600 * MS,
                ),
                sample(w2, State::Runqueue, &["run", "compute"], 400 * MS),
            ],
            wakeups: vec![
                wakeup(PID, main, None, &["main", "unpark"]),
                wakeup(
                    0,
                    INTERRUPT_TID,
                    Some(Interrupt::Soft),
                    &[
                        "handle_softirqs_[k]",
                        "net_rx_action_[k]",
                        "try_to_wake_up_[k]",
                    ],
                ),
                wakeup(
                    0,
                    INTERRUPT_TID,
                    Some(Interrupt::Hard),
                    &["hrtimer_interrupt_[k]", "hrtimer_wakeup_[k]"],
                ),
            ],
            threads: HashMap::from([
                (main, name("main")),
                (w1, name("worker-1")),
                (w2, name("worker-2")),
            ]),
            thread_totals: vec![
                total(main, "main", &[(State::Sleep, 900 * MS), (State::Cpu, MS)]),
                total(
                    w1,
                    "worker-1",
                    &[
                        (State::Cpu, 100 * MS),
                        (State::Throttled, 300 * MS),
                        (State::Futex, 600 * MS),
                    ],
                ),
                total(
                    w2,
                    "worker-2",
                    &[(State::Runqueue, 400 * MS), (State::Cpu, 500 * MS)],
                ),
            ],
            runq_hists: vec![
                (HistOwner::Process(PID), hist(&[(0, 2), (3, 5), (10, 1)], 0)),
                (HistOwner::ProcessThrottled(PID), hist(&[(15, 3)], 300 * MS)),
                (HistOwner::Cgroup(CAPPED), hist(&[(3, 4)], 20_000)),
                (
                    HistOwner::CgroupThrottled(CAPPED),
                    hist(&[(15, 3)], 300 * MS),
                ),
            ],
            processes: HashMap::from([(PID, Arc::from("java")), (0, Arc::from("swapper/0"))]),
            containers: HashMap::new(),
            origins: HashMap::new(),
            kept_off: Vec::new(),
            sleeps: Vec::new(),
            stats: [0; wallscope::profile::model::state::STAT_COUNTERS],
            spans: Default::default(),
        });
    }
    let shared = Shared::new(store, vec![("on_cpu_sample".into(), 2)]);
    {
        let mut health = shared.health.lock().unwrap();
        health.drains = 5;
        health.last_drain_us = 1500;
    }
    (api::router(shared), now)
}

/// The body of GET `path?query` on [`app`], `query` ending in a window of
/// the last `seconds` before the store's time.
async fn ok(path: &str, query: &str, seconds: u64) -> String {
    // The last `seconds` (ending at the newest slice): titles say so, with
    // no date in them.
    let (app, _) = app();
    let uri = format!("{path}?{query}seconds={seconds}");
    let (status, _, body) = call_on(app, &uri).await;
    assert_eq!(status, 200, "{uri}: {body}");
    body
}

/// Compares `actual` with `tests/golden/NAME`, showing the lines that
/// differ; `BLESS=1` rewrites the file instead.
fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with BLESS=1 to create it)", path.display()));
    if actual != expected {
        panic!(
            "{} differs (BLESS=1 rewrites it after an intended change):\n{}",
            path.display(),
            line_diff(&expected, actual)
        );
    }
}

/// The lines of `expected` and `actual` that differ, by line number.
fn line_diff(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let mut out = String::new();
    for i in 0..e.len().max(a.len()) {
        let (x, y) = (e.get(i), a.get(i));
        if x != y {
            out += &format!(
                "{:4} - {}\n     + {}\n",
                i + 1,
                x.unwrap_or(&""),
                y.unwrap_or(&"")
            );
        }
    }
    out
}

/// `/metrics` with each sample's value masked: what a dashboard relies
/// on (families, HELP, TYPE, label names and the synthetic label values)
/// without the numbers that depend on the host or the clock.
fn masked_metrics(text: &str) -> String {
    text.lines()
        .map(|line| {
            if line.starts_with('#') || line.is_empty() {
                return line.to_string();
            }
            let (series, _value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad sample line {line:?}"));
            format!("{series} <v>")
        })
        .map(|l| l + "\n")
        .collect()
}

#[tokio::test]
async fn threads_text_matches_golden() {
    golden(
        "threads.txt",
        &ok("/threads", &format!("pid={PID}&format=text&"), 60).await,
    );
}

#[tokio::test]
async fn runqueue_text_matches_golden() {
    golden(
        "runqueue.txt",
        &ok("/runqueue", &format!("pid={PID}&format=text&"), 60).await,
    );
}

#[tokio::test]
async fn explain_text_matches_golden() {
    golden(
        "explain.txt",
        &ok("/explain", &format!("pid={PID}&format=text&"), 60).await,
    );
}

#[tokio::test]
async fn metrics_families_and_labels_match_golden() {
    let (app, _) = app();
    let (status, _, text) = call_on(app, "/metrics").await;
    assert_eq!(status, 200, "{text}");
    // Still what Prometheus parses: the masking hides no malformed value.
    let lines = text.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("/metrics parses");
    golden("metrics.txt", &masked_metrics(&text));
}
