//! Java frames from the JVM's own structures on every JVM, however its
//! start falls against the daemon's (issue #28): a JVM seen while it loads
//! libjvm has not filled its tables yet, and reading them then must only
//! put the read off, never lose the JVM's frames for good. JDK 17 and
//! HotSpot 25 JVMs, with no flag at all, start just before the daemon and
//! 0, 0.1, 0.5 and 1 s after it (while it loads its programs), and 0 and
//! 1 s after it answers; two more, 2 s after it answers, have their loader
//! stalled for 2 s between mapping libjvm and filling it in
//! (`tests/workloads/slow_loader.c`), so that the daemon finds them in
//! that window every time. Each must show named Java frames read through
//! `vm_structures` within [`WITHIN`] of both being up (the daemon: once it
//! has symbolized its first batch).

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    thread,
    time::{Duration, Instant},
};

use crate::support::{
    java::{self, JavaRun, Jdk, Jvm},
    rows::{folded_at, json_at, within},
    users, workload_variant, Daemon, Fixture, CATCH_UP,
};

/// How soon each JVM must show its frames, from the moment it and the
/// daemon both run (the bound).
const WITHIN: Duration = Duration::from_secs(10);

/// How long the slow loader stalls (`WALLSCOPE_TEST_STALL_MS`).
const STALL: Duration = Duration::from_secs(2);

/// When a JVM starts, against the daemon.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// Just before the daemon is started.
    Before,
    /// This long after the daemon is started (it is still loading).
    AfterSpawn(Duration),
    /// This long after the daemon first answers.
    AfterReady(Duration),
    /// 2 s after the daemon answers (it watches new processes by then),
    /// with libjvm mapped [`STALL`] before it is filled in.
    SlowLoader,
}

const STARTS: [Start; 8] = [
    Start::Before,
    Start::AfterSpawn(Duration::ZERO),
    Start::AfterSpawn(Duration::from_millis(100)),
    Start::AfterSpawn(Duration::from_millis(500)),
    Start::AfterSpawn(Duration::from_secs(1)),
    Start::AfterReady(Duration::ZERO),
    Start::AfterReady(Duration::from_secs(1)),
    Start::SlowLoader,
];

/// A JVM running `Starve` (one CPU-bound thread), with no flag: what an
/// SRE finds in production; with its loader stalled at libjvm if `slow`.
fn start_jvm(jdk: Jdk, slow: bool) -> (Jvm, Instant) {
    let started = Instant::now();
    let env = if slow {
        vec![
            ("LD_AUDIT".to_string(), slow_loader().display().to_string()),
            (
                "WALLSCOPE_TEST_STALL_MS".to_string(),
                STALL.as_millis().to_string(),
            ),
        ]
    } else {
        Vec::new()
    };
    let jvm = JavaRun {
        jdk,
        no_frame_pointer: true,
        jvm_opts: vec!["-XX:+UseSerialGC".into(), "-Xmx64m".into()],
        env,
        ..JavaRun::default()
    }
    .start("Starve", &["300", "1"]);
    // Else the window was never held open and the test proves nothing.
    assert!(
        !slow || started.elapsed() >= STALL,
        "{jdk:?}: the loader was not stalled ({:?})",
        started.elapsed()
    );
    (jvm, Instant::now())
}

/// The loader-stalling audit module, where the JVMs' user can read it.
fn slow_loader() -> PathBuf {
    let out = users::shared_dir("loader", 0o755).join("slow_loader.so");
    if !out.exists() {
        let built = workload_variant("slow_loader", "slow_loader.so", &["-shared", "-fPIC"]);
        fs::copy(built, &out).unwrap();
        fs::set_permissions(&out, fs::Permissions::from_mode(0o755)).unwrap();
    }
    out
}

/// True once JVM `pid` reports frames read through its structures and its
/// CPU rows hold a named `Starve` method.
fn has_structure_frames(url: &str, pid: u32) -> bool {
    // Whether or not its attach is done: frames do not wait for it.
    let processes = json_at(url, "/processes?seconds=60");
    let from_structures = processes.as_array().is_some_and(|all| {
        all.iter().any(|p| {
            p["pid"] == pid
                && p["jvm"]["frames"]
                    .as_str()
                    .is_some_and(|f| f.starts_with("vm_structures"))
        })
    });
    from_structures
        && folded_at(url, &format!("pid={pid}&kind=cpu&seconds=10"))
            .iter()
            .any(|(stack, _)| stack.iter().any(|f| f.starts_with("Starve.")))
}

crate::on_both_jdks!(every_jvm_gets_structure_frames_whenever_it_starts);

/// One JDK at a time: eight JVMs starting at once are load enough for two
/// CPUs.
fn every_jvm_gets_structure_frames_whenever_it_starts(jdk: Jdk) {
    let jdks = [jdk];
    let Some(_fx) = Fixture::ebpf_alone().filter(|_| jdk.available()) else {
        return;
    };
    // Each JVM starts from its own thread, at its time, whatever the
    // others' starts cost.
    slow_loader();
    let launch = |jdk: Jdk, at: Instant, slow: bool| {
        thread::spawn(move || {
            thread::sleep(at.saturating_duration_since(Instant::now()));
            start_jvm(jdk, slow)
        })
    };
    let mut launched = Vec::new();
    for jdk in jdks {
        launched.push((jdk, Start::Before, launch(jdk, Instant::now(), false)));
    }
    // Started once its launch has begun: "just before" the daemon.
    thread::sleep(Duration::from_millis(20));
    let spawned = Instant::now();
    let ws = Daemon::spawn(&[]);
    for start in STARTS {
        if let Start::AfterSpawn(after) = start {
            for jdk in jdks {
                launched.push((jdk, start, launch(jdk, spawned + after, false)));
            }
        }
    }
    ws.wait_ready();
    let ready = Instant::now();
    for start in STARTS {
        let (at, slow) = match start {
            Start::AfterReady(after) => (ready + after, false),
            Start::SlowLoader => (ready + Duration::from_secs(2), true),
            _ => continue,
        };
        for jdk in jdks {
            launched.push((jdk, start, launch(jdk, at, slow)));
        }
    }
    // A daemon's first batch waits for the unwind tables of every binary
    // on the host, whatever runs: its own start, not any JVM's, so the
    // clock starts after it (seconds, for the tests' debug build).
    let first_batch = within(CATCH_UP, || {
        let h = json_at(&ws.url, "/healthz");
        (h["pipeline"]["symbolized_batches"].as_u64() >= Some(1)).then(Instant::now)
    })
    .expect("the daemon never symbolized a batch");
    eprintln!(
        "first batch {:.1?} after the daemon answered",
        first_batch - ready
    );
    let jvms: Vec<(Jdk, Start, Jvm, Instant)> = launched
        .into_iter()
        .map(|(jdk, start, handle)| {
            let (jvm, up) = handle.join().expect("starting a JVM");
            (jdk, start, jvm, up.max(first_batch))
        })
        .collect();

    // Polled round by round, so that each JVM's time is when it was
    // first seen with its frames, not when the loop got to it.
    let mut seen: Vec<Option<Duration>> = vec![None; jvms.len()];
    let last_deadline = jvms.iter().map(|j| j.3).max().unwrap() + WITHIN;
    while seen.iter().any(Option::is_none) && Instant::now() < last_deadline {
        for (i, (_, _, jvm, up)) in jvms.iter().enumerate() {
            if seen[i].is_none() && has_structure_frames(&ws.url, jvm.pid) {
                seen[i] = Some(up.elapsed());
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
    let mut late = Vec::new();
    for ((jdk, start, jvm, _), took) in jvms.iter().zip(&seen) {
        eprintln!("{jdk:?} started {start:?}: frames after {took:.1?}");
        if took.is_none_or(|t| t > WITHIN) {
            late.push(format!(
                "{jdk:?} started {start:?} (pid {}, {took:.1?}): {}",
                jvm.pid,
                java::jvm_report(&ws.url, jvm.pid).unwrap_or_default()
            ));
        }
    }
    assert!(
        late.is_empty(),
        "no frames through the JVM's structures within {WITHIN:?}:\n{}",
        late.join("\n")
    );
}
