//! `/host` and `/processes`' headers (issue #28): the CPU count is the
//! kernel's, and the utilisation of a window agrees with `/proc/stat`'s
//! account of the same seconds (user + nice + system over all of it),
//! whatever else the host runs.

use std::{
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::support::{get, rows::json_at, settle, workload, Fixture, Workload};

/// Jiffies of all CPUs: (user + nice + system, every field but guest).
fn stat_busy_total() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let line = stat.lines().next().unwrap();
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is in user).
    (f[0] + f[1] + f[2], f[..8].iter().sum())
}

/// Sleeps until the next whole second; returns it (Unix seconds).
fn next_second() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let next = now.as_secs() + 1;
    thread::sleep(Duration::from_secs(next) - now);
    next
}

#[test]
fn host_cpu_count_and_utilisation_match_the_kernels_account() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = crate::support::daemon();
    // One CPU-bound thread, so that the window is not idle.
    // It starts more than a slice before the window and ends after it,
    // so it lives through every slice of the window.
    let hog = Workload::start(&workload("starve"), &["1", "15"]);
    thread::sleep(Duration::from_millis(1500));
    let from = next_second();
    let before = stat_busy_total();
    thread::sleep(Duration::from_secs(9));
    let until = next_second();
    let after = stat_busy_total();
    settle(url);
    let kernel = (after.0 - before.0) / (after.1 - before.1);

    let report = json_at(url, &format!("/host?from={from}&until={until}"));
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    let online = std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count() as u64;
    assert_eq!(report["cpus"].as_u64(), Some(online), "{report}");
    assert!(online >= cpus);
    let daemon = report["utilization"].as_f64().unwrap();
    eprintln!("utilisation {daemon:.3} by the daemon, {kernel:.3} by /proc/stat");
    assert!(
        (daemon - kernel).abs() <= 0.07,
        "utilisation {daemon:.3}, /proc/stat's {kernel:.3}: {report}"
    );
    let span_s = report["span_us"].as_f64().unwrap() / 1e6;
    let asked = (until - from) as f64;
    assert!(
        (span_s - asked).abs() <= 1.5,
        "span {span_s} s of {asked}: {report}"
    );

    // Window sums match the window: a thread that lived through it has
    // as much wall time as its slices span.
    let threads = json_at(
        url,
        &format!("/threads?pid={}&from={from}&until={until}", hog.pid),
    );
    let span_us = report["span_us"].as_f64().unwrap();
    for t in threads["threads"].as_array().unwrap() {
        let wall = t["wall_us"].as_f64().unwrap();
        assert!(
            (wall - span_us).abs() <= 0.005 * span_us,
            "thread {} has {wall} us of wall time in a window spanning {span_us}: {threads}",
            t["tid"]
        );
    }

    // `/processes` carries the same figures in its headers.
    let res = ureq::get(&format!("{url}/processes?from={from}&until={until}"))
        .call()
        .unwrap();
    assert_eq!(res.header("x-wallscope-cpus"), Some(&*online.to_string()));
    let header: f64 = res
        .header("x-wallscope-cpu-utilization")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(header, daemon);

    let (status, text) = get(&format!("{url}/host?from={from}&until={until}&format=text"));
    assert_eq!(status, 200, "{text}");
    assert!(
        text.starts_with("host, ") && text.contains(&format!(": {online} CPUs, ")),
        "{text}"
    );
    let (status, body) = get(&format!("{url}/host?seconds=x"));
    assert_eq!(status, 400, "{body}");
    drop(hog);
}
