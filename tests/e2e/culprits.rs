//! Who kept a thread off the CPU (issue #28): a CPU-bound thread pinned
//! to CPU 0 shares it with a forking script's short-lived children, then
//! with a steady hog in another cgroup; `/runqueue?pid=` must name each as
//! the culprit of the victim's runqueue waits with the share the kernel's
//! account gives it: the culprit's CPU time on that CPU during the victim's
//! life over the victim's runqueue wait (both from the kernel), within 10
//! points. The host may be busy: its other work on CPU 0 is the rest of the
//! waits, on both sides.

use std::{thread, time::Duration};

use serde_json::Value;

use crate::support::{
    cgroup::{self, Cgroup},
    kernel::accounts,
    rows::json_at,
    run_with_output, settle, workload, Fixture, Workload,
};

/// The victim: one CPU-bound thread on CPU 0 for `seconds`.
fn victim(seconds: u32) -> Workload {
    Workload::start(&workload("starve"), &["1", &seconds.to_string(), "0"])
}

/// The victim's runqueue wait by the kernel, ns, from its account lines.
fn victim_wait_ns(out: &str) -> f64 {
    accounts(out).values().map(|a| a.runqueue_us * 1e3).sum()
}

/// The culprits `/runqueue?pid=` names for `pid`.
fn culprits(url: &str, pid: u32) -> Vec<Value> {
    let report = json_at(url, &format!("/runqueue?pid={pid}&seconds=300"));
    report["kept_off_cpu_by"]
        .as_array()
        .unwrap_or_else(|| panic!("no kept_off_cpu_by: {report}"))
        .clone()
}

/// CPU time of every thread of `pid` so far (schedstat), ns.
fn cpu_ns(pid: u32) -> f64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
                .filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok())
                .sum()
        })
        .unwrap_or(0.0)
}

fn check(what: &str, found: &Value, truth: f64, all: &[Value]) {
    let share = found["share"].as_f64().unwrap();
    eprintln!("{what}: share {share:.3} by the daemon, {truth:.3} by the kernel");
    assert!(
        (share - truth).abs() <= 0.10,
        "{what}: share {share:.3}, the kernel's account {truth:.3}: {all:#?}"
    );
    let total: f64 = all.iter().map(|c| c["share"].as_f64().unwrap()).sum();
    assert!(
        (total - 1.0).abs() <= 0.01,
        "shares add up to {total}: {all:#?}"
    );
}

#[test]
fn a_starved_thread_names_a_forking_script_and_a_hog_as_its_culprits() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = crate::support::daemon();
    settle(url);

    // A script forking 25 children a second on CPU 0, 30 ms of CPU each,
    // for 4 s inside the victim's 7 s.
    let v = victim(7);
    thread::sleep(Duration::from_millis(500));
    let (_, spawned) = run_with_output("spawner", &["25", "4", "30", "0"]);
    let children_ns: f64 = spawned
        .lines()
        .find_map(|l| l.strip_prefix("children_cpu_us "))
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no children account: {spawned}"))
        * 1e3;
    let (pid, out) = (v.pid, v.wait());
    settle(url);
    let all = culprits(url, pid);
    let children = all
        .iter()
        .find(|c| c["name"] == "spawner" && c["processes"].as_u64() >= Some(50))
        .unwrap_or_else(|| panic!("the spawner's children not named: {all:#?}"));
    check(
        "forking script",
        children,
        children_ns / victim_wait_ns(&out),
        &all,
    );

    // A steady hog on CPU 0 in a cgroup of its own.
    let (v2, _) = cgroup::mounts();
    let cg = Cgroup::create(&v2, "ws-test-culprit-hog");
    let bin = workload("starve");
    let hog = cgroup::start_command_in(&cg, &format!("'{}' 1 60 0", bin.display()));
    thread::sleep(Duration::from_millis(500));
    // The victim in a cgroup of its own too, for `/metrics`' pairs.
    let victim_cg = Cgroup::create(&v2, "ws-test-culprit-victim");
    let v = cgroup::start_command_in(&victim_cg, &format!("'{}' 1 4 0", bin.display()));
    let before = cpu_ns(hog.pid);
    let (pid, out) = (v.pid, v.wait());
    let hog_ns = cpu_ns(hog.pid) - before;
    settle(url);
    let all = culprits(url, pid);
    let by_hog = all
        .iter()
        .find(|c| {
            c["pids"]
                .as_array()
                .is_some_and(|p| p.contains(&hog.pid.into()))
        })
        .unwrap_or_else(|| panic!("the hog (pid {}) not named: {all:#?}", hog.pid));
    assert_eq!(
        by_hog["cgroup"].as_str(),
        Some("/ws-test-culprit-hog"),
        "{by_hog}"
    );
    let truth = hog_ns / victim_wait_ns(&out);
    check("hog", by_hog, truth, &all);
    starved_on_host(url, pid, victim_wait_ns(&out), hog.pid, truth);

    // `/metrics` sums the same waits by both cgroups: the victim's cgroup
    // holds all of its wait, and the hog's cgroup its share.
    let metrics = crate::support::get(&format!("{url}/metrics")).1;
    let pairs = kept_off_pairs(&metrics, "/ws-test-culprit-victim");
    let wait_s: f64 = pairs.iter().map(|p| p.1).sum();
    let hog_s = pairs
        .iter()
        .find(|p| p.0 == "/ws-test-culprit-hog")
        .map_or(0.0, |p| p.1);
    let kernel_wait_s = victim_wait_ns(&out) / 1e9;
    eprintln!("metrics: {pairs:?}; the kernel's wait {kernel_wait_s:.3} s");
    assert!(
        (wait_s - kernel_wait_s).abs() <= 0.1 * kernel_wait_s,
        "the victim cgroup's waits sum to {wait_s:.3} s, the kernel's {kernel_wait_s:.3}: {pairs:?}"
    );
    assert!(
        (hog_s / wait_s - truth).abs() <= 0.10,
        "the hog's cgroup kept {hog_s:.3} of {wait_s:.3} s, the kernel's share {truth:.3}: {pairs:?}"
    );
}

/// `/host` lists the victim among the processes that waited most for a
/// CPU, with the hog first among its culprits, unless at least as many
/// processes waited longer (a busy host).
fn starved_on_host(url: &str, victim: u32, wait_ns: f64, hog: u32, truth: f64) {
    let report = json_at(url, "/host?seconds=20");
    let starved = report["starved"].as_array().unwrap();
    let waits: Vec<f64> = starved
        .iter()
        .map(|s| s["runqueue_us"].as_f64().unwrap())
        .collect();
    assert!(waits.windows(2).all(|w| w[0] >= w[1]), "{report}");
    let Some(found) = starved.iter().find(|s| s["pid"] == victim) else {
        assert!(
            starved.len() == 5 && waits[4] >= 0.9 * wait_ns / 1e3,
            "the victim {victim} (waited {:.0} ms) not among those that waited most: {report}",
            wait_ns / 1e6
        );
        return;
    };
    let first = &found["kept_off_cpu_by"][0];
    assert!(
        first["pids"].as_array().unwrap().contains(&hog.into()),
        "{found}"
    );
    let share = first["share"].as_f64().unwrap();
    assert!((share - truth).abs() <= 0.10, "{share} vs {truth}: {found}");
}

/// `(by_cgroup, seconds)` of `wallscope_cgroup_kept_off_cpu_seconds_total`
/// for the waits of `cgroup`'s threads.
fn kept_off_pairs(metrics: &str, cgroup: &str) -> Vec<(String, f64)> {
    let prefix =
        format!("wallscope_cgroup_kept_off_cpu_seconds_total{{cgroup=\"{cgroup}\",by_cgroup=\"");
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (by, value) = rest.split_once("\"} ")?;
            Some((by.to_string(), value.parse().ok()?))
        })
        .collect()
}
