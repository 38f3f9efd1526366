//! A lock that hangs, queried while it hangs (root; under CI=true these
//! fail rather than skip): nothing has ended, yet every window holds every
//! thread's time, by state, with the stacks that explain it.

use std::{
    collections::HashMap,
    io::BufRead,
    thread,
    time::{Duration, Instant, SystemTime},
};

use crate::support::{kernel::threads_now, *};
use serde_json::Value;

/// The states of `/threads`, as their JSON field prefixes.
const STATES: [&str; 6] = ["cpu", "runqueue", "throttled", "futex", "io", "sleep"];

/// `/threads` rows of `pid` over the last `seconds`, by tid.
fn thread_rows(url: &str, pid: u32, seconds: u64) -> HashMap<u64, Value> {
    let (status, body) = get(&format!("{url}/threads?pid={pid}&seconds={seconds}"));
    assert_eq!(status, 200, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["tid"].as_u64().unwrap(), t.clone()))
        .collect()
}

/// Panics unless every thread's states add up to its wall time, and every
/// wall time is the window's (all these threads lived through it) within
/// 2 % and the drain's edges.
fn add_up_to_the_window(url: &str, rows: &HashMap<u64, Value>, seconds: u64) {
    // A thread's time is cut at each window edge where the drain's task
    // iterator visited it, not at the flip the window's edges are: up to
    // a drain's length apart at each end.
    let max_drain_us = crate::support::rows::json_at(url, "/healthz")["pipeline"]["max_drain_us"]
        .as_f64()
        .unwrap_or(0.0);
    let window_us = rows.values().map(|t| us(t, "wall_us")).fold(0.0, f64::max);
    // The window is made of whole drains (about a second each).
    let want = seconds as f64 * 1e6;
    assert!(
        window_us >= 0.97 * want && window_us <= want + 1.6e6,
        "a {seconds} s window of {window_us} us: {rows:?}"
    );
    for t in rows.values() {
        let sum: f64 = STATES.iter().map(|s| us(t, &format!("{s}_us"))).sum();
        assert!(
            (sum - us(t, "wall_us")).abs() <= 5.0,
            "states add up to wall: {t}"
        );
        assert!(
            (sum - window_us).abs() <= 0.02 * window_us + 2.0 * max_drain_us,
            "{} of a {window_us} us window: {t}",
            sum
        );
    }
}

/// Starts `hung SECONDS`; returns it with the holder's and waiters' tids
/// once all are in place.
fn start_hung(seconds: &str) -> (Workload, u64, Vec<u64>, Instant) {
    let mut w = Workload::start(&workload("hung"), &[seconds]);
    let (mut holder, mut waiters) = (0, Vec::new());
    let out = w.stdout();
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "hung ended early");
        match line.trim().split_once(' ') {
            Some(("holder", tid)) => holder = tid.parse().unwrap(),
            Some(("waiter", tid)) => waiters.push(tid.parse().unwrap()),
            _ if line.trim() == "placed" => break,
            _ => {}
        }
    }
    assert!(holder != 0 && waiters.len() == 4);
    (w, holder, waiters, Instant::now())
}

#[test]
fn a_hung_lock_is_visible_while_it_hangs() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    settle(url);
    let (w, holder, waiters, placed) = start_hung("60");
    let placed_at = SystemTime::now() - placed.elapsed();
    let pid = w.pid;
    // The kernel's account at the 30 s window's start and end.
    thread::sleep(Duration::from_secs(10).saturating_sub(placed.elapsed()));
    let before = threads_now(pid, "");
    thread::sleep(Duration::from_secs(40).saturating_sub(placed.elapsed()));
    let after = threads_now(pid, "");
    settle(url);

    let rows = thread_rows(url, pid, 30);
    add_up_to_the_window(url, &rows, 30);
    let share = |tid: u64, state: &str| {
        let t = &rows[&tid];
        us(t, &format!("{state}_us")) / us(t, "wall_us")
    };
    for &tid in &waiters {
        assert!(share(tid, "futex") >= 0.9, "waiter {tid}: {}", rows[&tid]);
    }
    assert!(share(holder, "sleep") >= 0.9, "holder: {}", rows[&holder]);
    // A shorter window, in which none of them woke either.
    add_up_to_the_window(url, &thread_rows(url, pid, 5), 5);

    // Shares agree with the kernel's account over the same 30 s.
    let span_us = 30e6;
    for (tid, a) in &after {
        let (Some(b), Some(t)) = (before.get(tid), rows.get(tid)) else {
            continue;
        };
        let wall = us(t, "wall_us");
        let cpu = (a.cpu_us - b.cpu_us) / span_us;
        let waiting = (a.runqueue_us - b.runqueue_us) / span_us;
        let ours_waiting = (us(t, "runqueue_us") + us(t, "throttled_us")) / wall;
        assert!(
            (us(t, "cpu_us") / wall - cpu).abs() <= 0.05,
            "cpu share of {t} vs kernel {cpu:.3}"
        );
        assert!(
            (ours_waiting - waiting).abs() <= 0.05,
            "runqueue share of {t} vs kernel {waiting:.3}"
        );
    }

    // The off-CPU flame graph names what they are stuck in.
    let (rows, body) = folded_rows(&format!("pid={pid}&kind=offcpu&seconds=30"));
    assert!(share_of(&rows, "waiter_wants_lock") >= 0.5, "{body}");
    assert!(share_of(&rows, "holder_reads_pipe") > 0.1, "{body}");

    blocked_lists_them(url, pid, holder, &waiters, placed_at);
    drop(w);
}

/// `/blocked` lists the holder and the four waiters, longest first, with
/// how long they have been blocked (within 1 s) and their stacks.
fn blocked_lists_them(url: &str, pid: u32, holder: u64, waiters: &[u64], placed: SystemTime) {
    let (status, body) = get(&format!("{url}/blocked?pid={pid}&min_seconds=1"));
    assert_eq!(status, 200, "{body}");
    let view: Value = serde_json::from_str(&body).unwrap();
    let threads = view["threads"]
        .as_array()
        .unwrap_or_else(|| panic!("{view}"));
    let by_tid: HashMap<u64, &Value> = threads
        .iter()
        .map(|t| (t["tid"].as_u64().unwrap(), t))
        .collect();
    // The truth as of the view: they blocked as the workload said `placed`.
    let as_of = view["as_of"].as_str().unwrap_or_else(|| panic!("{view}"));
    let as_of: SystemTime = humantime::parse_rfc3339(as_of).unwrap();
    let truth = as_of.duration_since(placed).unwrap().as_secs_f64();
    for (&tid, state, function) in std::iter::once((&holder, "sleep", "holder_reads_pipe"))
        .chain(waiters.iter().map(|t| (t, "futex", "waiter_wants_lock")))
    {
        let t = by_tid
            .get(&tid)
            .unwrap_or_else(|| panic!("{tid} not in {view}"));
        assert_eq!(t["state"], state, "{t}");
        let blocked = t["in_state_s"].as_f64().unwrap();
        assert!(
            (blocked - truth).abs() <= 1.0,
            "{tid} blocked {blocked} s, truth {truth} s: {t}"
        );
        let stack = t["stack"].to_string();
        assert!(stack.contains(function), "{function} in {t}");
    }
    let lengths: Vec<f64> = threads
        .iter()
        .map(|t| t["in_state_s"].as_f64().unwrap())
        .collect();
    assert!(
        lengths.windows(2).all(|w| w[0] >= w[1]),
        "longest first: {view}"
    );
}

#[test]
fn threads_fill_every_window_they_lived_through() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    settle(url);
    let w = Workload::start(&workload("mixed"), &["14"]);
    let pid = w.pid;
    thread::sleep(Duration::from_secs(10));
    settle(url);
    // Windows inside the run: every thread lived through them, sleepers
    // that never woke in the shorter one included.
    for seconds in [2, 5, 8] {
        add_up_to_the_window(url, &thread_rows(url, pid, seconds), seconds);
    }
    every_second_is_whole(url, pid, 8);
    w.wait();
}

/// Panics unless, in each of the last `seconds` one-second columns of
/// `/timeline`, every thread's states add up to the same time (all lived
/// through them) within 0.5 % and the drain's edges. A single event
/// the programs missed (a switch-in or wakeup some contexts never show
/// them) would drop a whole sleep from one column: 20 ms of the sleeper's,
/// 50 ms of a lock holder's.
fn every_second_is_whole(url: &str, pid: u32, seconds: u64) {
    let max_drain_ms = crate::support::rows::json_at(url, "/healthz")["pipeline"]["max_drain_us"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e3;
    let timeline =
        crate::support::rows::json_at(url, &format!("/timeline?pid={pid}&seconds={seconds}"));
    let columns = timeline["columns"].as_array().unwrap();
    let rows = timeline["rows"].as_array().unwrap();
    assert!(columns.len() as u64 >= seconds - 1, "{timeline}");
    // Cells are whole milliseconds, each state rounded down. A column holds
    // the drains that ended in it, so its time is the longest thread's
    // (all lived through it), not its width.
    let rounding = STATES.len() as f64;
    let sum_at = |row: &Value, i: usize| -> f64 {
        row["cells"][i]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .sum()
    };
    for (i, column) in columns.iter().enumerate() {
        let width = rows.iter().map(|r| sum_at(r, i)).fold(0.0, f64::max);
        for row in rows {
            let sum = sum_at(row, i);
            assert!(
                (sum - width).abs() <= 0.005 * width + rounding + 2.0 * max_drain_ms,
                "{sum} ms of a {width} ms column {i} ({column}): {row}"
            );
        }
    }
}
