//! A thread per request (issue #42): `/threads` folds the short-lived
//! threads of one pool into one row whose count is the threads the
//! workload started, and its text answer stays short; `fold=off` lists
//! each.

use serde_json::Value;

use crate::support::{daemon, get, rows::json_at, run_with_output, Fixture};

/// Threads the workload starts, and how long each lives (ms).
const REQUESTS: usize = 300;
const LIFE_MS: &str = "20";

#[test]
fn a_thread_per_request_is_one_folded_row() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    let count = REQUESTS.to_string();
    let (pid, out) = run_with_output("thread_per_request", &[&count, "150", LIFE_MS]);
    let started: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("started "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `started` line: {out}"));
    assert_eq!(started, REQUESTS, "{out}");
    let query = format!("/threads?pid={pid}&seconds=300");
    let report = json_at(url, &query);
    let folded = report["folded"].as_array().cloned().unwrap_or_default();
    let row = folded
        .iter()
        .find(|f| f["pool"] == "req-*")
        .unwrap_or_else(|| panic!("no folded req-* row: {report}"));
    // Every thread it started, less any the daemon did not see live; a
    // thread recorded before it named itself folds under the process's
    // name (its pool of unnamed threads).
    let threads = row["threads"].as_u64().unwrap() as usize;
    let all_folded: usize = folded
        .iter()
        .map(|f| f["threads"].as_u64().unwrap() as usize)
        .sum();
    assert!(
        all_folded <= started && all_folded as f64 >= 0.95 * started as f64,
        "{all_folded} folded of {started} started: {report}"
    );
    assert!(threads as f64 >= 0.5 * started as f64, "{row}");
    let unfolded = |r: &Value| {
        let rows = r["threads"].as_array().unwrap();
        rows.iter()
            .filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with("req-")))
            .count()
    };
    assert_eq!(unfolded(&report), 0, "{report}");
    // Each lived its sleep at least; none as long as the process.
    let life = &row["lifetime_ms"];
    let ms = |k: &str| life[k].as_f64().unwrap();
    assert!(ms("p50") >= 19.0 && ms("max") < 1000.0, "{row}");
    assert!(ms("min") <= ms("p50") && ms("p50") <= ms("max"), "{row}");
    assert_eq!(row["tids"].as_array().unwrap().len(), 5, "{row}");
    let (status, text) = get(&format!("{url}{query}&format=text"));
    assert_eq!(status, 200, "{text}");
    assert!(text.lines().count() <= 30, "{text}");
    assert!(text.contains(&format!("req-* ×{threads}")), "{text}");
    let all = json_at(url, &format!("{query}&fold=off"));
    assert_eq!(unfolded(&all), threads, "fold=off lists each");
    let (status, body) = get(&format!("{url}{query}&fold=maybe"));
    assert!(status == 400 && body.contains("fold"), "{status} {body}");
}
