//! Shared slots no user can take from the others (issue 38, points 3 and
//! 4): `nobody`'s forged Python thread lists fill `python_threads`, yet a
//! Python process of user `daemon` started afterwards keeps its Python
//! frames; `nobody` looping back-to-back 30 s recordings does not keep
//! root from `/trace`, and a recording whose client hangs up stops.
//! Needs root and eBPF.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::support::{
    get,
    memcg::ConfinedDaemon,
    rows::{folded_at, json_at, show, within},
    settle, users, Fixture, Workload, CATCH_UP,
};

/// Attackers, and the forged thread states each splices into its list:
/// together exactly `python_threads`' 65,536 entries.
const ATTACKERS: usize = 16;
const FORGED: usize = 4096;
/// The user the victims run as.
const DAEMON_UID: u32 = 1;
/// The issue's bound on root's wait for `/trace` while a user hogs it.
const ROOT_WITHIN: Duration = Duration::from_secs(10);

/// The distribution's CPython (a static 3.11 on Debian 12).
const PYTHON: &str = "/usr/bin/python3";

/// `tests/workloads/python/NAME` copied into `dir`, readable by all.
fn script_in(name: &str, dir: &Path) -> PathBuf {
    let to = dir.join(name);
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads/python")
        .join(name);
    std::fs::copy(from, &to).unwrap();
    to
}

fn python_stats(url: &str) -> Value {
    json_at(url, "/healthz")["pipeline"]["unwind"]["python"].clone()
}

#[test]
fn forged_python_threads_of_one_user_leave_another_users_python_its_frames() {
    let Some(_fx) = Fixture::ebpf_alone() else {
        return;
    };
    let mut ws = ConfinedDaemon::start(&[]);
    let url = ws.url().to_string();
    settle(&url);
    let dir = users::shared_dir("py-shares", 0o777);
    let forger = script_in("forged_threads.py", &dir);
    let attackers: Vec<Workload> = (0..ATTACKERS)
        .map(|_| {
            let mut cmd = users::as_nobody(PYTHON);
            cmd.arg(&forger).arg(FORGED.to_string());
            Workload::spawn(cmd)
        })
        .collect();
    // Every forged thread read: registered, or refused for the share.
    let full = (ATTACKERS * FORGED) as u64;
    let filled = within(CATCH_UP, || {
        let py = python_stats(&url);
        let n = |k: &str| py[k].as_u64().unwrap_or(0);
        (n("threads") + n("threads_left_out") >= full).then_some(py)
    });
    let filled = filled.unwrap_or_else(|| {
        panic!(
            "nobody's forged threads were never all read: {}",
            python_stats(&url)
        )
    });
    println!("python_threads after the attack: {filled}");
    assert!(
        filled["threads"].as_u64().unwrap_or(0) >= (ATTACKERS * FORGED / 2) as u64,
        "the attack took less than half the map: {filled}"
    );

    let victim_script = script_in("tight.py", &dir);
    let mut cmd = users::as_user(DAEMON_UID, PYTHON);
    cmd.arg(&victim_script)
        .args(["--block", "--depth", "5", "--out"])
        .arg(dir.join("tight.json"));
    let victim = Workload::spawn(cmd);
    // Room is taken back from nobody as the victim registers: the degraded
    // marker names an attacker (for a minute).
    let named = within(CATCH_UP, || {
        let degraded = json_at(&url, "/healthz")["degraded"].to_string();
        attackers
            .iter()
            .any(|a| degraded.contains(&format!("pid {} (", a.pid)))
            .then_some(degraded)
    });
    assert!(
        named.is_some(),
        "no attacker named as degraded: {}",
        json_at(&url, "/healthz")["degraded"]
    );
    let query = format!("pid={}&seconds=5", victim.pid);
    let is_py =
        |f: &String, name: &str| f.ends_with("_[py]") && f.starts_with(&format!("{name} ("));
    let framed = within(CATCH_UP, || {
        let rows = folded_at(&url, &query);
        rows.iter()
            .any(|(stack, _)| {
                stack.iter().any(|f| is_py(f, "bottom")) && stack.iter().any(|f| is_py(f, "level"))
            })
            .then_some(())
    });
    assert!(
        framed.is_some(),
        "user daemon's Python process lost its Python frames behind nobody's forged threads \
         ({}): {}",
        python_stats(&url),
        show(&folded_at(&url, &query))
    );

    let health = json_at(&url, "/healthz");
    let py = &health["pipeline"]["unwind"]["python"];
    assert!(
        py["threads_taken_back"].as_u64().unwrap_or(0) > 0,
        "no entry taken back from nobody: {py}"
    );
    assert!(
        health["refused"]["python"]["budget"].as_u64().unwrap_or(0) > 0,
        "{}",
        health["refused"]
    );
    ws.assert_survived("16 forged thread lists");
}

/// A shell of `nobody`'s running `script` with `$URL` set, in a process
/// group of its own (its `curl`s die with it).
fn nobody_shell(url: &str, script: &str) -> Child {
    let mut cmd = users::as_nobody("sh");
    cmd.args(["-c", script])
        .env("URL", url)
        .stdout(Stdio::piped())
        .process_group(0);
    cmd.spawn().unwrap()
}

fn kill_group(child: &mut Child) {
    // SAFETY: kill has no memory preconditions; the group is the child's
    // (process_group(0)), not reaped yet.
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    let _ = child.wait();
}

fn trace_stats(url: &str) -> Value {
    json_at(url, "/healthz")["trace"].clone()
}

/// Waits until a recording runs (or waits) on the daemon at `url`.
fn recording(url: &str) -> bool {
    within(Duration::from_secs(30), || {
        (trace_stats(url)["queued"].as_u64().unwrap_or(0) > 0).then_some(())
    })
    .is_some()
}

#[test]
fn root_gets_the_recorder_while_a_user_hogs_it_and_a_hang_up_frees_it() {
    let Some(fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = fx.daemon();
    let mut hog = nobody_shell(
        url,
        r#"while :; do curl -s -o /dev/null "$URL/trace?pid=$$&seconds=30"; done"#,
    );
    let me = std::process::id();
    for round in 0..3 {
        assert!(recording(url), "nobody's recording never started");
        let asked = Instant::now();
        let (status, body) = get(&format!("{url}/trace?pid={me}&seconds=1"));
        let took = asked.elapsed();
        assert_eq!(status, 200, "round {round}: {body}");
        assert!(
            took < ROOT_WITHIN,
            "round {round}: root waited {took:?} for /trace behind nobody's recordings"
        );
        println!("round {round}: root's 1 s trace in {took:?}");
    }
    let stats = trace_stats(url);
    assert!(stats["preempted"].as_u64().unwrap_or(0) >= 1, "{stats}");

    // nobody's client hangs up mid-recording: the recording stops, and
    // the recorder (and nobody's one place in its queue) is free at once.
    assert!(recording(url), "nobody's recording never started");
    let cancelled = stats["cancelled"].as_u64().unwrap_or(0);
    kill_group(&mut hog);
    let hung_up = Instant::now();
    let freed = within(ROOT_WITHIN, || {
        (trace_stats(url)["queued"].as_u64() == Some(0)).then_some(())
    });
    assert!(
        freed.is_some(),
        "the recording went on after its client hung up: {}",
        trace_stats(url)
    );
    let mut next = nobody_shell(
        url,
        r#"curl -s -o /dev/null -w '%{http_code}' "$URL/trace?pid=$$&seconds=1""#,
    );
    let mut code = String::new();
    std::io::Read::read_to_string(next.stdout.as_mut().unwrap(), &mut code).unwrap();
    let _ = next.wait();
    let took = hung_up.elapsed();
    assert_eq!(code, "200", "nobody's next recording after a hang-up");
    assert!(
        took < 2 * ROOT_WITHIN,
        "nobody's next recording took {took:?} after the hang-up"
    );
    let stats = trace_stats(url);
    assert!(
        stats["cancelled"].as_u64().unwrap_or(0) > cancelled,
        "{stats}"
    );
}
