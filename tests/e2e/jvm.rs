//! JVM support, end to end: real JVMs (JDK on the machine) run as an
//! unprivileged user with only `-XX:+PreserveFramePointer`; wallscope must
//! get their perf maps written through the attach mechanism and report
//! Java frames and full thread names. Needs root (eBPF) and a JDK.

use std::{
    collections::BTreeMap,
    thread,
    time::{Duration, Instant},
};

use crate::support::{
    daemon, get,
    java::{self, JavaRun, Jvm},
    kernel::{self, Account},
    rows::{
        folded_at, is_java_frame, jit_marks, json_at, named_pool_stack, share_with_chain, show,
        within, Rows,
    },
    Fixture,
};

#[test]
fn jvm_in_its_own_pid_and_mount_namespace_is_symbolized() {
    let Some(_fx) = Fixture::ebpf_serial().filter(|_| java::jdk_available()) else {
        return;
    };
    let url = daemon();
    let jvm = JavaRun {
        namespaced: true,
        ..JavaRun::default()
    }
    .start("Pools", &["40", "1"]);
    let ns_pid = ns_pid(jvm.pid);
    assert_ne!(ns_pid, jvm.pid, "the JVM should have its own pid namespace");
    // Wide: a busy host may keep the daemon some seconds behind.
    let query = format!("pid={}&kind=cpu&seconds=60", jvm.pid);
    let mut last = Vec::new();
    // Named once the JIT compiled the pool's loop: on a busy host that
    // takes a while.
    let found = within(crate::support::CATCH_UP, || {
        last = folded_at(url, &query);
        named_pool_stack(&last)
    });
    assert!(
        found.is_some(),
        "no named Java stack for the namespaced JVM; top rows:\n{}",
        show(&last)
    );
    // The map is in the container's /tmp, under the container's pid.
    assert!(
        std::path::Path::new(&format!("/proc/{}/root/tmp/perf-{ns_pid}.map", jvm.pid)).exists()
    );
    assert!(!std::path::Path::new(&format!("/tmp/perf-{ns_pid}.map")).exists());
}

fn ns_pid(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    line.split_whitespace().last().unwrap().parse().unwrap()
}

/// The `/threads` row of pool `name` of `pid` over the last `seconds`.
fn pool_report(url: &str, pid: u32, seconds: u64, name: &str) -> serde_json::Value {
    let report = json_at(url, &format!("/threads?pid={pid}&seconds={seconds}"));
    let pools = report["pools"].as_array().unwrap();
    let pool = pools.iter().find(|p| p["pool"] == name);
    pool.unwrap_or_else(|| panic!("no {name} pool: {report}"))
        .clone()
}

/// Share of a `/threads` row's wall time in `field`.
fn share(row: &serde_json::Value, field: &str) -> f64 {
    row[field].as_u64().unwrap() as f64 / row["wall_us"].as_u64().unwrap().max(1) as f64
}

/// What the kernel counted for the threads of `pid` named `prefix*` while
/// `wait` ran: their summed growth, and thread-seconds observed.
fn kernel_during(pid: u32, prefix: &str, wait: Duration) -> (Account, f64) {
    let before = kernel::threads_now(pid, prefix);
    let started = Instant::now();
    thread::sleep(wait);
    let after = kernel::threads_now(pid, prefix);
    let (grown, threads) = kernel::growth(&before, &after);
    (grown, threads as f64 * started.elapsed().as_secs_f64())
}

/// Roots under the process frame of a `group=pool` graph, with their weight.
fn pool_roots(rows: &Rows) -> BTreeMap<String, u64> {
    let mut roots = BTreeMap::new();
    for (stack, v) in rows {
        if let Some(root) = stack.get(1) {
            *roots.entry(root.clone()).or_default() += v;
        }
    }
    roots
}

/// Roots that are a pool's name cut short (a thread not yet named).
fn split_pools(roots: &BTreeMap<String, u64>) -> Vec<&String> {
    let cut = |n: &str, stem: &str, pool: &str| n.starts_with(stem) && n != pool;
    (roots.keys())
        .filter(|n| {
            cut(n, "Native-Transpor", "Native-Transport-Requests-*")
                || cut(n, "MutationStage", "MutationStage-*")
        })
        .collect()
}

#[test]
fn named_pools_have_one_root_each_with_their_full_names() {
    let Some(_fx) = Fixture::ebpf_serial().filter(|_| java::jdk_available()) else {
        return;
    };
    let url = daemon();
    let jvm: Jvm = JavaRun::default().start("Pools", &["25", "2"]);
    let pid = jvm.pid;
    let query = format!("pid={pid}&kind=cpu&group=pool&seconds=30");
    // A thread carries its kernel name (cut to 15 bytes) until a JVM
    // thread dump names it, and a pool the store folded before that keeps
    // the short name: the full names must take over within the catch-up
    // time.
    let mut roots = BTreeMap::new();
    let settled = within(crate::support::CATCH_UP, || {
        thread::sleep(Duration::from_secs(2));
        roots = pool_roots(&folded_at(url, &query));
        let full = roots.contains_key("MutationStage-*")
            && roots.contains_key("Native-Transport-Requests-*");
        (full && split_pools(&roots).is_empty()).then_some(())
    });
    let names: Vec<&String> = roots.keys().collect();
    for pool in ["MutationStage-*", "Native-Transport-Requests-*"] {
        assert!(roots.contains_key(pool), "no root {pool}: {names:?}");
    }
    assert!(settled.is_some(), "split pools: {:?}", split_pools(&roots));

    let report = json_at(url, &format!("/threads?pid={pid}&seconds=10"));
    let pools = report["pools"].as_array().unwrap();
    for name in ["MutationStage-*", "Native-Transport-Requests-*"] {
        let pool = pools
            .iter()
            .find(|p| p["pool"] == name)
            .unwrap_or_else(|| panic!("/threads has no pool {name}: {report}"));
        assert_eq!(pool["threads"], 2, "{pool}");
    }
    let threads = report["threads"].as_array().unwrap();
    assert!(
        threads
            .iter()
            .any(|t| t["name"] == "Native-Transport-Requests-2"),
        "full thread names in /threads"
    );
    assert_eq!(report["jvm"]["attach"], "attached", "{}", report["jvm"]);
}

#[test]
fn forkjoin_churn_parks_on_futex_with_complete_park_stacks() {
    let Some(_fx) = Fixture::ebpf_serial().filter(|_| java::jdk_available()) else {
        return;
    };
    let url = daemon();
    let jvm = JavaRun::default().start("Churn", &["25", "4"]);
    let pid = jvm.pid;
    thread::sleep(Duration::from_secs(5));
    // Names are cut to 15 bytes in the kernel.
    let (kernel, thread_s) = kernel_during(pid, "ForkJoinPool-1-", Duration::from_secs(10));
    crate::support::settle(url);
    let pool = pool_report(url, pid, 10, "ForkJoinPool-1-worker-*");
    assert!(
        share(&pool, "futex_us") > 0.5,
        "workers mostly parked: {pool}"
    );
    // Each park the kernel saw ended with a wakeup, at whatever rate the
    // host allowed: the daemon's rate per thread-second over the last 10 s
    // agrees with the kernel's over the 10 s before the daemon caught up.
    let blocks = kernel.voluntary as f64;
    let kernel_rate = blocks / thread_s;
    let rate = pool["wakeups_received"].as_u64().unwrap() as f64
        / (pool["wall_us"].as_u64().unwrap().max(1) as f64 / 1e6);
    assert!(
        blocks >= 100.0 && (rate - kernel_rate).abs() <= 0.3 * kernel_rate,
        "park/unpark churn: {rate:.0} wakeups per thread-second, \
         the kernel saw {kernel_rate:.0} blocks: {pool}"
    );

    let rows = folded_at(url, &format!("pid={pid}&kind=futex&group=pool&seconds=10"));
    let workers: Rows = jit_marks(rows)
        .into_iter()
        .filter(|r| r.0.get(1).map(String::as_str) == Some("ForkJoinPool-1-worker-*"))
        .collect();
    assert!(!workers.is_empty(), "futex stacks of the workers");
    // Unwind tables walk glibc (no frame pointers), frame pointers walk
    // libjvm and the JIT code: from the futex wait through the park path
    // and the pool's Java loop down to the thread start.
    // The Java caller of Unsafe.park (ForkJoinPool.awaitWork) may still run
    // interpreted, or be compiled after the perf map was last written.
    let chain = [
        "start_thread",
        "jdk.internal.misc.Unsafe.park_[j]",
        "Parker::park(bool, long)",
        "__futex_abstimed_wait_common",
        "[syscall futex]",
    ];
    let complete = java::complete_park_share(&workers, "jdk.internal.misc.Unsafe.park_[j]", &chain);
    assert!(
        complete > 0.7,
        "parked workers' stacks from the futex wait to the thread start:\n{}",
        show(&workers)
    );
    let named = share_with_chain(
        &workers,
        &[
            "java.util.concurrent.ForkJoinPool.awaitWork_[j]",
            "jdk.internal.misc.Unsafe.park_[j]",
        ],
    );
    eprintln!("complete park stacks {complete:.2}, with the caller named {named:.2}");
    // A thread parked in SynchronousQueue.take, the other common park.
    let rows = folded_at(url, &format!("pid={pid}&kind=futex&group=pool&seconds=10"));
    let handoff: Rows = jit_marks(rows)
        .into_iter()
        .filter(|r| r.0.get(1).map(String::as_str) == Some("handoff"))
        .collect();
    let parked = share_with_chain(
        &handoff,
        &[
            "start_thread",
            "jdk.internal.misc.Unsafe.park_[j]",
            "Parker::park(bool, long)",
            "[syscall futex]",
        ],
    );
    assert!(parked > 0.7, "handoff thread:\n{}", show(&handoff));
}

#[test]
fn starved_java_threads_wait_in_the_runqueue_in_their_java_code() {
    let Some(_fx) = Fixture::ebpf_serial().filter(|_| java::jdk_available()) else {
        return;
    };
    let url = daemon();
    let jvm = JavaRun {
        cpus: Some("0"),
        ..JavaRun::default()
    }
    .start("Starve", &["20", "3"]);
    let pid = jvm.pid;
    thread::sleep(Duration::from_secs(4));
    let (kernel, thread_us) = kernel_during(pid, "cruncher-", Duration::from_secs(8));
    let thread_us = thread_us * 1e6;
    crate::support::settle(url);
    let pool = pool_report(url, pid, 8, "cruncher-*");
    // Three CPU-bound threads on one CPU: each runs a third of the time at
    // most, however busy the host. How much they ran, the kernel tells:
    // the daemon's shares over the last 8 s agree with its over the 8 s
    // before the daemon caught up.
    assert!(share(&pool, "runqueue_us") > 0.5, "{pool}");
    for (field, kernel_share) in [
        ("runqueue_us", kernel.runqueue_us / thread_us),
        ("cpu_us", kernel.cpu_us / thread_us),
    ] {
        assert!(
            (share(&pool, field) - kernel_share).abs() <= 0.1,
            "{field}: the kernel says a share of {kernel_share:.2}: {pool}"
        );
    }
    let rows = folded_at(
        url,
        &format!("pid={pid}&kind=runqueue&group=pool&seconds=8"),
    );
    let in_java: u64 = rows
        .iter()
        .filter(|r| r.0.get(1).map(String::as_str) == Some("cruncher-*"))
        .filter(|r| {
            r.0.iter()
                .any(|f| f.starts_with("Starve.") && is_java_frame(f))
        })
        .map(|r| r.1)
        .sum();
    let all: u64 = rows
        .iter()
        .filter(|r| r.0.get(1).map(String::as_str) == Some("cruncher-*"))
        .map(|r| r.1)
        .sum();
    assert!(
        in_java as f64 > 0.8 * all as f64,
        "runqueue time of the crunchers is in Starve's methods:\n{}",
        show(&rows)
    );
}

/// Number of `wallscope serve` processes on the host.
fn running_daemons() -> usize {
    crate::support::processes_running("wallscope", "serve").len()
}

#[test]
fn jvms_that_refuse_or_lack_frame_pointers_are_reported_once() {
    let Some(_fx) = Fixture::ebpf_serial().filter(|_| java::jdk_available()) else {
        return;
    };
    let url = daemon();
    let refusing = JavaRun {
        jvm_opts: vec!["-XX:+DisableAttachMechanism".into()],
        ..JavaRun::default()
    }
    .start("Starve", &["30", "1"]);
    let no_fp = JavaRun {
        no_frame_pointer: true,
        ..JavaRun::default()
    }
    .start("Starve", &["30", "1"]);

    let report = within(Duration::from_secs(60), || {
        java::jvm_report(url, refusing.pid)
    })
    .expect("the refusing JVM in /processes");
    assert_eq!(report["attach"], "refused", "{report}");
    let error = report["error"].as_str().unwrap_or_default();
    // Another daemon on the host may have planted its trigger file first:
    // this one then refuses the file it did not make.
    let others_trigger = running_daemons() > 1 && error.contains("attach_trigger");
    assert!(
        error.contains("DisableAttachMechanism") || others_trigger,
        "{report}"
    );

    let report = java::report_after_attach(url, no_fp.pid, Duration::from_secs(60))
        .expect("the JVM without frame pointers in /processes");
    assert_eq!(report["attach"], "attached", "{report}");
    assert_eq!(report["preserve_frame_pointer"], false, "{report}");
    // Compiled frames are stepped through by the JVM's own code tables
    // (issue #27): the flag is worth a warning only where those cannot be
    // read, with frames from the perf map alone.
    let code_read = report["frames"]
        .as_str()
        .is_some_and(|f| f.starts_with("vm_structures"));
    assert_eq!(
        report["warning"]
            .as_str()
            .is_some_and(|w| w.contains("PreserveFramePointer")),
        !code_read,
        "{report}"
    );
    let (status, text) = get(&format!("{url}/threads?pid={}&format=text", no_fp.pid));
    assert_eq!(status, 200);
    assert!(text.contains("no -XX:+PreserveFramePointer"), "{text}");

    // Not retried: with attach disabled, each SIGQUIT makes HotSpot print a
    // thread dump instead: one per wallscope daemon on the host (this
    // test's, and any other that runs), however long the JVM runs.
    thread::sleep(Duration::from_secs(10));
    let printed = refusing.workload.stop();
    let dumps = printed.matches("Full thread dump").count();
    let daemons = running_daemons();
    let stamps: Vec<&str> = printed.lines().filter(|l| l.starts_with("20")).collect();
    assert!(
        (1..=daemons).contains(&dumps),
        "{dumps} SIGQUITs from {daemons} daemons to the refusing JVM: {stamps:?}"
    );
    drop(no_fp);
}
