//! The memory budget (`--memory-mb`, its default) on a busy host: 10,000
//! sleeping threads in one process, a process spawner, and messaging
//! (`perf bench sched messaging` where perf runs, a park/unpark churn
//! pool always), run by the victim user `daemon`, with the daemon inside
//! a cgroup of its unit's `MemoryMax` (512 MiB). It is never OOM-killed,
//! `/healthz` answers throughout, every holder stays within its bound,
//! the bounds fit the budget, and the cgroup never reaches its limit.
//! Needs root (skips without eBPF, fails under CI).

use std::{
    path::PathBuf,
    process::Stdio,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::support::{
    get,
    memcg::{ConfinedDaemon, UNIT_MEMORY_MAX},
    users, Fixture, Workload,
};

/// How long the busy host is watched.
const BUSY: Duration = Duration::from_secs(60);
/// The victim user (`daemon`).
const DAEMON_UID: u32 = 1;

/// `name` run as user `daemon` with `args`, ready.
fn as_daemon(bin: &PathBuf, args: &[&str]) -> Workload {
    let mut cmd = users::as_user(DAEMON_UID, bin);
    cmd.args(args);
    Workload::spawn(cmd)
}

/// `perf bench sched messaging` rounds, as user `daemon`, until `stop`;
/// none if perf does not run here.
fn messaging(stop: Arc<AtomicBool>) -> Option<thread::JoinHandle<u32>> {
    let bench = || {
        let mut cmd = users::as_user(DAEMON_UID, "perf");
        cmd.args(["bench", "sched", "messaging", "-g", "4", "-l", "500"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    };
    let works = bench().status().is_ok_and(|s| s.success());
    works.then(|| {
        thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                let _ = bench().status();
                rounds += 1;
            }
            rounds
        })
    })
}

/// Checks one `/healthz` `memory` against the budget; returns the bytes
/// held and the bounds' sum.
fn check_budget(memory: &Value) -> (u64, u64) {
    let budget = &memory["budget"];
    let total = budget["budget_bytes"].as_u64().expect("memory.budget");
    let parts = budget["split"].as_array().expect("memory.budget.split");
    let sum: u64 = parts.iter().map(|p| p["bytes"].as_u64().unwrap()).sum();
    assert!(sum <= total, "the split exceeds the budget: {budget}");
    let reserve = parts
        .iter()
        .find(|p| p["part"] == "reserve")
        .and_then(|p| p["bytes"].as_u64())
        .expect("a reserve");
    let bounds = memory["bounds_bytes"].as_u64().unwrap();
    assert!(
        bounds <= total - reserve,
        "holder bounds {bounds} past the budget less its reserve: {memory}"
    );
    let mut held = 0;
    for h in memory["holders"].as_array().unwrap() {
        let bytes = h["bytes"].as_u64().unwrap();
        held += bytes;
        if let Some(bound) = h["bound"].as_u64() {
            assert!(
                bytes <= bound,
                "holder over its bound: {h}\nmemory: {memory}"
            );
        }
    }
    (held, bounds)
}

#[test]
fn a_busy_host_keeps_the_daemon_within_its_budget_in_512_mib() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    let mut ws = ConfinedDaemon::start(&[]);
    let dir = users::shared_dir("governor", 0o755);
    let threads = as_daemon(
        &users::runnable_copy("many_threads", &dir),
        &["10000", "600"],
    );
    let spawner = as_daemon(&users::runnable_copy("spawner", &dir), &["200", "600", "2"]);
    let churn = as_daemon(&users::runnable_copy("churn", &dir), &["64", "600"]);
    let stop = Arc::new(AtomicBool::new(false));
    let bench = messaging(stop.clone());

    let (mut slowest, mut most_held, mut answers) = (Duration::ZERO, 0, 0);
    let mut last = Value::Null;
    let end = Instant::now() + BUSY;
    while Instant::now() < end {
        let asked = Instant::now();
        let (status, body) = get(&format!("{}/healthz", ws.url()));
        slowest = slowest.max(asked.elapsed());
        ws.assert_survived("the busy host");
        assert_eq!(status, 200, "/healthz: {body}");
        answers += 1;
        last = serde_json::from_str(&body).unwrap();
        let (held, _) = check_budget(&last["memory"]);
        most_held = most_held.max(held);
        thread::sleep(Duration::from_secs(1).saturating_sub(asked.elapsed()));
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = bench.map(|b| b.join().unwrap());
    ws.assert_survived("the busy host");
    let memory = &last["memory"];
    let (_, bounds) = check_budget(memory);
    let peak = ws.cgroup.peak_bytes();
    println!(
        "{answers} answers, slowest {slowest:?}; held at most {} MiB, bounds {} MiB of {} MiB; \
         cgroup peak {} MiB, VmHWM {} MiB; messaging rounds {rounds:?}\nmemory: {memory}\n\
         store: {}\nbatches stripped {}, dropped {} ({} rows)",
        most_held >> 20,
        bounds >> 20,
        memory["budget"]["budget_bytes"].as_u64().unwrap_or(0) >> 20,
        peak >> 20,
        memory["hwm_bytes"].as_u64().unwrap_or(0) >> 20,
        last["store"],
        last["pipeline"]["batches_stripped"],
        last["pipeline"]["batches_dropped"],
        last["pipeline"]["rows_dropped"]
    );
    // The load reached the daemon: the 10,000 sleeping threads were seen
    // off-CPU at a drain. (Not `/processes`: a newcomer with more rows in
    // one slice than anyone holds may lose even its newest rows to the
    // store's fair share, by design; see `store/share.rs`.)
    let live = last["store"]["live_threads"].as_u64().unwrap_or(0);
    assert!(
        live >= 1000,
        "only {live} threads off-CPU at the last drain"
    );
    assert!(
        peak < UNIT_MEMORY_MAX,
        "the cgroup reached its limit: {} MiB",
        peak >> 20
    );
    drop((threads, spawner, churn));
}
