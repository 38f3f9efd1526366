//! `deploy/`: the systemd unit passes `systemd-analyze verify` and scores
//! ≤ 5.0 in `systemd-analyze security`; the DaemonSet validates offline
//! against Kubernetes' schemas; the daemon runs under exactly the unit's
//! capabilities, and with any one of them removed it says what is off, or
//! refuses naming it (root; under CI=true these fail rather than skip).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::support::{caps, *};
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The unit with `ExecStart` pointing at the binary under test (verify
/// wants it to exist), in a temporary directory.
fn unit_for_test(dir: &Path) -> PathBuf {
    let unit = std::fs::read_to_string(repo("deploy/wallscope.service")).unwrap();
    let unit = unit.replace("/usr/local/bin/wallscope", env!("CARGO_BIN_EXE_wallscope"));
    let path = dir.join("wallscope.service");
    std::fs::write(&path, unit).unwrap();
    path
}

fn systemd_analyze(args: &[&str]) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .args(args)
        .env("SYSTEMD_PAGER", "cat")
        .env("SYSTEMD_COLORS", "0")
        .output()
        .expect("systemd-analyze (scripts/deps.sh installs systemd)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn the_unit_verifies_and_scores_at_most_5() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for_test(dir.path());
    let unit = unit.to_str().unwrap();
    let (ok, text) = systemd_analyze(&["verify", unit]);
    assert!(ok && text.trim().is_empty(), "verify:\n{text}");
    let score = exposure(unit);
    println!("systemd-analyze security: {score}");
    assert!(score <= 5.0, "exposure {score} > 5.0:\n{text}");
    // A unit without the hardening scores worse: the measure can fail.
    let bare = dir.path().join("bare.service");
    std::fs::write(
        &bare,
        format!("[Service]\nExecStart={}\n", env!("CARGO_BIN_EXE_wallscope")),
    )
    .unwrap();
    let bare = exposure(bare.to_str().unwrap());
    assert!(bare > score + 2.0, "bare unit {bare} vs {score}");
}

/// `systemd-analyze security`'s overall exposure of `unit`.
fn exposure(unit: &str) -> f64 {
    let (_, text) = systemd_analyze(&["security", "--offline=true", "--no-pager", unit]);
    text.lines()
        .find_map(|l| {
            l.split_once("Overall exposure level for")?
                .1
                .split(':')
                .nth(1)
        })
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no score in:\n{text}"))
}

/// `kubernetes-validate --strict` over `file`: whether it passed.
fn kubernetes_validate(file: &Path) -> (bool, String) {
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .arg(file)
        .env("PYTHONPATH", "/opt/wallscope-kv")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !text.contains("No module named"),
        "kubernetes-validate is missing (scripts/deps.sh installs it): {text}"
    );
    (out.status.success() && !text.contains("ERROR"), text)
}

#[test]
fn the_daemonset_validates_offline() {
    let manifest = repo("deploy/kubernetes/daemonset.yaml");
    let (ok, text) = kubernetes_validate(&manifest);
    assert!(ok, "{text}");
    assert!(text.contains("daemonset/wallscope"), "{text}");
    // An unknown field fails: the check is strict.
    let yaml = std::fs::read_to_string(&manifest).unwrap();
    let broken = yaml.replacen("hostPID: true", "hostPID: true\n      hostPIDs: true", 1);
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, broken).unwrap();
    let (ok, text) = kubernetes_validate(&bad);
    assert!(!ok, "a misspelt field passed:\n{text}");
    // The pod asks for the unit's capabilities, no more.
    let unit: Vec<String> = caps::unit_caps()
        .iter()
        .map(|c| format!("- {}", c.trim_start_matches("CAP_")))
        .collect();
    for cap in &unit {
        assert!(
            yaml.contains(cap.as_str()),
            "{cap} not added in the DaemonSet"
        );
    }
    assert!(yaml.contains("drop: [\"ALL\"]") && yaml.contains("hostPID: true"));
}

/// `wallscope serve` under `caps`: its stderr and, if it answered, its
/// `/healthz`; the daemon is stopped before returning.
fn serve_with(caps_set: &[String]) -> (Option<Value>, String, Option<u64>) {
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wallscope"));
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")]);
    let mut child = caps::under(caps_set, &cmd)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut health = None;
    let mut effective = None;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        let (status, body) = get(&format!("{url}/healthz"));
        if status == 200 {
            let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
            effective = status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .map(|h| u64::from_str_radix(h.trim(), 16).unwrap());
            let (folded, _) = get(&format!("{url}/folded?seconds=5"));
            assert!(folded == 200 || folded == 404, "/folded answered {folded}");
            health = Some(serde_json::from_str(&body).unwrap());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (health, stderr, effective)
}

#[test]
fn the_daemon_runs_under_the_units_capabilities_and_names_any_missing() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let (granted, withheld) = caps::grantable(&caps::unit_caps());
    println!("granted {granted:?}; this machine withholds {withheld:?}");
    let (health, stderr, effective) = serve_with(&granted);
    let health = health.unwrap_or_else(|| panic!("did not start:\n{stderr}"));
    let missing: Vec<&str> = health["capabilities"]["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cap"].as_str().unwrap())
        .collect();
    assert_eq!(missing, withheld, "{}", health["capabilities"]);
    let effective = effective.unwrap();
    assert_eq!(
        effective.count_ones() as usize,
        granted.len(),
        "{effective:x}"
    );

    for cap in &granted {
        let fewer: Vec<String> = granted.iter().filter(|c| *c != cap).cloned().collect();
        let (health, stderr, _) = serve_with(&fewer);
        match health {
            Some(h) => {
                let caps = &h["capabilities"]["missing"];
                let named =
                    caps.as_array().unwrap().iter().any(|c| {
                        c["cap"] == cap.as_str() && !c["off"].as_str().unwrap().is_empty()
                    });
                assert!(named, "{cap} removed, /healthz says {caps}");
                assert!(
                    stderr.contains(&format!("{cap} missing")),
                    "{cap}: {stderr}"
                );
            }
            None => assert!(stderr.contains(cap.as_str()), "{cap} removed: {stderr}"),
        }
    }
}
