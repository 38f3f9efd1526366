//! `/pprof` and `wallscope record -o X.pb.gz`, read by `go tool pprof`
//! (root; under CI=true these fail rather than skip): every kind parses,
//! a pinned window's pprof total is its folded total, and
//! `-tagfocus=state=S` of the off-CPU profile is `kind=S`.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::support::*;

/// `go`, on the PATH or where Go's own installer puts it.
fn go() -> PathBuf {
    let found = ["go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"]
        .into_iter()
        .map(PathBuf::from)
        .find(|go| {
            Command::new(go)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    found.expect("go is needed to read pprof files (scripts/deps.sh installs golang-go)")
}

/// `go tool pprof -raw [extra] file`: the summed values of each sample
/// type, failing the test unless pprof reads the file.
fn pprof_raw(file: &Path, extra: &[&str]) -> (Vec<i64>, String) {
    let out = Command::new(go())
        .args(["tool", "pprof", "-raw"])
        .args(extra)
        .arg(file)
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof -raw {}: {}\n{text}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut sums: Vec<i64> = Vec::new();
    let samples = text
        .split("Samples:")
        .nth(1)
        .and_then(|s| s.split("Locations").next())
        .unwrap_or("");
    for line in samples.lines() {
        let Some((values, _)) = line.split_once(':') else {
            continue;
        };
        let values: Option<Vec<i64>> = values.split_whitespace().map(|v| v.parse().ok()).collect();
        let Some(values) = values.filter(|v| !v.is_empty()) else {
            continue;
        };
        sums.resize(values.len(), 0);
        for (sum, v) in sums.iter_mut().zip(values) {
            *sum += v;
        }
    }
    (sums, text)
}

fn unix(t: SystemTime) -> String {
    format!("{:.3}", t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64())
}

/// GET returning status and body bytes.
fn get_bytes(url: &str) -> (u16, Vec<u8>) {
    let read = |r: ureq::Response| {
        let mut body = Vec::new();
        r.into_reader().read_to_end(&mut body).unwrap();
        body
    };
    match ureq::get(url).timeout(Duration::from_secs(60)).call() {
        Ok(r) => (r.status(), read(r)),
        Err(ureq::Error::Status(code, r)) => (code, read(r)),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// Folded total of a query in nanoseconds, and its number of lines (each
/// rounded to the microsecond).
/// Kernel frames among folded rows.
fn has_kernel_frames(rows: &[(Vec<String>, u64)]) -> bool {
    rows.iter()
        .flat_map(|(s, _)| s)
        .any(|f| f.ends_with("_[k]"))
}

fn folded_total(url: &str, query: &str) -> Option<(i64, i64, bool)> {
    let (status, body) = get(&format!("{url}/folded?{query}"));
    if status == 404 {
        return None;
    }
    assert_eq!(status, 200, "{query}: {body}");
    let rows = parse_folded(&body);
    let us: u64 = rows.iter().map(|(_, v)| v).sum();
    Some((
        us as i64 * 1000,
        rows.len() as i64,
        has_kernel_frames(&rows),
    ))
}

#[test]
fn every_kind_parses_and_matches_folded_over_a_pinned_window() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let url = daemon();
    let from = SystemTime::now() - Duration::from_secs(1);
    let pid = run("mixed", &["4"]);
    let until = SystemTime::now();
    // A drain may have ended a slice just before `until` that is still
    // being symbolized: the window is pinned once it is stored.
    settle(url);
    let window = format!("from={}&until={}", unix(from), unix(until));
    let dir = tempfile::tempdir().unwrap();
    let mut present = Vec::new();
    for kind in [
        "cpu",
        "runqueue",
        "futex",
        "io",
        "sleep",
        "throttled",
        "offcpu",
        "wall",
        "wakeup",
    ] {
        let query = format!("pid={pid}&kind={kind}&{window}");
        let (status, body) = get_bytes(&format!("{url}/pprof?{query}"));
        let folded = folded_total(url, &format!("{query}&group=thread"));
        let (folded_ns, lines, kernel) = folded.expect("the workload's pid is known");
        assert_eq!(status, 200, "{kind}: {}", String::from_utf8_lossy(&body));
        if lines == 0 {
            // Nothing of this kind in the window (200, with a note).
            continue;
        }
        let file = dir.path().join(format!("{kind}.pb.gz"));
        std::fs::write(&file, &body).unwrap();
        let (sums, text) = pprof_raw(&file, &[]);
        let types = if kind == "cpu" {
            "samples/count cpu/nanoseconds[dflt]"
        } else if kind == "wakeup" {
            "wakeups/count wakee_wait/nanoseconds[dflt]"
        } else {
            "samples/count wall/nanoseconds[dflt]"
        };
        assert!(text.contains(types), "{kind}:\n{text}");
        // Each folded line is rounded to the microsecond.
        assert!(
            (sums[1] - folded_ns).abs() <= 500 * lines,
            "{kind}: pprof {} ns vs folded {folded_ns} ns over {lines} lines",
            sums[1]
        );
        // Kernel frames on the kernel's mapping, no frame-kind suffix left
        // in a name.
        assert_eq!(
            text.contains("[kernel.kallsyms]"),
            kernel,
            "{kind}:\n{text}"
        );
        assert!(
            !text.contains("_[k]"),
            "{kind}: suffix left in a name:\n{text}"
        );
        // The same window again is the same profile.
        let (_, again) = get_bytes(&format!("{url}/pprof?{query}"));
        assert!(
            again == body,
            "{kind}: a pinned window changed between two exports"
        );
        present.push(kind);
    }
    for kind in ["cpu", "futex", "sleep", "offcpu", "wall"] {
        assert!(present.contains(&kind), "{kind} missing: {present:?}");
    }

    // The off-CPU profile, focused on one state, is that state's profile.
    let offcpu = dir.path().join("offcpu.pb.gz");
    for state in ["futex", "sleep"] {
        let focus = format!("-tagfocus=state={state}");
        let (focused, _) = pprof_raw(&offcpu, &[&focus]);
        let (alone, _) = pprof_raw(&dir.path().join(format!("{state}.pb.gz")), &[]);
        assert_eq!(focused, alone, "{state}: tagfocus vs kind");
    }

    // Labels: the mixed workload's lock threads by name, where they wait.
    let (_, text) = pprof_raw(&dir.path().join("futex.pb.gz"), &[]);
    assert!(text.contains(&format!("pid:[{pid}]")), "{text}");
    assert!(
        text.contains("comm:[mixed]") && text.contains("state:[futex]"),
        "{text}"
    );
    assert!(text.contains("thread_name:[lock-"), "{text}");
    assert!(
        text.contains("pthread_mutex_lock") && text.contains("hold_lock"),
        "{text}"
    );
}

#[test]
fn bad_windows_are_refused_with_the_parameter_named() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let url = daemon();
    for (query, param) in [
        ("from=100&until=50", "until"),
        ("from=yesterday", "from"),
        ("from=1&until=2&seconds=1", "seconds"),
        ("kind=park", "kind"),
    ] {
        let (status, body) = get(&format!("{url}/pprof?{query}"));
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains(param), "{query}: {body}");
    }
}

#[test]
fn record_writes_a_pprof_file() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let w = Workload::start(&workload("cpu_shares"), &["8"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cpu.pb.gz");
    let status = Command::new(env!("CARGO_BIN_EXE_wallscope"))
        .args([
            "record",
            "--pid",
            &w.pid.to_string(),
            "--duration",
            "3s",
            "-o",
        ])
        .arg(&out)
        .status()
        .unwrap();
    drop(w);
    assert!(status.success(), "record failed: {status}");
    let (sums, text) = pprof_raw(&out, &[]);
    assert!(
        text.contains("samples/count cpu/nanoseconds[dflt]"),
        "{text}"
    );
    assert!(sums[0] > 0 && sums[1] > 0, "{text}");
    assert!(text.contains("thread_id:["), "{text}");
}
