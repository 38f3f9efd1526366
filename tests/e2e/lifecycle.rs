//! Processes tracked by lifecycle events (root; under CI=true they fail
//! rather than skip): a program exec'd under the same pid, a process that
//! lives 50 ms, a pid reused by another binary. Two builds of one workload
//! (`lifecycle_a`, `lifecycle_b`) have different function names
//! (`variant_a_*`, `variant_b_*`) and code layouts, so frames read with the
//! other build's maps or name show.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use crate::support::*;
use serde_json::Value;

fn build_a() -> std::path::PathBuf {
    workload_variant("lifecycle", "lifecycle_a", &[])
}

fn build_b() -> std::path::PathBuf {
    workload_variant("lifecycle", "lifecycle_b", &["-DVARIANT_B"])
}

/// CPU rows of `pid` over the last `seconds`.
fn cpu_rows(pid: u32, seconds: u64) -> Vec<(Vec<String>, u64)> {
    folded_rows(&format!("pid={pid}&seconds={seconds}")).0
}

/// Share of `rows` (by value) whose frames satisfy `pred`.
fn share(rows: &[(Vec<String>, u64)], pred: impl Fn(&[String]) -> bool) -> f64 {
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let with: u64 = rows.iter().filter(|r| pred(&r.0)).map(|r| r.1).sum();
    with as f64 / total.max(1) as f64
}

fn has(frames: &[String], needle: &str) -> bool {
    frames.iter().any(|f| f.contains(needle))
}

/// User frames only: kernel frames may be `[unknown]_[k]` for reasons
/// that have nothing to do with processes.
fn unknown_user_frame(frames: &[String]) -> bool {
    frames
        .iter()
        .any(|f| !f.ends_with("_[k]") && (f.contains("[unknown]") || f.contains("+0x")))
}

/// The name `/processes` gives `pid` over the last `seconds`.
fn process_name(pid: u32, seconds: u64) -> Option<String> {
    let (status, body) = get(&format!("{}/processes?seconds={seconds}", daemon()));
    assert_eq!(status, 200, "{body}");
    let rows: Value = serde_json::from_str(&body).unwrap();
    let rows = rows
        .as_array()
        .or_else(|| rows["processes"].as_array())
        .cloned()
        .unwrap_or_default();
    rows.iter()
        .find(|r| r["pid"] == pid)
        .map(|r| r["comm"].as_str().unwrap_or_default().to_string())
}

#[test]
fn a_program_execd_under_the_same_pid_shows_its_own_name_and_frames() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    daemon();
    let (a, b) = (build_a(), build_b());
    // The usual container entrypoint: a first program that execs the real one.
    let mut cmd = Command::new(&a);
    cmd.args(["exec", "2"]).arg(&b).args(["spin", "3"]);
    let w = Workload::spawn(cmd);
    let pid = w.pid;
    w.wait();
    settle(daemon());

    let rows = cpu_rows(pid, 60);
    assert!(!rows.is_empty(), "no CPU rows for {pid}");
    let before = share(&rows, |f| has(f, "variant_a_spin"));
    let after = share(&rows, |f| has(f, "variant_b_spin"));
    let unknown = share(&rows, unknown_user_frame);
    let mixed = share(&rows, |f| has(f, "variant_a_") && has(f, "variant_b_"));
    let report = format!("a {before:.2} b {after:.2} unknown {unknown:.2}: {rows:?}");
    // 2 s before the exec, 3 s after: shares, whatever CPU they got.
    assert!(after >= 0.3, "after exec: {report}");
    assert!(before >= 0.15, "before exec: {report}");
    assert!(unknown <= 0.1, "{report}");
    assert_eq!(mixed, 0.0, "{report}");
    assert!(
        rows.iter().any(|r| r.0[0] == "lifecycle_b"),
        "new name as root: {report}"
    );
    assert_eq!(process_name(pid, 60).as_deref(), Some("lifecycle_b"));
}

#[test]
fn processes_that_live_50_ms_are_symbolized() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    daemon();
    let brief = workload_variant("lifecycle", "lifecycle_brief", &[]);
    // Only what ended since the first one started: with pid_max at 32,768,
    // a `cargo build` beside the suite reuses a pid within minutes, and a
    // longer window would hold that later process's rows (under its own
    // name, rightly) too.
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 1;
    let mut pids = Vec::new();
    for _ in 0..30 {
        let w = Workload::start(&brief, &["brief", "50"]);
        pids.push(w.pid);
        w.wait();
    }
    settle(daemon());
    let mut rows = Vec::new();
    for pid in &pids {
        let (status, body) = get(&format!("{}/folded?pid={pid}&from={since}", daemon()));
        // A process may get no sample at all in 50 ms on a busy host.
        if status == 200 {
            rows.extend(parse_folded(&body));
        }
    }
    let samples = rows.len();
    assert!(samples >= 5, "rows from {} processes: {rows:?}", pids.len());
    // Start-up (exec, the dynamic loader) is a good part of 50 ms: most,
    // not all, samples are in the program's own code.
    let named = share(&rows, |f| f[0] == "lifecycle_brief");
    let code = share(&rows, |f| {
        has(f, "variant_a_brief") && has(f, "variant_a_spin")
    });
    let unknown = share(&rows, unknown_user_frame);
    let report = format!("named {named:.2} code {code:.2} unknown {unknown:.2}: {rows:?}");
    assert!(named >= 0.9, "{report}");
    assert!(code >= 0.5, "{report}");
    assert!(unknown <= 0.2, "{report}");
}

/// Starts `cmd` until it gets `pid` (written to `ns_last_pid` first);
/// other processes on the host may take it first, so it tries again.
fn spawn_with_pid(pid: u32, make: impl Fn() -> Command) -> Workload {
    for _ in 0..500 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .expect("writing ns_last_pid (needs root)");
        let w = Workload::spawn(make());
        if w.pid == pid {
            return w;
        }
        drop(w);
    }
    panic!("could not get pid {pid} in 500 tries");
}

#[test]
fn a_reused_pid_never_shows_the_previous_binary() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    daemon();
    let (a, b) = (build_a(), build_b());
    let first = Workload::start(&a, &["spin", "2"]);
    let pid = first.pid;
    first.wait();
    let second = spawn_with_pid(pid, || {
        let mut cmd = Command::new(&b);
        cmd.args(["spin", "5"]);
        cmd
    });
    let started = Instant::now();
    second.wait();
    settle(daemon());
    // Only the second process's life: the first ended before it started,
    // and its last drain came at most a second or so later.
    let seconds = started.elapsed().saturating_sub(Duration::from_secs(2));
    let rows = cpu_rows(pid, seconds.as_secs().max(1));
    let report = format!("{rows:?}");
    assert!(!rows.is_empty(), "no rows for {pid}");
    assert_eq!(share(&rows, |f| has(f, "variant_a_")), 0.0, "{report}");
    assert!(
        rows.iter().all(|r| r.0[0] == "lifecycle_b"),
        "previous name: {report}"
    );
    assert!(
        share(&rows, |f| has(f, "variant_b_spin")) >= 0.8,
        "{report}"
    );
    assert!(share(&rows, unknown_user_frame) <= 0.1, "{report}");
    assert_eq!(
        process_name(pid, seconds.as_secs().max(1)).as_deref(),
        Some("lifecycle_b")
    );
}
