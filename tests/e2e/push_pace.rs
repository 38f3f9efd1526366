//! `--push-url` against a server as slow as a real Pyroscope, which
//! answers a push only after its ~500 ms flush: forty busy processes are
//! pushed every 5 s for a minute without a profile dropped, the queue
//! stays short, the interval in progress at SIGTERM arrives, and a hung
//! server holds the exit no longer than `--push-grace` (root; under
//! CI=true this fails rather than skips).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::support::{
    java::Jdk,
    pyroscope::{wait_for, Mode, Pyroscope},
    *,
};

/// Busy processes, each a program of its own name (`busy-NN`).
const BUSY: usize = 40;
/// Intervals watched before SIGTERM: a minute of 5 s intervals.
const INTERVALS: u64 = 12;
/// How long the server takes to answer a request.
const FLUSH: Duration = Duration::from_millis(500);
/// Longest the first profiles may take: the daemons' first drains build
/// the host's unwind tables, slow for a debug build beside 41 spinners.
const FIRST: Duration = Duration::from_secs(240);
/// Requests in flight at once (`push::SENDERS`).
const SENDERS: u64 = wallscope::export::push::SENDERS as u64;

fn health(url: &str) -> serde_json::Value {
    let (status, body) = get(&format!("{url}/healthz"));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// The JDK's `libjvm.so`, found from its `java` launcher.
fn libjvm() -> PathBuf {
    let java = std::fs::canonicalize(Jdk::Default.java()).expect("the JDK's java");
    let home = java.parent().and_then(|bin| bin.parent()).unwrap();
    home.join("lib/server/libjvm.so")
}

#[test]
fn pushes_keep_pace_with_a_slow_server_and_the_last_interval_arrives() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    if !java::jdk_available() {
        return;
    }
    // Programs named busy-00..busy-39 (symlinks: the command name is the
    // link's), and one that maps libjvm without being `java`.
    let dir = tempfile::tempdir().unwrap();
    let spin = workload("cpu_shares");
    let busy: Vec<Workload> = (0..BUSY)
        .map(|i| {
            let link = dir.path().join(format!("busy-{i:02}"));
            std::os::unix::fs::symlink(&spin, &link).unwrap();
            Workload::start(&link, &["900"])
        })
        .collect();
    let jvm_lib = libjvm();
    let embedder = Workload::start(
        &workload("jvm_embedder"),
        &[jvm_lib.to_str().unwrap(), "900"],
    );
    let runs: Vec<(u64, Pyroscope, Daemon)> = [32, 100]
        .into_iter()
        .map(|top| {
            let server = Pyroscope::with_delay(FLUSH);
            let top_arg = top.to_string();
            let daemon = Daemon::start(&[
                "--push-url",
                &server.url(),
                "--push-interval",
                "5s",
                "--push-top",
                &top_arg,
            ]);
            (top, server, daemon)
        })
        .collect();

    // A minute of intervals after the first push.
    let first: Vec<u64> = runs
        .iter()
        .map(|(top, server, daemon)| {
            wait_for(FIRST, &format!("the first push at top {top}"), || {
                let n = health(&daemon.url)["push"]["intervals"].as_u64().unwrap();
                (!server.received().is_empty()).then_some(n)
            })
        })
        .collect();
    for ((top, _, daemon), first) in runs.iter().zip(&first) {
        wait_for(
            Duration::from_secs(INTERVALS * 5 + 120),
            &format!("{INTERVALS} intervals at top {top}"),
            || {
                let n = health(&daemon.url)["push"]["intervals"].as_u64().unwrap();
                (n >= first + INTERVALS).then_some(())
            },
        );
    }
    for (top, server, mut daemon) in runs {
        let push = health(&daemon.url)["push"].clone();
        println!("top {top}: push {push}; server {:?}", server.pace());
        // Nothing dropped, nothing failed; each interval was sent before
        // the next was built, in about a request per sender.
        assert_eq!(push["dropped_profiles"], 0, "top {top}: {push}");
        for (reason, n) in push["failed"].as_object().unwrap() {
            assert_eq!(n, 0, "top {top}: {reason} failures: {push}");
        }
        let max_queued = push["max_queued_requests"].as_u64().unwrap();
        assert!(max_queued <= 2 * SENDERS, "top {top}: {push}");
        let last = &push["last_interval"];
        assert!(
            last["send_s"].as_f64().unwrap() < 5.0,
            "top {top}: an interval took longer than the interval to send: {push}"
        );
        assert!(
            server.pace().max_in_flight > 1,
            "top {top}: {:?}",
            server.pace()
        );
        // Every profile sent arrived: counted between two intervals, when
        // nothing is queued or in flight.
        let (sent, arrived) = wait_for(Duration::from_secs(60), "a quiet moment", || {
            let push = health(&daemon.url)["push"].clone();
            let pace = server.pace();
            let quiet = push["queued_requests"] == 0
                && pace.in_flight == 0
                && push["sent_requests"].as_u64() == Some(pace.requests);
            let arrived = server.received().len() as u64;
            quiet.then(|| (push["sent_profiles"].as_u64().unwrap(), arrived))
        });
        assert_eq!(sent, arrived, "top {top}: profiles sent and arrived");

        // SIGTERM: the interval in progress is pushed before the exit.
        let term = unix_ns();
        let (took, status) = daemon
            .terminate(Duration::from_secs(60))
            .expect("the daemon did not exit within 60 s of SIGTERM");
        assert!(status.success(), "top {top}: exit {status:?}");
        assert!(server.invalid().is_empty(), "{:?}", server.invalid());
        let received = server.received();
        // Windows tile time: every interval arrived once, the last one
        // ending at the daemon's last drain, after SIGTERM.
        let mut services: BTreeMap<(i64, i64), BTreeSet<String>> = BTreeMap::new();
        for r in &received {
            services
                .entry(r.window())
                .or_default()
                .insert(r.label("service_name").to_string());
        }
        let windows: Vec<(i64, i64)> = services.keys().copied().collect();
        for pair in windows.windows(2) {
            assert_eq!(
                pair[0].1, pair[1].0,
                "top {top}: a gap or overlap: {pair:?}"
            );
        }
        let last_end = windows.last().unwrap().1;
        assert!(
            last_end >= term - 1_000_000_000,
            "top {top}: the last window ends {} ms before SIGTERM",
            (term - last_end) / 1_000_000
        );
        // Every interval's requests all arrived, the last one's too: each
        // window holds a profile or two of each process chosen (`top` at
        // 32, with 40 busy programs; others, a compiler, may outrank some),
        // and at top 100 every busy program. (A last window shorter than a
        // second may miss a process that had no sample in it.)
        let mut profiles: BTreeMap<(i64, i64), usize> = BTreeMap::new();
        for r in &received {
            *profiles.entry(r.window()).or_default() += 1;
        }
        for (window, names) in &services {
            if window.1 - window.0 < 1_000_000_000 {
                continue;
            }
            if top >= 100 {
                let busy_in = names.iter().filter(|s| s.starts_with("busy-")).count();
                assert_eq!(
                    busy_in, BUSY,
                    "top {top}: busy programs in {window:?}: {names:?}"
                );
                assert!(names.contains("jvm_embedder"), "{names:?}");
            } else {
                assert!(
                    profiles[window] >= top as usize,
                    "top {top}: {} profiles in {window:?}: {names:?}",
                    profiles[window]
                );
            }
            // A program mapping libjvm is named by its executable, not by
            // its arguments.
            assert!(
                !names.iter().any(|s| s.contains('/')),
                "top {top}: {names:?}"
            );
        }
        println!(
            "top {top}: {} windows, {} requests, exit {took:?} after SIGTERM",
            windows.len(),
            server.pace().requests
        );
    }

    // A hung server: the exit waits --push-grace, not the request's 10 s
    // timeout.
    drop((busy, embedder));
    let server = Pyroscope::start();
    server.set_mode(Mode::Hang);
    let mut daemon = Daemon::start(&[
        "--push-url",
        &server.url(),
        "--push-interval",
        "1s",
        "--push-grace",
        "1s",
    ]);
    wait_for(FIRST, "a request to hang", || {
        (server.requests_in(Mode::Hang) > 0).then_some(())
    });
    let (took, status) = daemon
        .terminate(Duration::from_secs(60))
        .expect("a hung server held the exit for 60 s");
    assert!(status.success(), "exit {status:?}");
    println!("hung server: exit {took:?} after SIGTERM with --push-grace 1s");
    // The grace and the pipeline's last drain (at most 0.8 s) with room
    // for a busy host, under the request timeout a wait for the hung
    // request would take.
    assert!(
        took < wallscope::export::push::send::TIMEOUT - Duration::from_secs(1),
        "{took:?}"
    );
}
