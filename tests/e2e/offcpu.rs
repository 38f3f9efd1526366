//! End-to-end tests of the off-CPU engine (root; under CI=true they fail
//! rather than skip). Tests run one at a time, but the host may be busy:
//! how much CPU a workload gets is not asserted on; what the daemon
//! reports is compared with the kernel's own account of each thread
//! (`support::kernel`).

use std::{collections::HashMap, thread};

use crate::support::{
    kernel::{accounts, assert_agrees, Account},
    *,
};
use serde_json::Value;

fn threads(pid: u32) -> Value {
    let (status, body) = get(&format!("{}/threads?pid={pid}&seconds=300", daemon()));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Panics unless `t`'s CPU and runqueue time agree with the kernel's
/// account of the thread (from the workload's `account` lines).
fn agrees_with_kernel(t: &Value, kernel: &HashMap<u64, Account>) {
    let tid = t["tid"].as_u64().unwrap();
    let k = kernel
        .get(&tid)
        .unwrap_or_else(|| panic!("no kernel account of {t}"));
    let wall = us(t, "wall_us");
    assert_agrees(
        &format!("cpu of {t}"),
        us(t, "cpu_us"),
        k.cpu_us,
        wall,
        0.03,
    );
    assert_agrees(
        &format!("runqueue of {t}"),
        us(t, "runqueue_us"),
        k.runqueue_us,
        wall,
        0.03,
    );
}

/// The state with the most time.
fn dominant(t: &Value) -> &'static str {
    ["cpu", "runqueue", "futex", "io", "sleep", "throttled"]
        .into_iter()
        .max_by(|a, b| us(t, &format!("{a}_us")).total_cmp(&us(t, &format!("{b}_us"))))
        .unwrap()
}

fn by_name(report: &Value, prefix: &str) -> Vec<Value> {
    let rows = report["threads"].as_array().unwrap();
    rows.iter()
        .filter(|t| t["name"].as_str().unwrap().starts_with(prefix))
        .cloned()
        .collect()
}

#[test]
fn mixed_threads_are_classified_and_add_up_to_their_lifetime() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    daemon();
    let (pid, out) = run_with_output("mixed", &["6"]);
    // `life <tid> <us>`: how long each thread really lived.
    let lives: HashMap<u64, f64> = out
        .lines()
        .filter_map(|l| l.strip_prefix("life "))
        .filter_map(|l| l.split_once(' '))
        .map(|(tid, us)| (tid.parse().unwrap(), us.parse().unwrap()))
        .collect();
    assert_eq!(lives.len(), 6, "{out}");
    let kernel = accounts(&out);
    assert_eq!(kernel.len(), 6, "{out}");
    let report = threads(pid);
    for (prefix, expected, count) in [
        ("lock-", "futex", 3),
        ("sleeper", "sleep", 1),
        ("reader", "sleep", 1),
        ("spinner", "cpu", 1),
    ] {
        let rows = by_name(&report, prefix);
        assert_eq!(rows.len(), count, "{prefix} threads in {report}");
        for t in rows {
            if expected == "cpu" {
                // A spinner on a busy host may wait for a CPU longer than
                // it runs: it is never off-CPU by its own doing.
                let on_or_ready = us(&t, "cpu_us") + us(&t, "runqueue_us");
                assert!(on_or_ready >= 0.9 * us(&t, "wall_us"), "{prefix}: {t}");
            } else {
                assert_eq!(dominant(&t), expected, "{prefix}: {t}");
            }
            agrees_with_kernel(&t, &kernel);
            let sum: f64 = ["cpu", "runqueue", "futex", "io", "sleep", "throttled"]
                .iter()
                .map(|s| us(&t, &format!("{s}_us")))
                .sum();
            assert!(
                (sum - us(&t, "wall_us")).abs() <= 5.0,
                "wall is the sum of states: {t}"
            );
            let lifetime_us = lives[&t["tid"].as_u64().unwrap()];
            assert!(
                (sum - lifetime_us).abs() <= 0.05 * lifetime_us,
                "{prefix}: {sum} us vs lifetime {lifetime_us} us: {t}"
            );
        }
    }
    blocked_intervals_and_wakers(&report, &kernel, pid);
    let (status, text) = get(&format!(
        "{}/threads?pid={pid}&seconds=300&format=text",
        daemon()
    ));
    assert_eq!(status, 200);
    assert!(
        text.contains("spinner") && text.contains("futex%"),
        "{text}"
    );
    assert!(
        text.contains("blocked intervals (switch-out to wakeup)") && text.contains("[timer] "),
        "{text}"
    );
}

/// Each blocking thread's intervals number its voluntary switches (the
/// kernel's count); the sleeper's last about its 20 ms nanosleep and a
/// timer ends them; the reader's pipe is written by the main thread.
fn blocked_intervals_and_wakers(report: &Value, kernel: &HashMap<u64, Account>, pid: u32) {
    for prefix in ["lock-", "sleeper", "reader"] {
        for t in by_name(report, prefix) {
            let s = &t["sleeps"];
            let intervals = s["intervals"].as_f64().unwrap_or(0.0);
            let voluntary = kernel[&t["tid"].as_u64().unwrap()].voluntary as f64;
            assert!(
                (intervals - voluntary).abs() <= 3.0_f64.max(0.05 * voluntary),
                "{prefix}: {intervals} blocked intervals, {voluntary} voluntary switches: {t}"
            );
        }
    }
    let sleeper = &by_name(report, "sleeper")[0]["sleeps"];
    let median_ms = sleeper["median_us"].as_f64().unwrap() / 1e3;
    assert!((10.0..=40.0).contains(&median_ms), "{sleeper}");
    let first = &sleeper["woken_by"][0];
    assert_eq!(first["by"], "[timer]", "{sleeper}");
    assert!(first["share"].as_f64().unwrap() >= 0.8, "{sleeper}");
    let reader = &by_name(report, "reader")[0]["sleeps"];
    let first = &reader["woken_by"][0];
    assert_eq!(first["by"], format!("mixed (tid {pid})"), "{reader}");
    assert!(first["share"].as_f64().unwrap() >= 0.8, "{reader}");
}

#[test]
fn wall_graph_widths_match_thread_wall_time() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    let pid = run("mixed", &["4"]);
    let report = threads(pid);
    let (status, body) = get(&format!(
        "{url}/folded?pid={pid}&seconds=300&kind=wall&group=thread"
    ));
    assert_eq!(status, 200, "{body}");
    let mut widths: HashMap<String, u64> = HashMap::new();
    for (stack, value) in parse_folded(&body) {
        assert!(
            stack[2].starts_with('[') && stack[2].ends_with(']'),
            "state frame under the thread: {stack:?}"
        );
        *widths.entry(stack[1].clone()).or_default() += value;
    }
    for t in report["threads"].as_array().unwrap() {
        let frame = format!("{} [tid {}]", t["name"].as_str().unwrap(), t["tid"]);
        let width = *widths
            .get(&frame)
            .unwrap_or_else(|| panic!("{frame} not in\n{body}")) as f64;
        let wall = us(t, "wall_us");
        // CPU stacks are samples (99 Hz): on a busy host a thread shares
        // each CPU's ticks with others, and its count is off by about its
        // square root; what they explain beyond the thread's exact CPU time
        // widens the graph. Allow three times that.
        let period_us = 1e6 / 99.0;
        let sampling_us = 3.0 * (us(t, "cpu_us") / period_us).sqrt() * period_us;
        assert!(
            (width - wall).abs() <= 0.03 * wall + sampling_us,
            "{frame}: graph {width} us vs /threads {wall} us"
        );
    }
    let (status, _) = get(&format!(
        "{url}/flamegraph?pid={pid}&seconds=300&kind=wall&group=thread"
    ));
    assert_eq!(status, 200);
}

#[test]
fn pinned_threads_starve_and_unpinned_ones_do_not() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    daemon();
    let cpus = thread::available_parallelism().unwrap().get().to_string();
    for (args, pinned) in [
        (vec!["4", "4", "0"], true),
        (vec![cpus.as_str(), "4"], false),
    ] {
        let (pid, out) = run_with_output("starve", &args);
        let kernel = accounts(&out);
        let report = threads(pid);
        let rows = by_name(&report, "cruncher");
        assert_eq!(rows.len(), kernel.len(), "{report}\n{out}");
        for t in &rows {
            // Four CPU-bound threads on one CPU run a quarter of the time
            // at most, however busy the host; unpinned ones wait for what
            // else runs here, which only the kernel can tell: the daemon
            // must neither miss that wait nor invent one.
            let share = us(t, "runqueue_us") / us(t, "wall_us");
            if pinned {
                assert!(share >= 0.6, "pinned: runqueue share {share:.2}: {t}");
            }
            agrees_with_kernel(t, &kernel);
        }
        let (status, body) = get(&format!("{}/runqueue?pid={pid}&seconds=300", daemon()));
        assert_eq!(status, 200, "{body}");
        let hist: Value = serde_json::from_str(&body).unwrap();
        // One wait ends each time the kernel puts a thread on a CPU (the
        // main thread's few waits come on top).
        let waits = hist["count"].as_u64().unwrap_or_else(|| panic!("{hist}")) as f64;
        let runs = kernel.values().map(|k| k.runs).sum::<u64>() as f64;
        assert!(
            (waits - runs).abs() <= 0.1 * runs + 50.0,
            "{waits} waits in /runqueue, the kernel put the crunchers on a CPU {runs} times"
        );
        if pinned {
            // Each wait lasts the other pinned threads' slices.
            let p90 = hist["p90_us"].as_f64().unwrap_or_else(|| panic!("{hist}"));
            assert!(p90 >= 1000.0, "pinned runqueue p90 {p90} us: {hist}");
        }
    }
}

#[test]
fn park_unpark_churn_shows_futex_wakeup_rate_and_waker_stacks() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    let (pid, out) = run_with_output("churn", &["4", "4"]);
    let kernel = accounts(&out);
    let report = threads(pid);
    let workers = by_name(&report, "pool-worker-");
    assert_eq!(workers.len(), 4, "{report}");
    for t in &workers {
        assert_eq!(dominant(t), "futex", "{t}");
        // Each time a worker blocked, a wakeup ended the block: the
        // kernel counted the blocks, however many the host allowed.
        let tid = t["tid"].as_u64().unwrap();
        let blocks = kernel[&tid].voluntary as f64;
        let woken = us(t, "wakeups_received");
        assert!(
            blocks >= 100.0 && (woken - blocks).abs() <= 0.1 * blocks + 5.0,
            "{woken} wakeups received, the kernel saw {blocks} blocks: {t}"
        );
    }
    let pool = &report["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == "pool-worker-*");
    assert_eq!(pool.unwrap()["threads"], 4, "{report}");

    let (status, body) = get(&format!("{url}/folded?pid={pid}&seconds=300&kind=wakeup"));
    assert_eq!(status, 200, "{body}");
    let rows = parse_folded(&body);
    let from_submit: u64 = rows
        .iter()
        .filter(|(s, _)| s[0] == "churn" && s.iter().any(|f| f == "submit_burst"))
        .filter(|(s, _)| s.last().unwrap().starts_with("[wakes pool-worker-"))
        .map(|r| r.1)
        .sum();
    let health = get(&format!("{url}/healthz")).1;
    assert!(
        from_submit > 0,
        "no wakeup stack through submit_burst:\n{body}\nhealthz: {health}"
    );

    let (status, body) = get(&format!(
        "{url}/folded?pid={pid}&seconds=300&kind=futex&group=pool"
    ));
    assert_eq!(status, 200, "{body}");
    assert!(
        body.lines().any(|l| l.starts_with("churn;pool-worker-*;")),
        "{body}"
    );
}
