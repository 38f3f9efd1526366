//! Unwind tables on a crowded host (issue 10, point 5): which tables are
//! loaded must not depend on what else runs. Hundreds of distinct binaries
//! fill the table array; a JVM started afterwards still walks glibc with
//! its table at once. Needs root (eBPF) and a JDK.

use std::{
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use crate::support::{
    crowd,
    java::{self, JavaRun},
    rows::{folded_at, json_at, show, within, Rows},
    Daemon, Fixture, Workload, CATCH_UP,
};

/// Distinct binaries (distinct inodes, so distinct tables) started.
/// About how long a drain takes to reach the store (one drain interval and
/// its symbolization).
const SETTLE: Duration = Duration::from_millis(2500);
const BINARIES: usize = 300;
/// Functions in each: about 3 rows each, so 300 binaries need some 600k
/// rows where a 2 MiB array holds 175k.
const FUNCTIONS: usize = 600;
/// How long the binaries live if the test dies without killing them.
const CROWD_LIFETIME_S: u32 = 240;

/// A C program of `FUNCTIONS` functions without frame pointers that
/// prints `ready PID`, then wakes every 250 ms (so that drains see it)
/// for `argv[1]` seconds.
const CROWD_MAIN: &str = "int main(int argc, char **argv) {\n\
     long until = time(0) + atol(argv[1]);\n\
     printf(\"ready %d\\n\", getpid());\n\
     fflush(stdout);\n\
     struct timespec nap = {0, 250 * 1000 * 1000};\n\
     for (long n = 0; time(0) < until; n++) { nanosleep(&nap, 0); f0(n); }\n\
     return 0;\n}\n";

/// Compiles the crowd program once and copies it to `BINARIES` files.
fn crowd_binaries() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("crowd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let first = dir.join("crowd-0");
    crowd::compile(&crowd::source(FUNCTIONS, CROWD_MAIN), &first);
    let mut bins = vec![first.clone()];
    for i in 1..BINARIES {
        let copy = dir.join(format!("crowd-{i}"));
        std::fs::copy(&first, &copy).unwrap();
        bins.push(copy);
    }
    bins
}

/// The daemon's `pipeline.unwind` figures.
fn unwind(url: &str) -> serde_json::Value {
    json_at(url, "/healthz")["pipeline"]["unwind"].clone()
}

fn n(unwind: &serde_json::Value, key: &str) -> u64 {
    unwind[key].as_u64().unwrap_or(0)
}

/// Share of the workers' futex time whose stack runs from the thread start
/// through a Java caller of `Unsafe_Park` and `Parker::park` down to the
/// futex wait in glibc: what only a walk of glibc with its table gives
/// (frame pointers alone skip from glibc's leaf to libjvm's frames). The
/// caller may not be named yet (the perf map comes with the attach).
fn complete_park_share(workers: &Rows) -> f64 {
    let chain = [
        "start_thread",
        "Unsafe_Park",
        "Parker::park(bool, long)",
        "__futex_abstimed_wait_common",
        "[syscall futex]",
    ];
    java::complete_park_share(workers, "Unsafe_Park", &chain)
}

#[test]
fn a_jvm_started_on_a_full_table_array_walks_glibc_with_its_table_at_once() {
    let Some(_fx) = Fixture::ebpf_alone().filter(|_| java::jdk_available()) else {
        return;
    };
    // 2 MiB hold about 175k rows: glibc's table (29k rows) fits, the
    // crowd's 300 tables (2k rows each) do not, nor libjvm's (190k rows,
    // more than a quarter of the array).
    let daemon = Daemon::start(&["--unwind-table-mb", "2"]);
    let url = daemon.url.as_str();
    let loaded = within(Duration::from_secs(60), || {
        let u = unwind(url);
        (n(&u, "tables_loaded") >= 1 && n(&u, "processes") >= 1).then_some(())
    });
    assert!(loaded.is_some(), "no tables loaded: {}", unwind(url));

    let lifetime = CROWD_LIFETIME_S.to_string();
    let crowd: Vec<Workload> = crowd_binaries()
        .iter()
        .map(|bin| Workload::start(bin, &[&lifetime]))
        .collect();
    // The array is full: tables were left out or evicted for lack of room.
    let full = within(Duration::from_secs(90), || {
        let u = unwind(url);
        (n(&u, "tables_no_room") + n(&u, "tables_evicted") >= 1).then_some(u)
    });
    let full = full.unwrap_or_else(|| panic!("the array never filled: {}", unwind(url)));
    eprintln!("crowded: {full}");
    assert!(
        n(&full, "rows_in_use") * 10 >= n(&full, "rows_capacity") * 8,
        "{full}"
    );

    let jvm = JavaRun::default().start("Churn", &["30", "4"]);
    let (pid, ready) = (jvm.pid, Instant::now());
    // Within 5 s of its start the workers park with complete stacks; what
    // they recorded then is in the store a drain and a symbolization later.
    // On a host too busy to run the JVM or drain in time, the 5 s count
    // from when its workers' stacks first show (at most a minute).
    let mut first_seen = None;
    let (complete, workers) = loop {
        let rows = folded_at(url, &format!("pid={pid}&kind=futex&group=pool&seconds=2"));
        let workers: Rows = rows
            .into_iter()
            .filter(|r| r.0.get(1).map(String::as_str) == Some("ForkJoinPool-1-worker-*"))
            .collect();
        if !workers.is_empty() && first_seen.is_none() {
            first_seen = Some(Instant::now());
        }
        let complete = complete_park_share(&workers);
        let deadline = match first_seen {
            Some(seen) => {
                ready.max(seen.checked_sub(SETTLE).unwrap_or(seen))
                    + Duration::from_secs(5)
                    + SETTLE
            }
            None => ready + Duration::from_secs(60),
        };
        if (!workers.is_empty() && complete > 0.7) || Instant::now() >= deadline {
            break (complete, workers);
        }
        thread::sleep(Duration::from_millis(500));
    };
    // The registry gives libjvm its verdict within its budget per update:
    // on a busy host that may come after the stacks are complete.
    let libjvm_decided = |u: &serde_json::Value| {
        u["missing"].as_array().is_some_and(|missing| {
            missing.iter().filter(|m| m["pid"] == pid).any(|m| {
                m["files"].as_array().is_some_and(|files| {
                    files.iter().any(|f| {
                        f["path"]
                            .as_str()
                            .is_some_and(|p| p.ends_with("/libjvm.so"))
                            && f["reason"] != "pending"
                    })
                })
            })
        })
    };
    let after = within(CATCH_UP, || Some(unwind(url)).filter(libjvm_decided))
        .unwrap_or_else(|| unwind(url));
    assert!(
        complete > 0.7,
        "{:.2} of the parked workers' stacks complete {:.1} s after the JVM's start:\n{}\nunwind: {after}",
        complete,
        ready.elapsed().as_secs_f64(),
        show(&workers)
    );
    eprintln!(
        "complete park stacks {complete:.2} after {:.1} s",
        ready.elapsed().as_secs_f64()
    );

    // /healthz says who walks without which table: the JVM lacks libjvm's
    // (too big for this array), never glibc's; the crowd lacks its own.
    let missing = after["missing"].as_array().expect("missing list");
    let listed = |pid: u32| missing.iter().find(|m| m["pid"] == pid);
    let files = |m: &serde_json::Value| -> Vec<(String, String)> {
        m["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let path = f["path"].as_str().unwrap().to_string();
                (path, f["reason"].as_str().unwrap().to_string())
            })
            .collect()
    };
    let jvm_missing = files(listed(pid).unwrap_or_else(|| panic!("JVM not listed: {after}")));
    assert!(
        jvm_missing
            .iter()
            .any(|(p, why)| p.ends_with("/libjvm.so") && why == "too_big"),
        "{jvm_missing:?}"
    );
    assert!(
        !jvm_missing.iter().any(|(p, _)| p.contains("libc.so")),
        "{jvm_missing:?}"
    );
    let crowd_pids: Vec<u32> = crowd.iter().map(|w| w.pid).collect();
    let crowd_listed: Vec<Vec<(String, String)>> = crowd_pids
        .iter()
        .filter_map(|pid| listed(*pid))
        .map(files)
        .collect();
    // A crowd table is refused (no room), evicted, or still waiting to be
    // built: the registry builds the most shared first within a budget per
    // update, and when the JVM is done early the list's 20 newest crowd
    // processes may all still be waiting. Each is a reason the crowd walks
    // without its own table; that the array is full was checked above.
    assert!(
        crowd_listed
            .iter()
            .flatten()
            .any(|(p, why)| p.contains("/crowd-")
                && matches!(why.as_str(), "no_room" | "evicted" | "pending")),
        "{after}"
    );
    assert!(n(&after, "processes_missing_tables") as usize >= crowd_listed.len());
    drop(crowd);
}
