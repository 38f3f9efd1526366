//! A cgroup's CPU quota, named (root; under CI=true these fail rather
//! than skip): a CPU-bound process in a cgroup the test makes with a quota
//! the test writes, beside a noisy neighbour outside it, and one more in
//! its own pid and mount namespaces (a container). The daemon must name
//! the cgroup by its path in the `cpu` controller's hierarchy (the v1
//! `cpu` one on hybrid hosts, else the unified one), with the quota the
//! test wrote, its members, and throttled time close to the kernel's own
//! `cpu.stat`, in `/runqueue`, `/runqueue?cgroup=all`, `/host` and
//! `/processes?group=cgroup`.
//!
//! Cgroup v2: where the `cpu` controller is in the unified hierarchy the
//! same test runs there (`cpu.max`). Where a v1 hierarchy holds it (this
//! CI host), no cgroup2 mount can have it: a controller is in one
//! hierarchy at a time, and moving it means unmounting the host's v1
//! `cpu` hierarchy under every other test; the v2 files are then covered
//! by `process::cpu_cgroup`'s unit tests on a fake tree.

use std::{
    fs,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::support::{
    cgroup::{cpu_hierarchy, QuotaCgroup, PERIOD_US},
    *,
};

/// `url`'s JSON answer; a request that got no answer (status 0: timed out
/// on a loaded daemon) is asked again, for up to a minute.
fn json(url: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut status, mut body) = get(url);
    while status == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        (status, body) = get(url);
    }
    assert_eq!(status, 200, "{url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{url}: {e}: {body}"))
}

/// The host pid of the one process `launcher` (an `unshare --fork`) forked.
fn forked_by(launcher: u32) -> u32 {
    let children = format!("/proc/{launcher}/task/{launcher}/children");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = fs::read_to_string(&children).unwrap_or_default();
        if let Some(pid) = text.split_whitespace().find_map(|p| p.parse().ok()) {
            return pid;
        }
        assert!(Instant::now() < deadline, "{launcher} forked nothing");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `/runqueue?pid=` until the daemon recorded at least `min_us` of
/// throttling for `pid` (a condition, not a fixed sleep).
fn wait_throttled(url: &str, pid: u32, min_us: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = get(&format!("{url}/runqueue?pid={pid}&seconds=30"));
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        if status == 200 && v["throttled"]["total_us"].as_u64().unwrap_or(0) >= min_us {
            return;
        }
        assert!(Instant::now() < deadline, "pid {pid} not throttled: {body}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The time `pid`'s threads waited runnable (throttled included), in us:
/// the kernel's schedstat.
fn run_delay_us(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
    let ns: u64 = stat
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    ns / 1000
}

/// What the daemon says of `pid`'s quota, checked against what the test
/// wrote and what the kernel counted (read just before and just after).
fn check_named(url: &str, group: &QuotaCgroup, quota_us: u64, pid: u32) {
    let (_, _, hierarchy) = cpu_hierarchy();
    let (before, periods_before) = (group.throttled_us(), group.stat("nr_throttled"));
    settle(url);
    let report = json(&format!("{url}/runqueue?pid={pid}&seconds=300"));
    let (after, periods_after) = (group.throttled_us(), group.stat("nr_throttled"));
    let by = &report["throttled_by"];
    assert_eq!(by["path"], group.path.as_str(), "{report}");
    assert_eq!(by["hierarchy"], hierarchy.as_str(), "{report}");
    assert_eq!(
        (by["quota_us"].as_u64(), by["period_us"].as_u64()),
        (Some(quota_us), Some(PERIOD_US)),
        "{report}"
    );
    assert_eq!(
        by["cpus"].as_f64(),
        Some(quota_us as f64 / PERIOD_US as f64)
    );
    assert!(
        by["members"].as_array().unwrap().contains(&pid.into()),
        "{report}"
    );
    // The kernel's counters, as the cgroup gives them.
    let kernel = by["kernel_throttled_us"].as_u64().unwrap();
    assert!(
        (before..=after).contains(&kernel),
        "{before}..{after}: {report}"
    );
    let periods = by["nr_throttled"].as_u64().unwrap();
    assert!(
        (periods_before..=periods_after).contains(&periods),
        "{periods_before}..{periods_after}: {report}"
    );
    // What the daemon saw throttled against cpu.stat: one thread, so the
    // kernel's per-CPU spans are about its own. The wait for a CPU after
    // a refill counts throttled too (no event marks the refill); on a
    // busy host that is more than cpu.stat's, but never more than all the
    // thread waited runnable (its schedstat run_delay, read after).
    let seen = by["throttled_us"].as_u64().unwrap() as f64;
    let waited_us = run_delay_us(pid) as f64;
    let most = (1.25 * after as f64).max(1.1 * waited_us) + 300_000.0;
    assert!(
        seen >= 0.75 * before as f64 && seen <= most,
        "daemon {seen} us throttled, cpu.stat {before}..{after} us, \
         waited runnable {waited_us} us: {report}"
    );
    // CPU held flat at the quota: never above it (with slack for the
    // window's edges), and well above nothing.
    let used = by["cpus_used"].as_f64().unwrap();
    let allowed = quota_us as f64 / PERIOD_US as f64;
    assert!(
        (0.5 * allowed..=1.3 * allowed).contains(&used),
        "{used} CPU used, {allowed} allowed: {report}"
    );
    let text = get(&format!("{url}/runqueue?pid={pid}&seconds=300&format=text")).1;
    let quota = format!(
        "{} ({hierarchy}) quota {:.1} ms / 100.0 ms",
        group.path,
        quota_us as f64 / 1e3
    );
    assert!(text.contains(&quota), "{quota} in {text}");
    // One call names it: `/explain` puts the quota first, with the path
    // and the quota the test wrote.
    let explained = json(&format!("{url}/explain?pid={pid}&seconds=300"));
    let first = &explained["findings"][0];
    assert_eq!(first["kind"], "cpu_quota", "{explained}");
    assert_eq!(first["numbers"]["path"], group.path.as_str(), "{explained}");
    assert_eq!(
        first["numbers"]["quota_us"].as_u64(),
        Some(quota_us),
        "{explained}"
    );
    assert!(
        first["headline"]
            .as_str()
            .unwrap()
            .contains(group.path.as_str()),
        "{explained}"
    );
    assert!(
        first["evidence"]
            .as_str()
            .unwrap()
            .starts_with("/runqueue?pid="),
        "{explained}"
    );
}

#[test]
fn a_quota_bound_cgroup_is_named_with_the_quota_it_was_given() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    settle(url);
    let spin = workload("cpu_shares").display().to_string();
    let (_, _, hierarchy) = cpu_hierarchy();

    // The workloads spin until dropped: the checks below may take a while
    // on a busy host, and members must still be there for them. The
    // window (300 s) holds the cgroups' whole life, as cpu.stat does.
    // The noisy neighbour: two busy threads outside any quota.
    let neighbour = Workload::start(&workload("cpu_shares"), &["300", "2"]);
    let plain = QuotaCgroup::create("plain", 20_000);
    let capped = plain.start(&format!("'{spin}' 300 1"));
    // A container: its own pid and mount namespaces, in its own cgroup.
    let boxed = QuotaCgroup::create("container", 30_000);
    let launcher = boxed.start(&format!(
        "unshare --pid --mount --fork --kill-child --mount-proc '{spin}' 300 1"
    ));
    let contained = forked_by(launcher.child.id());
    assert_ne!(
        contained, launcher.pid,
        "the ready line names the namespace's pid"
    );

    wait_throttled(url, capped.pid, 1_000_000);
    wait_throttled(url, contained, 1_000_000);
    check_named(url, &plain, 20_000, capped.pid);
    check_named(url, &boxed, 30_000, contained);

    // The neighbour's cgroup has no quota: nothing names one for it.
    let report = json(&format!("{url}/runqueue?pid={}&seconds=300", neighbour.pid));
    assert!(report.get("throttled_by").is_none(), "{report}");

    // Every cgroup: ours by path, hierarchy, quota and members.
    let all = json(&format!("{url}/runqueue?cgroup=all&seconds=300"));
    let row = all["cgroups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["path"] == plain.path.as_str())
        .unwrap_or_else(|| panic!("{} not listed: {all}", plain.path));
    assert_eq!(row["hierarchy"], hierarchy.as_str(), "{row}");
    assert_eq!(row["quota_us"], 20_000, "{row}");
    assert!(
        row["members"]
            .as_array()
            .unwrap()
            .contains(&capped.pid.into()),
        "{row}"
    );
    assert!(row["throttled_us"].as_u64().unwrap() > 0, "{row}");

    // The host names both.
    let host = json(&format!("{url}/host?seconds=300"));
    for group in [&plain, &boxed] {
        let named = host["throttled"].as_array().unwrap();
        assert!(
            named.iter().any(|t| t["path"] == group.path.as_str()),
            "{} in {host}",
            group.path
        );
    }

    // `cgroup=` takes the path shown.
    let by_path = json(&format!("{url}/runqueue?cgroup={}&seconds=300", plain.path));
    assert_eq!(
        by_path["throttled_by"]["path"],
        plain.path.as_str(),
        "{by_path}"
    );
    assert!(
        by_path["throttled"]["total_us"].as_u64().unwrap() > 0,
        "{by_path}"
    );

    // Grouped by the cgroup that limits CPU.
    let groups = json(&format!("{url}/processes?group=cgroup&seconds=300"));
    let group = groups
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == plain.path.as_str())
        .unwrap_or_else(|| panic!("no group {}: {groups}", plain.path));
    assert_eq!(group["pids"], serde_json::json!([capped.pid]), "{group}");

    // Workloads end before their cgroups go (the drops below, in order).
    drop((capped, launcher, neighbour));
}
