use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::*;
use crate::profile::{
    model::{
        counters::{RawThread, ThreadCounters},
        state::State,
        store::Store,
        window::Window,
        Slice,
    },
    report::threads::{render_text, report},
};

const PID: u32 = 7;
const SLICES: u64 = 10;
const SHORT: u32 = 1000;

fn raw(tid: u32, name: &str, cpu_us: u64, futex_us: u64) -> RawThread {
    let mut ns = [0; State::COUNT];
    ns[State::Cpu as usize] = cpu_us * 1000;
    ns[State::Futex as usize] = futex_us * 1000;
    RawThread {
        tid,
        pid: PID,
        comm: name.into(),
        counters: ThreadCounters {
            ns,
            switches_voluntary: 2,
            switches_involuntary: 1,
            wakeups_sent: 1,
            wakeups_received: 3,
        },
    }
}

/// Short-lived thread `n` (1..=1000): lives in slice `n % 10` only, for
/// `n % 97 + 1` ms of CPU and 100 ms of futex.
fn short(n: u32) -> RawThread {
    raw(
        1000 + n,
        &format!("pool-1-thread-{n}"),
        u64::from(n % 97 + 1) * 1000,
        100_000,
    )
}

/// Ten 1 s slices ending at 100 s: three threads live through all of
/// them, 1,000 `pool-1-thread-N` one slice each, and one `lonely-1`
/// lives in slice 4 only.
fn store() -> (Store, Window) {
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
    let mut store = Store::new(Duration::from_secs(600));
    for i in 0..SLICES {
        let at = end - Duration::from_secs(SLICES - 1 - i);
        let mut slice = Slice::empty(at - Duration::from_secs(1), at);
        slice.processes.insert(PID, Arc::from("java"));
        for (tid, name) in [(PID, "main"), (8, "VM Thread"), (9, "worker-1")] {
            slice.thread_totals.push(raw(tid, name, 500_000, 500_000));
        }
        let mine = (1..=SHORT).filter(|n| u64::from(n % SLICES as u32) == i);
        slice.thread_totals.extend(mine.map(short));
        if i == 4 {
            slice.thread_totals.push(raw(50, "lonely-1", 10, 10));
        }
        // A fixed pool started 2.5 s after the process: it lives on.
        if i >= 2 {
            let part = if i == 2 { 250_000 } else { 500_000 };
            for n in 1..=4 {
                let name = format!("fixed-{n}");
                slice.thread_totals.push(raw(60 + n, &name, part, part));
            }
        }
        store.push(slice);
    }
    (store, Window::last(30, end))
}

#[test]
fn a_thousand_short_lived_threads_of_a_pool_are_one_row() {
    let (store, window) = store();
    let unfolded = report(&store.snapshot(), PID, window).unwrap();
    assert_eq!(unfolded.threads.len(), 1008);
    let mut r = unfolded.clone();
    fold(&mut r);
    let kept: Vec<&str> = r.threads.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(kept[..3], ["main", "VM Thread", "worker-1"]);
    assert_eq!(kept[3..7], ["fixed-1", "fixed-2", "fixed-3", "fixed-4"]);
    assert_eq!(kept[7..], ["lonely-1"], "a pool of one is no pool");
    assert_eq!(r.folded.len(), 1);
    let f = &r.folded[0];
    assert_eq!((f.pool.as_str(), f.threads), ("pool-1-thread-*", 1000));
    assert_eq!(f.tids, [1001, 1002, 1003, 1004, 1005]);
    // The row's figures are the sums of its threads' rows unfolded.
    let parts: Vec<&ThreadRow> = unfolded
        .threads
        .iter()
        .filter(|t| t.name.starts_with("pool-1-thread-"))
        .collect();
    let sum = |field: fn(&Breakdown) -> u64| parts.iter().map(|t| field(&t.time)).sum::<u64>();
    assert_eq!(f.time.cpu_us, sum(|t| t.cpu_us));
    assert_eq!(f.time.futex_us, sum(|t| t.futex_us));
    assert_eq!(f.time.wall_us, sum(|t| t.wall_us));
    assert_eq!(f.time.switches, sum(|t| t.switches));
    assert_eq!(f.time.wakeups_received, sum(|t| t.wakeups_received));
    assert_eq!(f.time.futex_us, 1000 * 100_000);
    // Nothing is lost: threads and folded rows add up to the process.
    let wall: u64 = r.threads.iter().map(|t| t.time.wall_us).sum::<u64>() + f.time.wall_us;
    assert_eq!(wall, r.process.wall_us);
    // Lifetimes: 100 ms of futex and 1..=97 ms of CPU each.
    let lives = f.lifetime_ms;
    assert_eq!((lives.min, lives.max), (101.0, 197.0));
    assert!((101.0..=197.0).contains(&lives.p50), "{lives:?}");
    // Each started within the 10 s seen (in its slice, it lived less).
    assert_eq!(f.births_per_s, 100.0);
    let json = serde_json::to_value(&r).unwrap();
    let row = &json["folded"][0];
    assert_eq!(row["threads"], 1000);
    assert_eq!(row["tids"].as_array().unwrap().len(), LISTED_TIDS);
    assert_eq!(row["lifetime_ms"]["max"], 197.0);
    assert_eq!(row["futex_us"], 100_000_000);
}

#[test]
fn the_folded_text_answer_is_short() {
    let (store, window) = store();
    let mut r = report(&store.snapshot(), PID, window).unwrap();
    let all = render_text(&r).lines().count();
    fold(&mut r);
    let text = render_text(&r);
    assert!(all > 1000, "{all}");
    assert!(text.lines().count() < 25, "{text}");
    let row = text.lines().find(|l| l.contains("pool-1-thread-* ×1000"));
    assert!(
        row.is_some_and(|l| l.trim_start().starts_with("folded")),
        "{text}"
    );
    let lives = text
        .lines()
        .skip_while(|l| !l.starts_with("\nshort") && !l.starts_with("short"));
    let lives: Vec<&str> = lives.collect();
    assert!(lives[0].contains("short-lived threads (1000"), "{text}");
    assert!(
        lives[2].contains("101 ms") && lives[2].contains("197 ms") && lives[2].contains("100.00"),
        "{text}"
    );
    assert!(lives[2].ends_with("1001,1002,1003,1004,1005,…"), "{text}");
}

#[test]
fn long_lived_threads_and_merged_rows_keep_their_rows() {
    let (store, window) = store();
    let mut r = report(&store.snapshot(), PID, window).unwrap();
    // A row the store folded already stands for many threads.
    let pool_row = r.threads.iter_mut().find(|t| t.tid == 1001).unwrap();
    pool_row.tid = crate::profile::model::store::merge::POOL_TID | 5;
    fold(&mut r);
    assert_eq!(r.folded[0].threads, 999);
    assert!(r.threads.iter().any(|t| t.tid & 0xC000_0000 != 0));
    // A window of one slice: the threads that lived part of it fold.
    let one = Window::last(1, SystemTime::UNIX_EPOCH + Duration::from_secs(100));
    let mut r = report(&store.snapshot(), PID, one).unwrap();
    fold(&mut r);
    assert_eq!(
        (r.folded[0].threads, r.folded[0].births_per_s),
        (100, 100.0)
    );
    assert_eq!(r.threads.len(), 7);
}
