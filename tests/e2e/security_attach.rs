//! What a local unprivileged user (`nobody`) can do to the JVM attach
//! client: fake JVMs that answer slowly must not keep a real JVM from
//! being attached; a trigger file of another client attaching to the same
//! JVM (a second wallscope) only delays the attach; and the perf maps
//! wallscope had a JVM write are removed when it exits, but only those
//! very files. Needs root, eBPF and a JDK.

use std::{
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::support::{
    get,
    java::{self, jvm_report, JavaRun},
    rows::{json_at, within},
    settle,
    users::{self, NOBODY},
    workload, Daemon, Fixture, Workload, CATCH_UP,
};

/// A directory every user can enter, for this test process, with the fake
/// JVM and a `libjvm.so` look-alike (a copy of libm) for it to map.
fn scratch() -> PathBuf {
    let dir = users::shared_dir("attach", 0o755);
    if !dir.join("slowjvm").exists() {
        fs::copy(workload("slowjvm"), dir.join("slowjvm")).unwrap();
        fs::set_permissions(dir.join("slowjvm"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::copy("/lib/x86_64-linux-gnu/libm.so.6", dir.join("libjvm.so")).unwrap();
        fs::set_permissions(dir.join("libjvm.so"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

/// Removes the fake's attach socket when the test is done with it.
struct Fake(Workload);

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = fs::remove_file(format!("/tmp/.java_pid{}", self.0.pid));
    }
}

/// A fake JVM as `nobody` that answers attach requests slowly (`mode`:
/// `silent` or `trickle`).
fn slow_fake(mode: &str) -> Fake {
    let dir = scratch();
    let mut cmd = users::as_nobody(dir.join("slowjvm"));
    cmd.arg(dir.join("libjvm.so")).arg(mode).current_dir(&dir);
    Fake(Workload::spawn(cmd))
}

fn refused(url: &str, what: &str, reason: &str) -> u64 {
    json_at(url, "/healthz")["refused"][what][reason]
        .as_u64()
        .unwrap_or_else(|| panic!("no refused.{what}.{reason} in /healthz"))
}

fn metric(url: &str, series: &str) -> Option<f64> {
    let (_, body) = get(&format!("{url}/metrics"));
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn a_real_jvm_is_attached_within_10s_beside_four_slow_fakes() {
    let Some(_fx) = Fixture::ebpf_alone().filter(|_| java::jdk_available()) else {
        return;
    };
    let ws = Daemon::start(&[]);
    settle(&ws.url);
    let timeouts = refused(&ws.url, "jvm_attach", "timeout");
    let fakes: Vec<Fake> = ["silent", "trickle", "silent", "trickle"]
        .into_iter()
        .map(slow_fake)
        .collect();
    // The fakes hold attach turns: at least one has timed out once.
    let busy = within(CATCH_UP, || {
        (refused(&ws.url, "jvm_attach", "timeout") > timeouts).then_some(())
    });
    assert!(busy.is_some(), "the slow fakes were never tried");
    let dropped = |h: &serde_json::Value| {
        h["pipeline"]["jvm_sightings_dropped"]
            .as_u64()
            .unwrap_or_else(|| panic!("no pipeline.jvm_sightings_dropped in /healthz: {h}"))
    };
    let dropped_before = dropped(&json_at(&ws.url, "/healthz"));

    let jvm = JavaRun::default().start("Pools", &["60", "2"]);
    let started = Instant::now();
    let report = within(Duration::from_secs(10), || {
        jvm_report(&ws.url, jvm.pid).filter(|r| r["attach"] == "attached")
    });
    let took = started.elapsed();
    let report = report.unwrap_or_else(|| {
        panic!(
            "real JVM not attached within 10 s beside the fakes: {:?}",
            jvm_report(&ws.url, jvm.pid)
        )
    });
    assert!(report["perf_map_writes"].as_u64().unwrap() >= 1, "{report}");
    // Its threads have their full Java names.
    let threads = format!("/threads?pid={}&seconds=10", jvm.pid);
    let named = within(Duration::from_secs(10), || {
        json_at(&ws.url, &threads)["threads"]
            .as_array()?
            .iter()
            .any(|t| t["name"] == "Native-Transport-Requests-1")
            .then_some(())
    });
    eprintln!(
        "attached after {:.1} s, named after {:.1} s",
        took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(named.is_some(), "no full Java thread names in {threads}");

    // The fakes are still pending, not refused for good, and their
    // time-outs are counted in /healthz and /metrics.
    for fake in &fakes {
        let r = json_at(&ws.url, "/processes?seconds=60");
        let row = r
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == fake.0.pid);
        if let Some(row) = row {
            assert_ne!(row["jvm"]["attach"], "attached", "{row}");
        }
    }
    let mut now = 0;
    within(Duration::from_secs(30), || {
        now = refused(&ws.url, "jvm_attach", "timeout");
        (now >= timeouts + 4).then_some(())
    });
    assert!(now >= timeouts + 4, "fakes' time-outs: {timeouts} -> {now}");
    eprintln!(
        "jvm_attach time-outs {timeouts} -> {now}, budget {}",
        refused(&ws.url, "jvm_attach", "budget")
    );
    let series = r#"wallscope_refused_total{what="jvm_attach",reason="timeout"}"#;
    assert!(metric(&ws.url, series).is_some_and(|n| n >= now as f64));
    let h = json_at(&ws.url, "/healthz");
    assert_eq!(dropped(&h), dropped_before, "JVM sightings dropped: {h}");
    drop(fakes);
}

#[test]
fn another_clients_trigger_delays_the_attach_but_does_not_refuse_it() {
    let Some(_fx) = Fixture::ebpf_alone().filter(|_| java::jdk_available()) else {
        return;
    };
    let jvm = JavaRun::default().start("Pools", &["60", "1"]);
    // Another client (`jcmd`, a second wallscope) is attaching: its
    // trigger file, the JVM's user's, is there before wallscope starts.
    let trigger = PathBuf::from(format!("/tmp/.attach_pid{}", jvm.pid));
    let _ = fs::remove_file(&trigger);
    fs::write(&trigger, "").unwrap();
    std::os::unix::fs::chown(&trigger, Some(NOBODY), Some(NOBODY)).unwrap();
    let ws = Daemon::start(&[]);
    let exists = refused(&ws.url, "attach_trigger", "exists");
    let seen = within(CATCH_UP, || {
        (refused(&ws.url, "attach_trigger", "exists") > exists).then_some(())
    });
    let _ = fs::remove_file(&trigger);
    assert!(seen.is_some(), "the busy trigger was never met");
    // Once the other client is done (its trigger gone), wallscope attaches.
    let report = within(Duration::from_secs(30), || {
        jvm_report(&ws.url, jvm.pid).filter(|r| r["attach"] != "pending" && r["attach"] != "")
    });
    let report = report.expect("JVM still pending 30 s after the other client was done");
    assert_eq!(report["attach"], "attached", "{report}");
}

#[test]
fn two_daemons_racing_for_one_jvm_both_attach() {
    let Some(_fx) = Fixture::ebpf_alone().filter(|_| java::jdk_available()) else {
        return;
    };
    let jvm = JavaRun::default().start("Pools", &["90", "1"]);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| Daemon::start(&[]));
        let b = s.spawn(|| Daemon::start(&[]));
        (a.join().unwrap(), b.join().unwrap())
    });
    for ws in [&a, &b] {
        let report = within(CATCH_UP, || {
            jvm_report(&ws.url, jvm.pid).filter(|r| r["attach"] == "attached")
        });
        assert!(
            report.is_some(),
            "{}: {:?}",
            ws.url,
            jvm_report(&ws.url, jvm.pid)
        );
    }
}

fn map_of(pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{pid}.map"))
}

fn owner(path: &Path) -> Option<u32> {
    fs::symlink_metadata(path).ok().map(|m| m.uid())
}

#[test]
fn perf_maps_of_exited_jvms_are_removed_but_only_their_own() {
    let Some(_fx) = Fixture::ebpf_alone().filter(|_| java::jdk_available()) else {
        return;
    };
    let ws = Daemon::start(&[]);
    settle(&ws.url);
    let jvms: Vec<java::Jvm> = (0..3)
        .map(|_| JavaRun::default().start("Pools", &["120", "1"]))
        .collect();
    for jvm in &jvms {
        let written = within(CATCH_UP, || {
            let r = jvm_report(&ws.url, jvm.pid)?;
            (r["perf_map_writes"].as_u64()? >= 1 && owner(&map_of(jvm.pid)) == Some(NOBODY))
                .then_some(())
        });
        assert!(written.is_some(), "pid {}: no perf map written", jvm.pid);
    }
    let [kept, replaced, other_owner] = [jvms[0].pid, jvms[1].pid, jvms[2].pid];
    // One replaced by a new file of the JVM's user (the old one kept
    // aside, so its inode is not reused), one by a file of root.
    let aside = PathBuf::from(format!("/tmp/perf-{replaced}.aside"));
    fs::rename(map_of(replaced), &aside).unwrap();
    fs::write(map_of(replaced), "1 1 replaced\n").unwrap();
    std::os::unix::fs::chown(map_of(replaced), Some(NOBODY), Some(NOBODY)).unwrap();
    fs::remove_file(map_of(other_owner)).unwrap();
    fs::write(map_of(other_owner), "1 1 root's\n").unwrap();
    // Those two exit first: the sweep that sees the third gone saw them.
    let mut jvms = jvms.into_iter();
    let (first, second, third) = (
        jvms.next().unwrap(),
        jvms.next().unwrap(),
        jvms.next().unwrap(),
    );
    // Killed without the test's own clean-up of its map.
    let gone = |jvm: java::Jvm| {
        let mut w = jvm.workload;
        let _ = w.child.kill();
        let _ = w.child.wait();
        std::mem::forget(jvm.map_cleanup);
        let _ = fs::remove_file(format!("/tmp/.java_pid{}", jvm.pid));
    };
    gone(second);
    gone(third);
    gone(first);
    let removed = within(Duration::from_secs(30), || {
        (!map_of(kept).exists()).then_some(())
    });
    let still = [
        (replaced, map_of(replaced).exists()),
        (other_owner, map_of(other_owner).exists()),
    ];
    for p in [map_of(kept), map_of(replaced), map_of(other_owner), aside] {
        let _ = fs::remove_file(p);
    }
    assert!(
        removed.is_some(),
        "the exited JVM's own perf map was left in /tmp"
    );
    assert_eq!(still, [(replaced, true), (other_owner, true)]);
}
