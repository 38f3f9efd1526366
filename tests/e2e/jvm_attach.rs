//! The first contact with a JVM, alone ([`Fixture::ebpf_alone`]: no other
//! test runs and no shared daemon) so that no other daemon attaches to the
//! JVM first: a JVM of another user, started with
//! only `-XX:+PreserveFramePointer`, gets its perf map written and its
//! Java methods named within 30 s of wallscope being up (past its first
//! drains), on an attach worker that stays. Needs root and a JDK.

use std::time::{Duration, Instant};

use crate::support::{
    java::{self, JavaRun},
    rows::{folded_at, named_pool_stack, show, within},
    settle, Daemon, Fixture,
};

#[test]
fn jvm_of_another_user_shows_named_java_stacks_within_30s() {
    let Some(_fx) = Fixture::ebpf_alone().filter(|_| java::jdk_available()) else {
        return;
    };
    let started_at = std::time::SystemTime::now();
    let jvm = JavaRun::default().start("Pools", &["60", "1"]);
    // The JVM runs before wallscope starts: nothing asked it for a map yet.
    // A map older than it is an earlier process's with the same pid (the
    // suite's thread and process storms reuse pids; a killed daemon
    // leaves its JVMs' maps behind): not this JVM's, so out of the way.
    let map = std::path::PathBuf::from(format!("/tmp/perf-{}.map", jvm.pid));
    if let Ok(meta) = std::fs::metadata(&map) {
        if meta.modified().is_ok_and(|m| m < started_at) {
            let _ = std::fs::remove_file(&map);
        }
    }
    assert!(
        !map.exists(),
        "{} written before wallscope ran",
        map.display()
    );
    let ws = Daemon::start(&[]);
    // Its first drains read every process on the host: on a busy host that
    // alone can take longer than 30 s. The clock starts once they are done.
    settle(&ws.url);
    let started = Instant::now();
    let query = format!("pid={}&kind=cpu&seconds=10", jvm.pid);
    let mut last = Vec::new();
    let stack = within(Duration::from_secs(30), || {
        last = folded_at(&ws.url, &query);
        named_pool_stack(&last)
    });
    let stack = stack.unwrap_or_else(|| {
        panic!(
            "no named Java stack from the worker loop within 30 s; top rows:\n{}",
            show(&last)
        )
    });
    eprintln!(
        "named after {:.1} s: {}",
        started.elapsed().as_secs_f64(),
        stack.join(";")
    );
    // Interpreted frames and stubs are labelled, not unknown.
    let rows = folded_at(&ws.url, &query);
    let from_thread_start: Vec<&Vec<String>> = rows
        .iter()
        .map(|r| &r.0)
        .filter(|s| s.iter().any(|f| f == "start_thread"))
        .collect();
    assert!(!from_thread_start.is_empty());
    // Labelled either by the perf map (`Interpreter`) or, once the JVM's own
    // structures are read, by method name with the interpreted mark `_[0]`.
    let interpreted = |f: &String| f == "Interpreter" || f.ends_with("_[0]");
    assert!(
        from_thread_start.iter().any(|s| s.iter().any(interpreted)),
        "Thread.run runs interpreted: expected `Interpreter` or `_[0]` frames\n{}",
        show(&rows)
    );
    let weight = |unknown: bool| -> u64 {
        rows.iter()
            .filter(|r| r.0.iter().any(|f| f == "start_thread"))
            .filter(|r| !unknown || r.0.iter().any(|f| f == "[unknown]"))
            .map(|r| r.1)
            .sum()
    };
    assert!(
        weight(true) * 20 < weight(false),
        "[unknown] frames in over 5 % of Java thread stacks:\n{}",
        show(&rows)
    );

    // Frames from the VM's structures can name methods before the attach
    // is even tried: the attach itself must also be done within the 30 s.
    let left = Duration::from_secs(30).saturating_sub(started.elapsed());
    let me = java::report_after_attach(&ws.url, jvm.pid, left).expect("the JVM in /processes");
    assert_eq!(me["attach"], "attached", "{me}");
    assert_eq!(me["preserve_frame_pointer"], true, "{me}");
    assert!(me["perf_map_writes"].as_u64().unwrap() >= 1, "{me}");
    let map = std::fs::metadata(format!("/tmp/perf-{}.map", jvm.pid)).expect("perf map");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(map.uid(), java::USER, "the JVM itself wrote its map");
    // The attach ran on a worker that stays for the next jobs (a few at
    // most), not on a thread of its own that ended with it.
    let workers = threads_named(ws.pid(), "ws-jvm-attach");
    assert!(
        (1..=wallscope::jvm::turns::IN_FLIGHT).contains(&workers),
        "{workers} attach workers"
    );
    drop(jvm);
}

/// Threads of process `pid` named `name`.
fn threads_named(pid: u32, name: &str) -> usize {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the daemon's threads");
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}
