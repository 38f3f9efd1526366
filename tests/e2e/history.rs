//! The disk history with the real daemon (`--history-dir`): a window read
//! before a restart reads the same after it; a record torn by a `kill -9`
//! is counted and skipped; a full disk degrades to memory only while
//! profiling goes on; and `seconds=60` holds 60 s of every always-alive
//! thread.

use std::{
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use crate::support::{fixture::Fixture, get, workload, Daemon, Workload};

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn healthz(url: &str) -> Value {
    let (status, body) = get(&format!("{url}/healthz"));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Waits, at most `within`, until `ok` holds of `/healthz`'s `history`.
fn wait_history(url: &str, within: Duration, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let h = healthz(url)["history"].clone();
        if ok(&h) {
            return h;
        }
        assert!(Instant::now() < deadline, "{what}: {h}");
        thread::sleep(Duration::from_millis(200));
    }
}

/// A query's body and its `x-wallscope-covered` header.
fn ask(url: &str) -> (String, Option<String>) {
    let r = ureq::get(url)
        .timeout(Duration::from_secs(30))
        .call()
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let covered = r.header("x-wallscope-covered").map(str::to_string);
    (r.into_string().unwrap(), covered)
}

/// What a `/threads` answer holds of the window (not what depends on the
/// time it is asked: resolution is given in seconds ago).
fn held(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap();
    serde_json::json!({
        "process": v["process"], "pools": v["pools"], "threads": v["threads"],
        "covered": v["covered"], "recorded_seconds": v["recorded_seconds"],
    })
}

/// Cuts the newest segment's last record short, as a `kill -9` in the
/// middle of its write leaves it.
fn tear_newest_segment(dir: &Path) {
    let newest = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wsh"))
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .expect("a segment");
    let len = newest.metadata().unwrap().len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap();
    // Past the segment's magic and at least one record: the last record's
    // payload loses its last bytes.
    assert!(len > 200, "{newest:?}: {len} bytes");
    f.set_len(len - 20).unwrap();
}

#[test]
fn a_window_reads_the_same_across_restarts_and_a_torn_write() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("ws-history")
        .tempdir()
        .unwrap();
    let path = dir.path().to_str().unwrap();
    let args = ["--history-dir", path, "--history-disk-mb", "64"];
    let mut first = Daemon::start(&args);
    let mixed = Workload::start(&workload("mixed"), &["120"]);
    let t0 = SystemTime::now();
    // Some seconds of it on disk.
    let after = unix(t0) + 8.0;
    wait_history(&first.url, Duration::from_secs(90), "8 s written", |h| {
        h["newest"].as_f64().is_some_and(|n| n >= after)
    });
    // Whole milliseconds, as asked.
    let ms = |t: f64| (t * 1e3).round() as u64;
    let (from_ms, until_ms) = (ms(unix(t0) + 2.25), ms(unix(t0) + 6.5));
    let (from, until) = (from_ms as f64 / 1e3, until_ms as f64 / 1e3);
    let query = format!("/threads?pid={}&from={from:.3}&until={until:.3}", mixed.pid);
    let folded = format!(
        "/folded?pid={}&kind=wall&from={from:.3}&until={until:.3}",
        mixed.pid
    );
    let (before, covered) = ask(&format!("{}{query}", first.url));
    let (before_folded, _) = ask(&format!("{}{folded}", first.url));
    // Exactly the window, its edges cut from the slices they fell in.
    let c = &held(&before)["covered"];
    assert_eq!(c["from_unix_ns"].as_u64(), Some(from_ms * 1_000_000), "{c}");
    assert_eq!(
        c["until_unix_ns"].as_u64(),
        Some(until_ms * 1_000_000),
        "{c}"
    );
    assert!(covered.is_some_and(|c| c.contains('/')));
    let threads = held(&before)["threads"].as_array().unwrap().len();
    assert!(threads >= 6, "{before}");

    // A clean restart: the window now comes from the disk.
    assert!(first.terminate(Duration::from_secs(20)).is_some());
    let second = Daemon::start(&args);
    assert_eq!(
        held(&ask(&format!("{}{query}", second.url)).0),
        held(&before)
    );
    assert_eq!(ask(&format!("{}{folded}", second.url)).0, before_folded);
    let h = wait_history(&second.url, Duration::from_secs(30), "written again", |h| {
        h["blocks_written"].as_u64() > Some(2)
    });
    assert_eq!(h["torn_blocks"], 0, "{h}");

    // Killed (SIGKILL) with a record half written: counted, skipped, the
    // rest read as before.
    drop(second);
    tear_newest_segment(dir.path());
    let third = Daemon::start(&args);
    let h = healthz(&third.url)["history"].clone();
    assert_eq!(h["torn_blocks"], 1, "{h}");
    assert_eq!(
        held(&ask(&format!("{}{query}", third.url)).0),
        held(&before)
    );
    drop(mixed);
}

/// A tmpfs of `size` on `at`, unmounted when dropped.
struct Tmpfs<'a>(&'a Path);

impl<'a> Tmpfs<'a> {
    fn mount(at: &'a Path, size: &str) -> Tmpfs<'a> {
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs on {at:?} (the tests run as root)");
        Tmpfs(at)
    }
}

impl Drop for Tmpfs<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

#[test]
fn a_full_disk_degrades_to_memory_and_profiling_goes_on() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(dir.path(), "256k");
    // Filled up: the first segment's first block finds no room.
    let filler = fs.0.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 1 << 20]);
    let ws = Daemon::start(&["--history-dir", fs.0.to_str().unwrap()]);
    let mixed = Workload::start(&workload("mixed"), &["60"]);
    let h = wait_history(&ws.url, Duration::from_secs(60), "degraded", |h| {
        !h["degraded"].is_null() || h["state"] == "failed"
    });
    println!("full disk: {h}");
    // Profiling goes on, in memory.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = get(&format!("{}/threads?pid={}&seconds=10", ws.url, mixed.pid));
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        if v["process"]["wall_us"].as_u64().unwrap_or(0) > 1_000_000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no profile while degraded: {body}"
        );
        thread::sleep(Duration::from_millis(300));
    }
    let status = healthz(&ws.url)["history"].clone();
    assert!(
        status["write_errors"].as_u64() > Some(0) || status["state"] == "failed",
        "{status}"
    );
    drop((ws, mixed));
}

#[test]
fn sixty_seconds_hold_sixty_seconds_of_each_always_alive_thread() {
    let Some(fx) = Fixture::ebpf() else {
        return;
    };
    let url = fx.daemon();
    let mixed = Workload::start(&workload("mixed"), &["90"]);
    let started = Instant::now();
    // The whole minute within its life (a second's margin for the drain
    // that saw it start).
    thread::sleep(Duration::from_secs(63).saturating_sub(started.elapsed()));
    let (body, covered) = ask(&format!("{url}/threads?pid={}&seconds=60", mixed.pid));
    let report: Value = serde_json::from_str(&body).unwrap();
    let c = &report["covered"];
    let ns = |f: &str| c[f].as_u64().unwrap_or_else(|| panic!("{f}: {body}"));
    let span = ns("until_unix_ns") - ns("from_unix_ns");
    assert_eq!(span, 60_000_000_000, "{covered:?}");
    // One sampling period at the default 99 Hz, in microseconds.
    let period_us = 1_000_000 / 99 + 1;
    for t in report["threads"].as_array().unwrap() {
        let wall = t["wall_us"].as_u64().unwrap();
        assert!(
            wall.abs_diff(60_000_000) <= period_us,
            "thread {} has {wall} us of wall in 60 s: {t}",
            t["tid"]
        );
    }
    drop(mixed);
}

/// Bytes the files of `dir` take on disk (whole blocks).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

#[test]
fn churn_past_the_disk_bound_keeps_the_newest_within_it() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("ws-history-bound")
        .tempdir()
        .unwrap();
    let path = dir.path().to_str().unwrap();
    let ws = Daemon::start(&["--history-dir", path, "--history-disk-mb", "1"]);
    // 100 short-lived processes a second: every second's block is large.
    let spawner = Workload::start(&workload("spawner"), &["100", "120", "2"]);
    let bound = 1 << 20;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut first_oldest = None;
    loop {
        let h = healthz(&ws.url)["history"].clone();
        let on_disk = disk_bytes(dir.path());
        assert!(
            on_disk <= bound,
            "{on_disk} bytes on disk past the 1 MiB bound: {h}"
        );
        assert!(h["bytes"].as_u64().unwrap_or(0) <= bound, "{h}");
        let oldest = h["oldest"].as_u64();
        first_oldest = first_oldest.or(oldest);
        // The bound reached and the oldest seconds deleted for the newest.
        if oldest > first_oldest && h["bytes"].as_u64() > Some(bound / 2) {
            assert_eq!(h["write_errors"], 0, "{h}");
            println!("bound held: {on_disk} bytes on disk; {h}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the bound was never reached: {h}"
        );
        thread::sleep(Duration::from_millis(500));
    }
    drop((ws, spawner));
}
