//! A process with 10,000 mostly sleeping threads (root; under CI=true the
//! test fails rather than skips): no row is dropped, every thread is
//! reported, and the stacks explain the threads' sleep.

mod support;

use std::{thread, time::Duration};

use serde_json::Value;
use support::*;

const THREADS: usize = 10_000;

fn json(url: &str) -> Value {
    let (status, body) = get(url);
    assert_eq!(status, 200, "{url}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn counter(health: &Value, name: &str) -> u64 {
    health["lost"][name]
        .as_u64()
        .or_else(|| health["events"][name].as_u64())
        .unwrap_or_else(|| panic!("{name} in {health}"))
}

#[test]
fn ten_thousand_sleeping_threads_lose_no_rows() {
    if !ebpf_available() {
        return;
    }
    let ws = Daemon::start(&[]);
    let bin = workload("many_threads");
    let w = Workload::start(&bin, &[&THREADS.to_string(), "120"]);
    let pid = w.pid;
    let before = json(&format!("{}/healthz", ws.url));
    thread::sleep(Duration::from_secs(15));
    let after = json(&format!("{}/healthz", ws.url));
    let delta = |name| counter(&after, name) - counter(&before, name);
    let (full, merged) = (delta("counts_map_full"), delta("counts_merged"));
    println!("counts_map_full +{full}, counts_merged +{merged}");
    assert_eq!(full, 0, "rows dropped: {after}");
    assert_eq!(delta("threads_map_full"), 0, "{after}");

    settle(&ws.url);
    // One pinned window for both answers compared below: relative ones,
    // asked a moment apart on a busy host, would differ by whole slices.
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let window = format!("from={}&until={until}", until - 20);
    let report = json(&format!("{}/threads?pid={pid}&{window}", ws.url));
    let threads = report["threads"].as_array().unwrap();
    let workers: Vec<&Value> = threads.iter().filter(|t| t["tid"] != pid).collect();
    assert!(
        workers.len() >= THREADS * 99 / 100,
        "{} threads reported",
        workers.len()
    );
    let sleepy = workers
        .iter()
        .filter(|t| t["sleep_us"].as_u64().unwrap() > t["cpu_us"].as_u64().unwrap())
        .count();
    assert!(
        sleepy >= workers.len() * 9 / 10,
        "{sleepy} of {} mostly asleep",
        workers.len()
    );

    // The sleep stacks (merged rows included) explain the threads' sleep.
    let sleep_us: u64 = threads
        .iter()
        .map(|t| t["sleep_us"].as_u64().unwrap())
        .sum();
    let (status, body) = get(&format!(
        "{}/folded?pid={pid}&kind=sleep&group=thread&{window}",
        ws.url
    ));
    assert_eq!(status, 200, "{body}");
    let rows = parse_folded(&body);
    let in_rows: u64 = rows.iter().map(|r| r.1).sum();
    let explained = in_rows as f64 / sleep_us.max(1) as f64;
    // Sampled and merged rows estimate the exact totals.
    println!("stack rows hold {in_rows} us of {sleep_us} us of sleep");
    assert!(
        (0.85..=1.15).contains(&explained),
        "stack rows hold {in_rows} us of {sleep_us} us of sleep; {} threads, {} rows; health: {}",
        threads.len(),
        rows.len(),
        json(&format!("{}/healthz", ws.url))
    );
    let sum = |pred: &dyn Fn(&[String]) -> bool| -> u64 {
        rows.iter().filter(|r| pred(&r.0)).map(|r| r.1).sum()
    };
    let in_wait = sum(&|f| f.iter().any(|f| f == "idle_wait"));
    // Past 15/16 of a buffer, merged rows keep no stack (counted
    // degradation, more of it when a busy host slows the drain).
    let stripped =
        sum(&|f| f[1].starts_with("[merged threads]") && !f.iter().any(|f| f == "idle_wait"));
    println!("idle_wait {in_wait} us, merged without stack {stripped} us, of {in_rows} us");
    assert!(
        (in_wait + stripped) as f64 >= 0.9 * in_rows as f64,
        "idle_wait {in_wait} + stripped {stripped} of {in_rows}"
    );
    // `counts_merged` is host-wide, and merged rows are light (only the
    // rows that come after the buffer is 7/8 full merge), so the host's
    // graphs of 10,000 threads may truncate them away: the workload's own
    // merged row, asked for by its tid, must say what it is.
    let merged_tid = wallscope::bpf::abi::MERGED_TID | pid;
    let (status, body) = get(&format!(
        "{}/folded?tid={merged_tid}&kind=wall&group=thread&seconds=60",
        ws.url
    ));
    println!("counts_merged +{merged}; the workload's merged row: {status}");
    if status == 200 {
        let frame = format!("[merged threads] [tid {merged_tid}]");
        assert!(
            parse_folded(&body).iter().all(|r| r.0[1] == frame),
            "merged rows are shown as such: {body}"
        );
    } else {
        assert_eq!(status, 404, "{body}");
    }
    drop(w);
}
