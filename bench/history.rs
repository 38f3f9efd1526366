//! History on a busy, churning host (issue #39's acceptance): the release
//! daemon with its default flags (and `--history-dir` when it has that
//! flag) watches `HISTORY_BENCH_SECONDS` (default 720) of a host with its
//! 2 CPUs kept busy, ~15 new short-lived processes a second and ~150
//! long-lived threads in 10 processes of varied behaviour
//! (`history/load.rs`); `HISTORY_BENCH_MANY_THREADS=N` adds a process of N
//! mostly sleeping threads.
//!
//! It samples the daemon's RSS every 5 s, `/healthz`, its threads' CPU
//! and the thread-seconds it recorded every 10 s, and asks
//! `/threads?pid=…&seconds=600` every 10 s over the last 2 minutes. Once
//! the checked window (from 1/12 to 11/12 of the run: minute 1 to 11 of
//! the full run) has closed, and again at the end, it checks that every
//! long-lived process's threads are held over it at full per-thread
//! resolution (`history/probe.rs`). Prints the report with PASS/FAIL
//! against the goals (`history/report.rs`) and writes it to
//! `bench/results/history.txt` (`history-many-threads.txt` for the
//! variant). A FAIL is reported, not an error; the bench fails when it
//! cannot measure. Needs root and clang; every child dies with the bench.

#[path = "common/mod.rs"]
mod common;

#[path = "history/load.rs"]
mod load;
#[path = "history/probe.rs"]
mod probe;
#[path = "history/report.rs"]
mod report;

use anyhow::{bail, Context, Result};
use common::{free_port, healthz, procfs};
use probe::{Held, LatencyProbe};
use serde_json::Value;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};
use std::{env, fs};

/// The run length, seconds; shorter runs scale the windows below.
pub const FULL_SECONDS: u64 = 720;
/// Period of the RSS samples.
const RSS_EVERY: Duration = Duration::from_secs(5);
/// RSS samples between two `/healthz`, CPU and thread-seconds samples.
const SAMPLE_EVERY: u32 = 2;
/// Period of the latency queries, and the last part of the full run they
/// and the steady RSS are measured over.
const LATENCY_EVERY: Duration = Duration::from_secs(10);
pub const TAIL_S: u64 = 120;
/// The checked window, in twelfths of the run: minutes 1 to 11 of 12.
pub const WINDOW_TWELFTHS: (u64, u64) = (1, 11);
/// Delay after the window's end before it is checked the first time: the
/// daemon's last slice of it must have been drained.
pub const CLOSE_DELAY_S: u64 = 5;

fn main() {
    common::main("history", run);
}

/// One 10-s sample.
pub struct Sample {
    /// Seconds since the run started.
    pub at: f64,
    pub health: Value,
    /// Thread-seconds the daemon recorded in the 10 s before.
    pub thread_s: Option<f64>,
}

/// A long-lived process, for the report.
pub struct Proc {
    pub pid: u32,
    pub command: String,
    pub what: &'static str,
    pub threads: usize,
}

/// Everything a run measured.
pub struct Run {
    pub seconds: u64,
    pub secs: f64,
    pub many: Option<u64>,
    pub daemon_args: Vec<String>,
    pub load_start: [f64; 3],
    pub load_end: [f64; 3],
    pub host_forks: u64,
    pub procs: Vec<Proc>,
    /// `(at, VmRSS KiB)` every 5 s, and VmHWM at the end.
    pub rss: Vec<(f64, u64)>,
    pub hwm_kib: u64,
    pub samples: Vec<Sample>,
    /// The checked window: unix seconds and seconds since the start.
    pub window: (u64, u64),
    pub window_at: (u64, u64),
    /// The checks once the window closed, and at the end.
    pub held_closed: Vec<Held>,
    pub held_end: Vec<Held>,
    /// When the first check was made, seconds since the start.
    pub closed_at: f64,
    pub latency_pid: (u32, String),
    pub latency: Vec<probe::Latency>,
    pub cpu: Vec<(String, f64)>,
    /// Thread-seconds `/processes` answers for over the history held.
    pub memory_thread_s: Option<f64>,
    pub disk_bytes: Option<u64>,
}

fn run() -> Result<()> {
    common::require_root("wallscope loads eBPF programs")?;
    let seconds = common::env_u64("HISTORY_BENCH_SECONDS", FULL_SECONDS)?;
    let many = match env::var("HISTORY_BENCH_MANY_THREADS") {
        Ok(_) => Some(common::env_u64("HISTORY_BENCH_MANY_THREADS", 10_000)?),
        Err(_) => None,
    };
    let bin = common::daemon_binary()?;
    // On disk (not a tmpfs /tmp): the writers' fdatasync must wait for I/O.
    let tmp = tempfile::Builder::new()
        .prefix("wallscope-history-bench")
        .tempdir_in("/var/tmp")?;
    let history_dir = tmp.path().join("history");
    let help = Command::new(&bin).args(["serve", "--help"]).output()?;
    let mut daemon_args = Vec::new();
    if String::from_utf8_lossy(&help.stdout).contains("--history-dir") {
        fs::create_dir_all(&history_dir)?;
        daemon_args = vec!["--history-dir".into(), history_dir.display().to_string()];
    }
    let load_start = procfs::load_average()?;
    eprintln!("history: starting the load (load average {load_start:?})");
    let mut load = load::start(tmp.path(), seconds, many)?;

    let port = free_port()?;
    let log_path = tmp.path().join("daemon.log");
    let mut daemon = common::serve(&bin, port, &daemon_args, &log_path)?;
    let log = || common::log_tail(&log_path, 30);
    load.mark()?;
    let (start, t0) = (Instant::now(), SystemTime::now());
    let forks0 = procfs::host_forks()?;
    let pid = daemon.pid();
    eprintln!("history: daemon pid {pid} on port {port} {daemon_args:?}, {seconds} s");

    let window_at = (
        seconds * WINDOW_TWELFTHS.0 / 12,
        seconds * WINDOW_TWELFTHS.1 / 12,
    );
    let window = (probe::unix(t0) + window_at.0, probe::unix(t0) + window_at.1);
    let tail = Duration::from_secs(TAIL_S * seconds / FULL_SECONDS);
    let busiest = load
        .procs
        .iter()
        .filter(|p| p.tids.len() < report::FOLDABLE_THREADS)
        .max_by_key(|p| p.tids.len())
        .context("no process")?;
    let latency_pid = (busiest.pid(), busiest.command.clone());
    let duration = Duration::from_secs(seconds);
    let latency = LatencyProbe::start(
        port,
        latency_pid.0,
        start,
        duration.saturating_sub(tail),
        LATENCY_EVERY,
    );
    let mut cpu = probe::ThreadCpu::default();
    cpu.sample(pid)?;
    let (mut rss, mut samples, mut held_closed) = (Vec::new(), Vec::new(), Vec::new());
    let (mut tick, mut closed_at) = (0u32, None);
    let held_all = |load: &load::Load| -> Vec<Held> {
        let checked = load
            .procs
            .iter()
            .filter(|p| p.tids.len() < report::FOLDABLE_THREADS);
        let held =
            |p: &load::Running| probe::held(port, p.pid(), &p.command, &p.tids, window.0, window.1);
        checked.map(held).collect()
    };
    loop {
        let at = start.elapsed();
        if at >= duration {
            break;
        }
        if let Some(status) = daemon.0 .0.try_wait()? {
            bail!("daemon exited with {status}; log:\n{}", log());
        }
        load.check_alive()?;
        rss.push((at.as_secs_f64(), procfs::status_kib(pid, "VmRSS:")?));
        if tick.is_multiple_of(SAMPLE_EVERY) {
            cpu.sample(pid)?;
            let sample = Sample {
                at: at.as_secs_f64(),
                health: healthz(port).unwrap_or(Value::Null),
                thread_s: probe::thread_seconds(port, 10).ok(),
            };
            progress(&sample, rss.last().map_or(0, |r| r.1));
            samples.push(sample);
        }
        if held_closed.is_empty() && at.as_secs() >= window_at.1 + CLOSE_DELAY_S {
            eprintln!("history: checking the window, just closed");
            held_closed = held_all(&load);
            closed_at = Some(at.as_secs_f64());
        }
        // Absolute schedule: a slow sample shifts no later one.
        tick = (start.elapsed().as_secs_f64() / RSS_EVERY.as_secs_f64()) as u32 + 1;
        sleep((start + RSS_EVERY * tick).saturating_duration_since(Instant::now()));
    }
    let latency = latency.finish();
    let closed_at = closed_at.unwrap_or(start.elapsed().as_secs_f64());
    if held_closed.is_empty() {
        // A run too short to check between the window's end and its own.
        held_closed = held_all(&load);
    }
    cpu.sample(pid)?;
    let hwm_kib = procfs::status_kib(pid, "VmHWM:")?;
    let last = healthz(port).unwrap_or(Value::Null);
    let held_s = last["store"]["history_s"].as_u64().unwrap_or(0);
    let retention = last["retention_s"].as_u64().unwrap_or(600);
    let memory_thread_s = probe::thread_seconds(port, held_s.clamp(1, retention)).ok();
    eprintln!("history: checking the window at the end");
    let held_end = held_all(&load);
    let secs = start.elapsed().as_secs_f64();
    samples.push(Sample {
        at: secs,
        health: last,
        thread_s: None,
    });
    let procs = load
        .procs
        .iter()
        .map(|p| Proc {
            pid: p.pid(),
            command: p.command.clone(),
            what: p.what,
            threads: p.tids.len(),
        })
        .collect();
    let disk_bytes = (!daemon_args.is_empty()).then(|| dir_bytes(&history_dir));
    let host_forks = procfs::host_forks()? - forks0;
    daemon.0.stop(libc::SIGTERM)?;
    drop(load);
    let run = Run {
        seconds,
        secs,
        many,
        daemon_args,
        load_start,
        load_end: procfs::load_average()?,
        host_forks,
        procs,
        rss,
        hwm_kib,
        samples,
        window,
        window_at,
        held_closed,
        held_end,
        closed_at,
        latency_pid,
        latency,
        cpu: cpu.by_name(),
        memory_thread_s,
        disk_bytes,
    };
    let file = match many {
        Some(_) => "history-many-threads.txt",
        None => "history.txt",
    };
    common::write_result(file, &report::render(&run)?)
}

/// Bytes allocated on disk under `dir` (0 if unreadable).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let one = |e: fs::DirEntry| -> u64 {
        let Ok(m) = e.metadata() else { return 0 };
        if m.is_dir() {
            dir_bytes(&e.path())
        } else {
            m.blocks() * 512
        }
    };
    entries.flatten().map(one).sum()
}

/// One line on stderr per 10-s sample.
fn progress(s: &Sample, rss_kib: u64) {
    let store = &s.health["store"];
    eprintln!(
        "history: {:>4.0} s  RSS {:>6.1} MB  store {:>5.1} MB  history {} s  shed {}  \
         folded {}  evicted {}  thread-s/10 s {}",
        s.at,
        rss_kib as f64 / 1024.0,
        store["bytes"].as_f64().unwrap_or(0.0) / 1e6,
        store["history_s"],
        store["shed_rows"],
        store["folded_parts"],
        store["evicted_slices"],
        s.thread_s
            .map_or("n/a".into(), |t| format!("{:.0}", t.max(0.0))),
    );
}
