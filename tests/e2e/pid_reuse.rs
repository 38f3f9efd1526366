//! One pid, three programs: a JVM-looking process with a perf map exits,
//! a plain process takes its pid, then execs a JVM-looking program. No
//! cache of the daemon (JIT perf maps, Java frames, JVM reports, thread
//! names, pushed service names) may carry one program's state into the
//! next (root; under CI=true this fails rather than skips).

use std::{
    os::unix::process::CommandExt as _,
    process::Command,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::support::{
    pyroscope::{wait_for, Pyroscope},
    *,
};

/// Longest the first profiles may take (the daemon's first drains build
/// the host's unwind tables).
const FIRST: Duration = Duration::from_secs(180);
/// Longest anything after may take, on a busy host.
const SLACK: Duration = Duration::from_secs(60);

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `path?pid=P` since `from` (unix seconds) until now; empty until a
/// second after `from`.
fn since(url: &str, path: &str, pid: u32, from: f64) -> String {
    let until = now_unix();
    if until < from + 1.0 {
        return String::new();
    }
    let (status, body) = get(&format!(
        "{url}{path}?pid={pid}&from={from:.3}&until={until:.3}"
    ));
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// A shared object called `libjvm.so` (nothing in it): what makes a
/// process a HotSpot JVM by its maps.
fn fake_libjvm(dir: &std::path::Path) -> String {
    let src = dir.join("empty.c");
    std::fs::write(&src, "int wallscope_fake_jvm;\n").unwrap();
    let out = dir.join("libjvm.so");
    let status = Command::new("clang")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success());
    out.to_str().unwrap().to_string()
}

/// The services pushed with a window starting at or after `from`.
fn services_since(server: &Pyroscope, from: f64) -> Vec<String> {
    server
        .received()
        .into_iter()
        .filter(|r| r.window().0 as f64 / 1e9 >= from)
        .map(|r| r.label("service_name").to_string())
        .collect()
}

#[test]
fn a_reused_pid_and_an_exec_get_nothing_of_the_previous_program() {
    // Its own daemon (pushing) beside the shared one; the steps must each
    // finish within the 30 s a subscriber keeps an exited process.
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let server = Pyroscope::start();
    let daemon = server.daemon(&[]);
    let url = &daemon.url;
    let dir = tempfile::tempdir().unwrap();
    let libjvm = fake_libjvm(dir.path());
    let bin = workload("reused");
    let java = |role: &str, main: &str| {
        let mut cmd = Command::new(&bin);
        cmd.arg0("java")
            .args(["-cp", "x", main])
            .env("WS_ROLE", role)
            .env("WS_LIBJVM", &libjvm);
        cmd
    };

    // The first program: a JVM by its maps, its code named by its perf map.
    let old = Workload::spawn(java("old", "com.example.OldMain"));
    let pid = old.pid;
    wait_for(FIRST, "the old program's JIT frame and JVM report", || {
        let folded = since(url, "/folded", pid, now_unix() - 5.0);
        let threads = since(url, "/threads", pid, now_unix() - 5.0);
        (folded.contains("old_jit_frame") && threads.contains("\"jvm\"")).then_some(())
    });
    wait_for(SLACK, "the old program's service pushed", || {
        services_since(&server, 0.0)
            .iter()
            .any(|s| s == "com.example.OldMain")
            .then_some(())
    });
    drop(old);

    // Its pid, taken by a plain process of the same name with no perf map
    // (the old one's file is still in /tmp) and another main class.
    let mut launch = java("new", "com.example.NewMain");
    launch.env("WS_REUSE_PID", pid.to_string());
    let new = Workload::spawn(launch);
    assert_eq!(new.pid, pid, "the pid was reused");
    let new_from = now_unix() + 1.0;
    let (folded, threads) = wait_for(SLACK, "the new program's spinning thread", || {
        let threads = since(url, "/threads", pid, new_from);
        threads
            .contains("new-spin")
            .then(|| (since(url, "/folded", pid, new_from), threads))
    });
    assert!(!folded.contains("old_jit_frame"), "{folded}");
    assert!(!threads.contains("old-spin"), "{threads}");
    assert!(!threads.contains("\"jvm\""), "not a JVM: {threads}");
    let pushed = wait_for(SLACK, "the new program's service pushed", || {
        let services = services_since(&server, new_from);
        services.iter().any(|s| s == "reused").then_some(services)
    });
    assert!(
        !pushed.iter().any(|s| s.starts_with("com.example.")),
        "{pushed:?}"
    );

    // The same process execs a JVM-looking program with a perf map of its
    // own: its frames, report and service are the new program's.
    // SAFETY: kill has no memory effects.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGUSR1) }, 0);
    let exec_from = now_unix() + 1.0;
    let folded = wait_for(SLACK, "the exec'd program's JIT frame", || {
        let folded = since(url, "/folded", pid, exec_from);
        folded.contains("exec_jit_frame").then_some(folded)
    });
    assert!(!folded.contains("old_jit_frame"), "{folded}");
    wait_for(SLACK, "the exec'd program's JVM report", || {
        since(url, "/threads", pid, exec_from)
            .contains("\"jvm\"")
            .then_some(())
    });
    let pushed = wait_for(SLACK, "the exec'd program's service pushed", || {
        let services = services_since(&server, exec_from);
        services
            .iter()
            .any(|s| s == "com.example.ExecMain")
            .then_some(services)
    });
    assert!(
        !pushed
            .iter()
            .any(|s| s == "reused" || s == "com.example.OldMain"),
        "{pushed:?}"
    );
    // Its launcher's end takes it along (PDEATHSIG).
    drop(new);
}
