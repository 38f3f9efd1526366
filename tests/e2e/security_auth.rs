//! A local user other than root reads only their own processes from the
//! daemon's default loopback listener: `nobody`, with curl, gets its own
//! process's threads, a 403 naming the pid for root's, 403 for host-wide
//! answers, and a `/processes` without root's processes; root reads
//! everything as before. Needs root.

use std::{fs, path::PathBuf, time::Duration};

use crate::support::{
    get,
    rows::json_at,
    rows::within,
    settle,
    users::{self, curl, NOBODY},
    Daemon, Fixture, Workload,
};

/// `mixed` where `nobody` can run it.
fn shared_workload() -> PathBuf {
    users::runnable_copy("mixed", &users::shared_dir("auth", 0o755))
}

fn pids_of(body: &str) -> Vec<u64> {
    let rows: serde_json::Value = serde_json::from_str(body).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["pid"].as_u64())
        .collect()
}

#[test]
fn a_local_user_reads_only_their_own_processes() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let ws = Daemon::start(&[]);
    settle(&ws.url);
    let bin = shared_workload();
    let root_w = Workload::start(&bin, &["120"]);
    let mut cmd = users::as_nobody(&bin);
    cmd.arg("120");
    let nobody_w = Workload::spawn(cmd);
    let (root_pid, nobody_pid) = (root_w.pid as u64, nobody_w.pid as u64);
    let url = &ws.url;

    // Root sees both, as the test's own client and as curl.
    let both = within(Duration::from_secs(180), || {
        let (status, body) = curl(&format!("{url}/processes?seconds=60"), false);
        assert_eq!(status, 200, "{body}");
        let pids = pids_of(&body);
        (pids.contains(&root_pid) && pids.contains(&nobody_pid)).then_some(())
    });
    assert!(
        both.is_some(),
        "root never saw both workloads in /processes"
    );
    for path in [
        format!("/threads?pid={nobody_pid}"),
        format!("/threads?pid={root_pid}"),
        "/folded".to_string(),
        "/metrics".to_string(),
    ] {
        let (status, body) = curl(&format!("{url}{path}"), false);
        assert_eq!(status, 200, "root {path}: {body}");
    }

    let forbidden_before = json_at(url, "/healthz")["refused"]["client"]["forbidden"]
        .as_u64()
        .unwrap();
    // Nobody: its own process...
    let (status, body) = curl(&format!("{url}/threads?pid={nobody_pid}"), true);
    assert_eq!(status, 200, "nobody's own threads: {body}");
    let own: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(own["pid"].as_u64(), Some(nobody_pid), "{body}");
    let (status, body) = curl(&format!("{url}/folded?pid={nobody_pid}&kind=wall"), true);
    assert_eq!(status, 200, "nobody's own folded: {body}");
    let (status, body) = curl(&format!("{url}/explain?pid={nobody_pid}"), true);
    assert_eq!(status, 200, "nobody's own findings: {body}");
    // ...and not root's, nor the host's.
    let refused = [
        format!("/threads?pid={root_pid}"),
        format!("/folded?pid={root_pid}"),
        format!("/flamegraph?pid={root_pid}"),
        format!("/timeline?pid={root_pid}"),
        format!("/runqueue?pid={root_pid}"),
        format!("/explain?pid={root_pid}"),
        "/explain".to_string(),
        "/folded".to_string(),
        "/flamegraph".to_string(),
        "/pprof".to_string(),
        "/runqueue".to_string(),
        "/runqueue?cgroup=all".to_string(),
        "/blocked".to_string(),
        "/metrics".to_string(),
    ];
    for path in &refused {
        let (status, body) = curl(&format!("{url}{path}"), true);
        assert_eq!(status, 403, "nobody {path}: {body}");
        assert!(body.contains("forbidden"), "nobody {path}: {body}");
    }
    let (_, body) = curl(&format!("{url}/threads?pid={root_pid}"), true);
    assert!(body.contains(&format!("pid {root_pid}")), "{body}");
    // Its process list holds its own process (once a slice that began
    // after the process started holds it: a coarser one reaching back
    // before its start may be an earlier owner's pid) and none of root's.
    let mut body = String::new();
    let own_listed = within(Duration::from_secs(60), || {
        let (status, answer) = curl(&format!("{url}/processes?seconds=60"), true);
        assert_eq!(status, 200, "{answer}");
        body = answer;
        pids_of(&body).contains(&nobody_pid).then_some(())
    });
    let listed = pids_of(&body);
    assert!(own_listed.is_some(), "{listed:?}");
    assert!(!listed.contains(&root_pid), "{listed:?}");
    for pid in &listed {
        // Processes that have exited since (nobody's curls) cannot be
        // checked here; the daemon checked them when it answered.
        let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        assert!(
            status
                .lines()
                .any(|l| l.starts_with(&format!("Uid:\t{NOBODY}\t"))),
            "nobody was shown pid {pid}, not its own"
        );
    }
    // Pages and health stay open.
    for path in ["/", "/healthz", "/ui/common.js"] {
        assert_eq!(curl(&format!("{url}{path}"), true).0, 200, "{path}");
    }
    let forbidden = json_at(url, "/healthz")["refused"]["client"]["forbidden"]
        .as_u64()
        .unwrap();
    assert!(
        forbidden > forbidden_before + refused.len() as u64,
        "refusals not counted: {forbidden_before} -> {forbidden}"
    );
    // Root still reads root's process.
    let (status, body) = get(&format!("{url}/threads?pid={root_pid}"));
    assert_eq!(status, 200, "{body}");
    drop((root_w, nobody_w));
    let _ = fs::remove_dir_all(bin.parent().unwrap());
}

#[test]
fn local_auth_off_lets_every_local_user_read_everything() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let ws = Daemon::start(&["--local-auth", "off"]);
    let (status, body) = curl(&format!("{}/metrics", ws.url), true);
    assert_eq!(status, 200, "{body}");
}
