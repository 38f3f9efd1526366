//! Processes found by name (issue #42): a Python script started with a
//! distinctive argument is the one row `/processes?name=` finds, with the
//! command line, script and executable it was started with (the kernel's
//! `exe` link the truth), its cgroup as `/proc` lists it; `/threads?name=`
//! shows the same process; `limit=` cuts rows and says so.

use std::{
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use crate::support::{rows::within, Fixture, Workload, CATCH_UP};

/// A response's status, the rows-omitted header and the body.
fn fetch(url: &str) -> (u16, Option<u64>, String) {
    let response = match ureq::get(url).timeout(Duration::from_secs(30)).call() {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{url}: {e}"),
    };
    let omitted = response
        .header("x-wallscope-rows-omitted")
        .map(|v| v.parse().unwrap());
    (response.status(), omitted, response.into_string().unwrap())
}

#[test]
fn a_script_is_found_by_its_command_line_and_rows_are_limited() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let url = crate::support::daemon();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let token = format!("wsIdent{}x{nanos}", std::process::id());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(&token);
    std::fs::create_dir_all(&dir).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/python/tight.py");
    let out = dir.join("tight.json");
    let args = [
        "-u",
        script.to_str().unwrap(),
        "--block",
        "--depth",
        "3",
        "--out",
        out.to_str().unwrap(),
    ];
    let python = Path::new("/usr/bin/python3");
    let work = Workload::start(python, &args);
    let exe = std::fs::read_link(format!("/proc/{}/exe", work.pid)).unwrap();
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", work.pid)).unwrap();
    let v2 = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string);

    // Searched in lower case: the match ignores case.
    let query = format!("{url}/processes?seconds=30&name={}", token.to_lowercase());
    let rows = within(CATCH_UP, || {
        let (status, _, body) = fetch(&query);
        assert_eq!(status, 200, "{body}");
        let rows: Value = serde_json::from_str(&body).unwrap();
        (!rows.as_array().unwrap().is_empty()).then_some(rows)
    })
    .unwrap_or_else(|| panic!("no row for {token} within {CATCH_UP:?}"));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "exactly the script: {rows:?}");
    let row = &rows[0];
    assert_eq!(row["pid"], work.pid, "{row}");
    let started = std::iter::once("/usr/bin/python3")
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(row["cmdline"], started.as_str(), "{row}");
    assert_eq!(row["executable"], exe.to_str().unwrap(), "{row}");
    assert_eq!(row["main"]["kind"], "python_script", "{row}");
    assert_eq!(row["main"]["name"], script.to_str().unwrap(), "{row}");
    if let Some(v2) = v2 {
        assert_eq!(row["cgroups"]["v2"], v2.as_str(), "{row}");
    }

    // /threads finds the same process by name, its identity in the header.
    let (status, _, text) = fetch(&format!(
        "{url}/threads?seconds=30&format=text&name={token}"
    ));
    assert_eq!(status, 200, "{text}");
    assert!(text.starts_with(&format!("pid {} ", work.pid)), "{text}");
    assert!(text.contains(&format!("command: {started}")), "{text}");

    // limit= keeps the array's shape and says what it cut.
    let (status, all_omitted, all) = fetch(&format!("{url}/processes?seconds=30"));
    assert_eq!((status, all_omitted), (200, None));
    let all: Value = serde_json::from_str(&all).unwrap();
    assert!(all.as_array().unwrap().len() > 2, "a host runs processes");
    let (status, omitted, one) = fetch(&format!("{url}/processes?seconds=30&limit=1"));
    assert_eq!(status, 200, "{one}");
    let one: Value = serde_json::from_str(&one).unwrap();
    assert_eq!(one.as_array().unwrap().len(), 1, "{one}");
    assert!(omitted.is_some_and(|n| n > 0), "{omitted:?}");
    let (_, omitted, text) = fetch(&format!("{url}/processes?seconds=30&format=text&top=2"));
    let last = text.lines().last().unwrap();
    let n = omitted.unwrap();
    assert_eq!(last, format!("… {n} more rows (limit=2)"), "{text}");
    assert_eq!(text.lines().count(), 4, "header, two rows, the cut: {text}");
    hostile_command_lines_are_cut_cleaned_and_masked(url, &token, &script, &dir);
    for bad in ["limit=0", "limit=many", "name=", "top=1&limit=1"] {
        let (status, _, body) = fetch(&format!("{url}/processes?{bad}"));
        assert_eq!(status, 400, "{bad}: {body}");
    }
    drop(work);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same script started with a secret, terminal escapes, a
/// bidirectional override and a 100 KiB argument: its command line is
/// shown masked, escaped and cut to 512 bytes, in JSON and in text.
fn hostile_command_lines_are_cut_cleaned_and_masked(
    url: &str,
    token: &str,
    script: &Path,
    dir: &Path,
) {
    let tag = format!("tag=hostile{token}");
    let pad = format!("pad=\x1b[2J\u{202e}{}", "x".repeat(100 << 10));
    let out = dir.join("hostile.json");
    let args = [
        "-X",
        &tag,
        "-X",
        "password=hunter2",
        "-X",
        &pad,
        "-u",
        script.to_str().unwrap(),
        "--block",
        "--depth",
        "3",
        "--out",
        out.to_str().unwrap(),
    ];
    let work = Workload::start(Path::new("/usr/bin/python3"), &args);
    let query = format!("{url}/processes?seconds=30&name=hostile{token}");
    let row = within(CATCH_UP, || {
        let (_, _, body) = fetch(&query);
        let rows: Value = serde_json::from_str(&body).unwrap();
        rows.as_array().unwrap().first().cloned()
    })
    .unwrap_or_else(|| panic!("no row for hostile{token} within {CATCH_UP:?}"));
    assert_eq!(row["pid"], work.pid, "{row}");
    let cmdline = row["cmdline"].as_str().unwrap();
    let head = format!("/usr/bin/python3 -X {tag} -X password=*** -X pad=\\x1b[2J\\u{{202e}}xxx");
    assert!(cmdline.starts_with(&head), "{cmdline:.200}");
    assert!(
        cmdline.len() <= 512 && cmdline.ends_with('…'),
        "{}",
        cmdline.len()
    );
    assert!(!cmdline.contains("hunter2") && !cmdline.chars().any(char::is_control));
    // Past the bound read: no script is claimed.
    assert!(row.get("main").is_none(), "{row}");
    let (_, _, text) = fetch(&format!(
        "{url}/processes?seconds=30&format=text&name=hostile{token}"
    ));
    assert!(!text.contains('\u{1b}') && !text.contains('\u{202e}') && !text.contains("hunter2"));
    assert_eq!(text.lines().count(), 2, "{text}");
}
