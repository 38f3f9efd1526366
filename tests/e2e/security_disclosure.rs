//! Least disclosure (issue #38, point 5): what `nobody` reads about its
//! own process names no other user's process. Processes of `daemon`
//! (uid 1) keep nobody's spinning thread off CPU 0, wake its reading
//! thread through a FIFO, and walk a binary without unwind tables (listed
//! in `/healthz`). Root's answers name them; nobody's `/runqueue`,
//! `/threads`, `/blocked`, `/healthz` and `/processes` hold no pid, name
//! or path of theirs, and `[other users] ×N` instead. Then a pid of uid
//! 1's process is taken by a process of nobody's: nobody's `/processes`
//! row for it holds its own process's time only. Needs root.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;

use crate::support::{
    rows::{json_at, within},
    settle,
    users::{self, curl},
    workload, Fixture, Workload,
};

/// The victims' program (and so process) name.
const VICTIM: &str = "victim-disclose";
/// Nobody's program name.
const OWN: &str = "own-disclose";
/// The victims' user.
const DAEMON_UID: u32 = 1;
/// Longest the daemon may take to show what the workloads do (its first
/// drains, on a busy host, in a debug build).
const SHOWN: Duration = Duration::from_secs(180);

/// `bin` copied into `dir` as `name`, runnable by every user.
fn runnable(bin: &Path, dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    fs::copy(bin, &to).unwrap();
    fs::set_permissions(&to, fs::Permissions::from_mode(0o755)).unwrap();
    to
}

/// `bin args...` run as `uid`, started.
fn start_as(uid: u32, bin: &Path, args: &[&str]) -> Workload {
    let mut cmd = users::as_user(uid, bin);
    cmd.args(args);
    Workload::spawn(cmd)
}

/// Where `answer` names one of `pids` or `names`: a `pid`/`pids`/
/// `parent_pid` field, a text saying `pid N`, or a name or path in any
/// text. `None` when it names none.
fn named(answer: &Value, pids: &[u32], names: &[&str]) -> Option<String> {
    let pid_in = |v: &Value| v.as_u64().is_some_and(|p| pids.contains(&(p as u32)));
    match answer {
        Value::Object(fields) => fields.iter().find_map(|(k, v)| {
            let hit = match k.as_str() {
                "pid" | "parent_pid" => pid_in(v),
                "pids" => v.as_array().is_some_and(|a| a.iter().any(pid_in)),
                _ => false,
            };
            if hit {
                return Some(format!("{k}: {v}"));
            }
            named(v, pids, names).map(|at| format!("{k}.{at}"))
        }),
        Value::Array(items) => items.iter().find_map(|v| named(v, pids, names)),
        Value::String(s) => {
            let says_pid = pids.iter().any(|p| {
                ["pid ", "pid="]
                    .iter()
                    .any(|pre| s.split(pre).skip(1).any(|rest| number_at(rest) == Some(*p)))
            });
            (says_pid || names.iter().any(|n| s.contains(n))).then(|| s.clone())
        }
        _ => None,
    }
}

/// The number `text` starts with.
fn number_at(text: &str) -> Option<u32> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Whether some string in `answer` starts with the count of others.
fn counts_others(answer: &Value) -> bool {
    match answer {
        Value::Object(fields) => fields.values().any(counts_others),
        Value::Array(items) => items.iter().any(counts_others),
        Value::String(s) => s.starts_with("[other users] ×"),
        _ => false,
    }
}

/// `path` as nobody: must answer 200 with JSON.
fn nobody_json(url: &str, path: &str) -> Value {
    let (status, body) = curl(&format!("{url}{path}"), true);
    assert_eq!(status, 200, "nobody {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// The culprit names of root's `/runqueue?pid=`.
fn culprit_names(url: &str, pid: u32) -> Vec<String> {
    let r = json_at(url, &format!("/runqueue?pid={pid}&seconds=30"));
    r["kept_off_cpu_by"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| c["name"].as_str())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Every `woken_by` waker of root's `/threads?pid=`.
fn wakers(url: &str, pid: u32) -> Vec<String> {
    let r = json_at(url, &format!("/threads?pid={pid}&seconds=30"));
    let threads = r["threads"].as_array().cloned().unwrap_or_default();
    threads
        .iter()
        .filter_map(|t| t["sleeps"]["woken_by"].as_array())
        .flatten()
        .filter_map(|w| w["by"].as_str().map(String::from))
        .collect()
}

#[test]
fn nobody_reads_other_users_processes_only_as_counts() {
    let Some(fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = fx.daemon();
    settle(url);
    let dir = users::shared_dir("disclosure", 0o755);
    let victim_bin = runnable(&workload("disclose"), &dir, VICTIM);
    let own_bin = runnable(&workload("disclose"), &dir, OWN);
    // Code of no ELF file: the hog walks it without an unwind table, and
    // `/healthz` lists it (pid, name, path).
    let code = dir.join(format!("{VICTIM}.code"));
    fs::write(&code, [0xc3u8; 4096]).unwrap();
    fs::set_permissions(&code, fs::Permissions::from_mode(0o644)).unwrap();
    let fifo = dir.join("wake.fifo");
    let _ = fs::remove_file(&fifo);
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    fs::set_permissions(&fifo, fs::Permissions::from_mode(0o666)).unwrap();
    let fifo = fifo.to_str().unwrap();

    let own = start_as(users::NOBODY, &own_bin, &["own", fifo, "150"]);
    let hog = start_as(
        DAEMON_UID,
        &victim_bin,
        &["hog", code.to_str().unwrap(), "150"],
    );
    let waker = start_as(DAEMON_UID, &victim_bin, &["waker", fifo, "150"]);
    let victims = [hog.pid, waker.pid];

    // Root: the hog is a culprit, the waker wakes, /healthz lists one.
    let seen = within(SHOWN, || {
        let culprit = culprit_names(url, own.pid).iter().any(|n| n == VICTIM);
        let woken = wakers(url, own.pid)
            .iter()
            .any(|w| w.starts_with(&format!("{VICTIM} (pid {}", waker.pid)));
        let health = json_at(url, "/healthz");
        let listed = named(
            &health["pipeline"]["unwind"]["missing"],
            &victims,
            &[VICTIM],
        );
        println!("root: culprit {culprit}, waker {woken}, /healthz {listed:?}");
        (culprit && woken && listed.is_some()).then_some(())
    });
    let missing = json_at(url, "/healthz")["pipeline"]["unwind"]["missing"].clone();
    assert!(
        seen.is_some(),
        "root never saw the victims named: {missing}"
    );

    // Nobody: the same answers name none of them, and count them once
    // its own process's window (from its start) holds them.
    let asked = [
        format!("/runqueue?pid={}&seconds=30", own.pid),
        format!("/threads?pid={}&seconds=30", own.pid),
        "/healthz".to_string(),
        "/processes?seconds=30".to_string(),
        format!("/blocked?pid={}&min_seconds=0", own.pid),
        "/processes?seconds=30&group=parent".to_string(),
        // Other users' names, command lines and executables are not
        // theirs to search.
        format!("/processes?seconds=30&name={VICTIM}"),
    ];
    let mut answers = Vec::new();
    let counted = within(SHOWN, || {
        answers = asked.iter().map(|path| nobody_json(url, path)).collect();
        for (path, answer) in asked.iter().zip(&answers) {
            if let Some(at) = named(answer, &victims, &[VICTIM]) {
                panic!("nobody's {path} names another user's process at {at}");
            }
        }
        let counts = [
            counts_others(&answers[0]["kept_off_cpu_by"]),
            counts_others(&answers[1]["threads"]),
            counts_others(&answers[2]["pipeline"]["unwind"]["missing"]),
            counts_others(&answers[3]),
        ];
        println!("nobody: culprits, wakers, /healthz, /processes counted: {counts:?}");
        counts.iter().all(|c| *c).then_some(())
    });
    assert!(
        counted.is_some(),
        "nobody's answers never counted the others: {answers:#?}"
    );
    drop((own, hog, waker));

    reused_pid_shows_only_its_own_process(url, &victim_bin, &own_bin);
    let _ = fs::remove_dir_all(&dir);
}

/// A spinning process of uid 1 ends; a sleeping process of nobody's takes
/// its pid. Root's `/processes` row for the pid holds the spinner's CPU
/// time; nobody's, its own process's only (no CPU to speak of).
fn reused_pid_shows_only_its_own_process(url: &str, victim_bin: &Path, own_bin: &Path) {
    let old = start_as(DAEMON_UID, victim_bin, &["spin", "150"]);
    let pid = old.pid;
    let row = |rows: &Value| -> Option<Value> {
        let rows = rows.as_array()?;
        rows.iter()
            .find(|r| r["pid"].as_u64() == Some(u64::from(pid)))
            .cloned()
    };
    let cpu_us = |r: &Value| r["time"]["cpu_us"].as_u64().unwrap_or(0);
    let spun = within(SHOWN, || {
        row(&json_at(url, "/processes?seconds=60")).filter(|r| cpu_us(r) >= 1_000_000)
    });
    assert!(spun.is_some(), "uid 1's spinner never showed 1 s of CPU");
    drop(old);

    // Launched by root (it sets ns_last_pid), run as nobody.
    let uid = users::NOBODY.to_string();
    let pid_arg = pid.to_string();
    let new = Workload::start(own_bin, &["reuse", &pid_arg, &uid, "150"]);
    assert_eq!(new.pid, pid, "the pid was reused");
    let mine = within(SHOWN, || row(&nobody_json(url, "/processes?seconds=60")));
    let mine = mine.expect("nobody's process never showed in its /processes");
    let root = row(&json_at(url, "/processes?seconds=60")).expect("root's row of the pid");
    println!("pid {pid}: root's row {root}, nobody's {mine}");
    assert_eq!(mine["comm"], OWN, "{mine}");
    assert!(
        cpu_us(&root) >= 1_000_000,
        "root's row lost the spinner: {root}"
    );
    assert!(
        cpu_us(&mine) < 500_000,
        "nobody's row holds the earlier process's CPU time: {mine}"
    );
    drop(new);
}
