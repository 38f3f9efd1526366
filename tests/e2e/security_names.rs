//! Names and shared work an unprivileged local user (`nobody`) can throw at
//! the daemon running as root: perf maps full of long unique names
//! rewritten every 2 s, a 64 MiB perf map rewritten every second, a fake
//! JVM answering thread dumps with 4 MB names and names holding `;`, and
//! 10,000 sleeping threads. Each costs the daemon bounded memory and time,
//! degrades only the attacker's own frames (counted, `/healthz` degraded
//! naming its pid), and another process's history is kept whole. Needs
//! root; the tests share one daemon (with a small store, so that its bound
//! is reached quickly) and take turns.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::support::{
    get, parse_folded, rows::json_at, rows::within, users, workload, Fixture, Workload, CATCH_UP,
};
use serde_json::Value;

/// The bound on the daemon's growth under each name attack.
const RSS_GROWTH: u64 = 100 << 20;
/// The frame-name bound docs/resource-bounds.md documents.
const NAME_BOUND: u64 = 128 << 20;
/// How long each attack runs once it has reached the daemon.
const ATTACK: Duration = Duration::from_secs(30);

/// An exclusive turn and the daemon the tests here share: one with a
/// small store, so that its bound is reached quickly.
fn turn() -> Option<(Fixture, &'static str)> {
    let fx = Fixture::ebpf_serial()?;
    let ws = fx.daemon_with(&["--max-memory-mb", "16"]);
    Some((fx, ws))
}

/// A directory every user can enter, for this test process.
fn scratch() -> PathBuf {
    users::shared_dir("names", 0o777)
}

/// Workload `name` started as `nobody` (from a copy `nobody` can run).
fn as_nobody(name: &str, args: &[&str]) -> Workload {
    let bin = users::runnable_copy(name, &scratch());
    let mut cmd = users::as_nobody(&bin);
    cmd.args(args).current_dir(scratch());
    Workload::spawn(cmd)
}

/// Files the attackers leave in `/tmp`, removed when the test ends.
struct Leftovers(Vec<PathBuf>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = fs::remove_file(p);
        }
    }
}

fn perf_map_of(pid: u32) -> Leftovers {
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    Leftovers(vec![map.with_extension("map.tmp"), map])
}

fn health(ws: &str) -> Value {
    json_at(ws, "/healthz")
}

fn rss(h: &Value) -> u64 {
    let m = &h["memory"];
    ["anon_bytes", "file_bytes", "shmem_bytes"]
        .iter()
        .map(|k| m[k].as_u64().unwrap_or_else(|| panic!("memory.{k} in {m}")))
        .sum()
}

fn refused(h: &Value, what: &str, reason: &str) -> u64 {
    h["refused"][what][reason]
        .as_u64()
        .unwrap_or_else(|| panic!("no refused.{what}.{reason} in {}", h["refused"]))
}

/// Whether `/healthz` `degraded` names `pid` on its `what budget` line
/// (which names the few processes refused most there lately).
fn named_degraded(h: &Value, what: &str, pid: u32) -> bool {
    let line = format!("{what} budget for ");
    h["degraded"].as_array().is_some_and(|lines| {
        lines
            .iter()
            .filter_map(Value::as_str)
            .any(|l| l.starts_with(&line) && l.contains(&format!("pid {pid} (")))
    })
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Watches the daemon for `ATTACK`: the highest RSS and frame-name bytes
/// it reported, and the most CPU time one batch's symbolization took
/// (its work, not the time it waited for a CPU on a busy host).
struct Watch {
    rss: u64,
    names: u64,
    symbolize_us: u64,
}

fn watch(ws: &str) -> Watch {
    let mut w = Watch {
        rss: 0,
        names: 0,
        symbolize_us: 0,
    };
    let end = Instant::now() + ATTACK;
    while Instant::now() < end {
        let h = health(ws);
        w.rss = w.rss.max(rss(&h));
        let p = &h["pipeline"];
        w.names = w.names.max(p["frame_name_bytes"].as_u64().unwrap());
        w.symbolize_us = w
            .symbolize_us
            .max(p["last_symbolize_cpu_us"].as_u64().unwrap());
        thread::sleep(Duration::from_millis(250));
    }
    w
}

/// Wall time `/threads` reports for `pid`'s threads other than its main
/// one between `from` and `until` (seconds since the epoch).
fn worker_wall_s(ws: &str, pid: u32, from: u64, until: u64) -> f64 {
    let report = json_at(ws, &format!("/threads?pid={pid}&from={from}&until={until}"));
    let threads = report["threads"].as_array().cloned().unwrap_or_default();
    threads
        .iter()
        .filter(|t| t["tid"] != pid)
        .map(|t| t["wall_us"].as_u64().unwrap_or(0) as f64 / 1e6)
        .sum()
}

/// A normal process (two mostly sleeping workers, root's) whose history
/// must be kept, and when it started being recorded.
fn normal_process(ws: &str) -> (Workload, u64) {
    let w = Workload::start(&workload("many_threads"), &["2", "600"]);
    let seen = within(CATCH_UP, || {
        (worker_wall_s(ws, w.pid, now_s() - 5, now_s()) > 1.0).then_some(())
    });
    assert!(seen.is_some(), "the normal process never showed");
    (w, now_s())
}

/// Asserts that the normal process's workers are recorded whole over
/// `from..until`.
fn assert_history_kept(ws: &str, pid: u32, from: u64, until: u64) {
    let wall = worker_wall_s(ws, pid, from, until);
    let expected = 2.0 * (until - from) as f64;
    println!("normal process: {wall:.1} s of {expected:.0} s recorded over {from}..{until}");
    assert!(
        wall >= 0.8 * expected,
        "normal process's history cut: {wall:.1} s of {expected:.0} s; store: {}",
        health(ws)["store"]
    );
}

fn folded(ws: &str, query: &str) -> Vec<(Vec<String>, u64)> {
    let (status, body) = get(&format!("{}/folded?{query}", ws));
    assert_eq!(status, 200, "{body}");
    parse_folded(&body)
}

#[test]
fn perf_maps_of_long_unique_names_rewritten_every_2s_stay_within_bounds() {
    let Some((_turn, ws)) = turn() else {
        return;
    };
    let (normal, t0) = normal_process(ws);
    let before = health(ws);
    let a = as_nobody("names_attacker", &["perfmap", "30000", "2000", "2000"]);
    let _files = perf_map_of(a.pid);
    // The map is read: the attacker's JIT frames carry its names.
    let named = within(CATCH_UP, || {
        let rows = folded(ws, &format!("pid={}&seconds=10", a.pid));
        rows.iter()
            .any(|(f, _)| f.iter().any(|f| f.starts_with("gen")))
            .then_some(())
    });
    assert!(named.is_some(), "the attacker's perf map was never read");
    let w = watch(ws);
    let after = health(ws);
    let growth = w.rss.saturating_sub(rss(&before));
    println!(
        "RSS {} MiB -> {} MiB at most; frame names {} KiB at most; store {}",
        rss(&before) >> 20,
        w.rss >> 20,
        w.names >> 10,
        after["store"]
    );
    assert!(growth < RSS_GROWTH, "RSS grew {} MiB", growth >> 20);
    assert!(w.names <= NAME_BOUND, "frame names {} bytes", w.names);
    let perf_budget =
        refused(&after, "perf_map", "budget") - refused(&before, "perf_map", "budget");
    let names_budget = refused(&after, "names", "budget") - refused(&before, "names", "budget");
    println!("perf_map budget +{perf_budget}, names budget +{names_budget}");
    assert!(
        perf_budget > 0,
        "60 MB rewritten every 2 s never over budget"
    );
    assert_history_kept(ws, normal.pid, t0, now_s() - 3);
}

#[test]
fn a_64mb_perf_map_rewritten_every_second_does_not_hold_up_symbolization() {
    let Some((_turn, ws)) = turn() else {
        return;
    };
    let (normal, t0) = normal_process(ws);
    let before = health(ws);
    let a = as_nobody("names_attacker", &["bigmap", "64"]);
    let _files = perf_map_of(a.pid);
    let named = within(CATCH_UP, || {
        let rows = folded(ws, &format!("pid={}&seconds=10", a.pid));
        rows.iter()
            .any(|(f, _)| f.iter().any(|f| f.starts_with("big_")))
            .then_some(())
    });
    assert!(named.is_some(), "the attacker's perf map was never read");
    let w = watch(ws);
    let after = health(ws);
    let batches = |h: &Value| h["pipeline"]["symbolized_batches"].as_u64().unwrap();
    let total = |h: &Value| h["pipeline"]["symbolize_cpu_us_total"].as_u64().unwrap();
    let mean_us = (total(&after) - total(&before)) / (batches(&after) - batches(&before)).max(1);
    println!(
        "symbolization: longest batch seen {} ms, mean {} ms; RSS {} -> {} MiB",
        w.symbolize_us / 1000,
        mean_us / 1000,
        rss(&before) >> 20,
        w.rss >> 20
    );
    assert!(
        w.symbolize_us < 1_000_000,
        "a batch took {} us",
        w.symbolize_us
    );
    assert!(mean_us < 1_000_000, "{mean_us} us a batch");
    assert!(refused(&after, "perf_map", "budget") > refused(&before, "perf_map", "budget"));
    assert_eq!(after["status"], "degraded", "{after}");
    assert!(
        named_degraded(&after, "perf_map", a.pid),
        "{}",
        after["degraded"]
    );
    let (_, metrics) = get(&format!("{}/metrics", ws));
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("wallscope_refused_total")
                && l.contains("\"perf_map\"")
                && l.contains("\"budget\"")
        })
        .unwrap_or_else(|| panic!("no perf_map budget in /metrics"));
    assert!(!line.ends_with(" 0"), "{line}");
    assert_history_kept(ws, normal.pid, t0, now_s() - 3);
}

#[test]
fn java_thread_names_are_cut_cleaned_and_inject_no_frames() {
    let Some((_turn, ws)) = turn() else {
        return;
    };
    // A file named libjvm.so makes the attacker look like a HotSpot JVM.
    let lib = scratch().join("libjvm.so");
    if !lib.exists() {
        fs::copy("/lib/x86_64-linux-gnu/libm.so.6", &lib).unwrap();
        fs::set_permissions(&lib, fs::Permissions::from_mode(0o644)).unwrap();
    }
    let before = health(ws);
    let a = as_nobody(
        "names_attacker",
        &["javanames", lib.to_str().unwrap(), &(4 << 20).to_string()],
    );
    let _files = Leftovers(vec![
        PathBuf::from(format!("/tmp/.java_pid{}", a.pid)),
        PathBuf::from(format!("/tmp/.attach_pid{}", a.pid)),
        scratch().join(format!(".attach_pid{}", a.pid)),
    ]);
    let threads = |ws: &str| get(&format!("{}/threads?pid={}&seconds=60", ws, a.pid)).1;
    // Its names arrive: the huge one cut, the others cleaned.
    let named = within(CATCH_UP, || {
        let body = threads(ws);
        body.contains("injected_frame").then_some(body)
    });
    let body = named.expect("the fake JVM's thread names never arrived");
    let w = watch(ws);
    let growth = w.rss.saturating_sub(rss(&before));
    let body = threads(ws).max(body);
    println!(
        "RSS {} MiB -> {} MiB at most; /threads {} bytes",
        rss(&before) >> 20,
        w.rss >> 20,
        body.len()
    );
    assert!(growth < RSS_GROWTH, "RSS grew {} MiB", growth >> 20);
    assert!(body.len() < 256 << 10, "/threads is {} bytes", body.len());
    let report: Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for name in &names {
        assert!(name.len() <= 256, "a {} byte thread name", name.len());
        assert!(!name.contains(';'), "{name}");
    }
    assert!(
        names.iter().any(|n| n.ends_with('…')),
        "the 4 MB name never arrived (cut): {names:?}"
    );
    let rows = folded(ws, &format!("pid={}&seconds=60&group=thread", a.pid));
    let frames: Vec<&String> = rows.iter().flat_map(|(f, _)| f).collect();
    assert!(
        frames.iter().any(|f| f.contains("injected_frame")),
        "no thread frame with the cleaned name: {frames:?}"
    );
    assert!(
        !frames
            .iter()
            .any(|f| *f == "injected_frame" || *f == "evil"),
        "a `;` in a thread name injected frames"
    );
}

#[test]
fn ten_thousand_sleeping_threads_do_not_cut_another_processes_history() {
    let Some((_turn, ws)) = turn() else {
        return;
    };
    let (normal, t0) = normal_process(ws);
    let before = health(ws);
    let a = as_nobody("many_threads", &["10000", "600"]);
    let started = now_s();
    // The attacker pays for the store's bound: its rows folded into pools
    // (then shed), nobody else's.
    let paid = |h: &Value| {
        let n = |k: &str| h["store"][k].as_u64().unwrap_or(0);
        n("shed_rows") + n("folded_parts")
    };
    let shed = within(CATCH_UP, || {
        let h = health(ws);
        (paid(&h) > paid(&before) && now_s() > started + 20).then_some(h)
    });
    let h = shed.expect("the store never folded or shed the attacker's rows");
    println!("store {}", h["store"]);
    assert!(refused(&h, "share", "budget") > refused(&before, "share", "budget"));
    assert!(
        named_degraded(&h, "share", a.pid),
        "attacker pid {}, normal pid {}: {}",
        a.pid,
        normal.pid,
        h["degraded"]
    );
    assert_history_kept(ws, normal.pid, t0, now_s() - 3);
}
