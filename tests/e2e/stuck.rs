//! Stuck pools named in `/blocked` (issue #28): a lock-order deadlock
//! between two C pools is found as a cycle of mutex owners (certain), and a
//! Java pool deadlocked on itself as every thread of the pool waiting in
//! `FutureTask.get` inside its own tasks (inferred); pools at rest, waiting
//! for work, are never flagged. Each within [`WITHIN`] of the deadlock.

use std::{
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::support::{
    daemon,
    java::{JavaRun, Jdk},
    rows::json_at,
    workload, Fixture, Workload,
};

/// How soon a deadlock must be flagged, from the moment it is in place.
const WITHIN: Duration = Duration::from_secs(10);

/// `/blocked` of `pid` once it holds a finding that names `what` (a kind
/// or a pool), and how long that took; the last answer if it never did
/// within [`WITHIN`] (plus the one second a thread must have been blocked
/// to be listed).
fn flagged(url: &str, pid: u32, what: &str) -> (Value, Option<Duration>) {
    let started = Instant::now();
    let deadline = started + WITHIN + Duration::from_secs(1);
    loop {
        let report = json_at(url, &format!("/blocked?pid={pid}"));
        let found = report["findings"].as_array().is_some_and(|f| {
            f.iter()
                .any(|f| f["kind"] == what || f["pools"].to_string().contains(what))
        });
        if found || Instant::now() > deadline {
            return (report, found.then(|| started.elapsed()));
        }
        thread::sleep(Duration::from_millis(250));
    }
}

fn findings<'a>(report: &'a Value, kind: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .collect()
}

/// No finding names a pool of `prefix`: it is at rest.
fn not_flagged(report: &Value, prefix: &str) {
    for f in report["findings"].as_array().unwrap() {
        assert!(
            !f["pools"].to_string().contains(prefix),
            "a pool at rest flagged: {f}"
        );
    }
}

#[test]
fn a_lock_order_deadlock_between_two_pools_is_a_certain_cycle() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    let w = Workload::start(&workload("lockorder"), &[]);
    let (report, took) = flagged(url, w.pid, "lock_cycle");
    assert!(
        took.is_some(),
        "no lock cycle within {WITHIN:?}: {report:#}"
    );
    eprintln!("lock cycle flagged after {took:.1?}");
    let cycle = findings(&report, "lock_cycle")[0];
    assert_eq!(cycle["certainty"], "certain", "{cycle}");
    assert_eq!(
        cycle["pools"],
        serde_json::json!(["alpha-*", "beta-*"]),
        "{cycle}"
    );
    let summary = cycle["summary"].as_str().unwrap();
    assert!(
        summary.contains("pthread_mutex_lock in take_in_order"),
        "the frames where they wait: {summary}"
    );
    // Each waits for the other: the owners are the two threads.
    let threads = report["threads"].as_array().unwrap();
    let owner_of = |name: &str| {
        let t = threads.iter().find(|t| t["name"] == name).unwrap();
        (t["tid"].as_u64(), t["waits_for_tid"].as_u64())
    };
    let (alpha, alpha_waits) = owner_of("alpha-1");
    let (beta, beta_waits) = owner_of("beta-1");
    assert_eq!((alpha_waits, beta_waits), (beta, alpha), "{report:#}");
    not_flagged(&report, "idle-");
}

#[test]
fn a_java_pool_deadlocked_on_itself_is_named_with_its_frames() {
    let Some(_fx) = Fixture::ebpf_serial().filter(|_| Jdk::Default.available()) else {
        return;
    };
    let url = daemon();
    let jvm = JavaRun::default().start("PoolDeadlock", &["300", "2"]);
    let (report, took) = flagged(url, jvm.pid, "pricing-*");
    assert!(
        took.is_some(),
        "no own-pool wait within {WITHIN:?}: {report:#}"
    );
    eprintln!("own-pool wait flagged after {took:.1?}");
    // The http pool, waiting on the pricing pool's futures from its own
    // tasks, looks the same from outside: flagged too, as inferred.
    let found = findings(&report, "own_pool_wait")
        .into_iter()
        .find(|f| f["pools"] == serde_json::json!(["pricing-*"]))
        .unwrap_or_else(|| panic!("the pricing pool not flagged: {report:#}"));
    assert_eq!(found["certainty"], "inferred", "{found}");
    let pool = report["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == "pricing-*")
        .unwrap_or_else(|| panic!("no pricing pool: {report:#}"));
    let summary = pool["summary"].as_str().unwrap();
    assert!(
        summary.contains("2 of 2 threads blocked") && summary.contains("FutureTask.get"),
        "{summary}"
    );
    not_flagged(&report, "idle-");
}
