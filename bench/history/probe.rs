//! What the history bench asks the daemon and `/proc`: the thread-seconds
//! it recorded, whether a process's history is held at full per-thread
//! resolution over a window, the latency of `/threads`, and the daemon's
//! CPU by thread name.

pub use crate::common::procfs::ThreadCpu;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Longest any one query may take before it counts as failed.
const QUERY_TIMEOUT: Duration = Duration::from_secs(120);
/// Suffix of the thread a process's folded rows are put under.
pub const FOLDED: &str = " (folded)";
/// The latency query's window: the "over 10 minutes".
pub const LATENCY_SECONDS: u64 = 600;

/// One answer: status, the headers the checks read, body and latency.
pub struct Answer {
    pub status: u16,
    pub recorded: Option<u64>,
    pub resolution: Option<String>,
    pub body: String,
    pub ms: f64,
}

/// `GET path` on the daemon; an HTTP error status is an answer, a
/// transport error or timeout an error.
pub fn ask(port: u16, path: &str) -> Result<Answer> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let sent = Instant::now();
    let r = match ureq::get(&url).timeout(QUERY_TIMEOUT).call() {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => bail!("{path}: {e}"),
    };
    let header = |h: &str| r.header(h).map(str::to_string);
    let recorded = header("x-wallscope-recorded-seconds").and_then(|s| s.parse().ok());
    let resolution = header("x-wallscope-resolution");
    let status = r.status();
    let body = r.into_string()?;
    Ok(Answer {
        status,
        recorded,
        resolution,
        body,
        ms: sent.elapsed().as_secs_f64() * 1e3,
    })
}

/// Unix seconds of `t`.
pub fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Thread-seconds the daemon recorded over the last `seconds`: every
/// process's wall time (all its threads) in `/processes`.
pub fn thread_seconds(port: u16, seconds: u64) -> Result<f64> {
    let a = ask(port, &format!("/processes?seconds={seconds}"))?;
    if a.status != 200 {
        bail!("/processes: {} {}", a.status, a.body.trim());
    }
    let rows: Vec<Value> = serde_json::from_str(&a.body)?;
    let us: f64 = rows
        .iter()
        .filter_map(|r| r["time"]["wall_us"].as_f64())
        .sum();
    Ok(us / 1e6)
}

/// How one long-lived process's history over a window is held.
pub struct Held {
    pub pid: u32,
    pub command: String,
    /// Its threads that lived through the window.
    pub expected: usize,
    /// Of those, listed under their own tid with a wall time within the
    /// tolerance of the window.
    pub whole: usize,
    /// Those listed with a wall time outside it: `(tid, wall s)`.
    pub off: Vec<(u32, f64)>,
    /// Those not listed.
    pub missing: usize,
    /// `(folded)` rows among `/threads`' threads, and `(folded)` lines of
    /// `/folded?group=thread`.
    pub folded_threads: usize,
    pub folded_lines: usize,
    pub recorded: Option<u64>,
    pub resolution: Option<String>,
    /// Why the check could not be made.
    pub error: Option<String>,
}

impl Held {
    /// Whether the whole window is held at full per-thread resolution.
    pub fn ok(&self, window_s: u64) -> bool {
        self.error.is_none()
            && self.whole == self.expected
            && self.folded_threads + self.folded_lines == 0
            && self.recorded.is_some_and(|r| r + 1 >= window_s)
            && !self.resolution.as_deref().unwrap_or("").contains("pools")
    }
}

/// Allowed difference between a thread's wall time and the window: 1 %,
/// at least 2 s (a 1-s slice across each edge of the window).
pub fn tolerance_s(window_s: u64) -> f64 {
    (window_s as f64 * 0.01).max(2.0)
}

/// Checks `pid`'s threads `tids` (which lived through the window) over
/// `[from, until)`: each listed by `/threads` under its tid with its wall
/// time ≈ the window, no `(folded)` row there nor in
/// `/folded?group=thread`, and what the headers say.
pub fn held(
    port: u16,
    pid: u32,
    command: &str,
    tids: &BTreeSet<u32>,
    from: u64,
    until: u64,
) -> Held {
    let mut h = Held {
        pid,
        command: command.to_string(),
        expected: tids.len(),
        whole: 0,
        off: Vec::new(),
        missing: 0,
        folded_threads: 0,
        folded_lines: 0,
        recorded: None,
        resolution: None,
        error: None,
    };
    if let Err(e) = check_held(port, &mut h, tids, from, until) {
        h.error = Some(format!("{e:#}"));
    }
    h
}

fn check_held(port: u16, h: &mut Held, tids: &BTreeSet<u32>, from: u64, until: u64) -> Result<()> {
    let window = format!("from={from}&until={until}");
    let a = ask(port, &format!("/threads?pid={}&{window}", h.pid))?;
    if a.status != 200 {
        bail!("/threads: {} {}", a.status, a.body.trim());
    }
    (h.recorded, h.resolution) = (a.recorded, a.resolution);
    let report: Value = serde_json::from_str(&a.body)?;
    let threads = report["threads"].as_array().context("no threads")?;
    let mut wall = BTreeMap::new();
    for t in threads {
        let name = t["name"].as_str().unwrap_or("");
        if name.ends_with(FOLDED) {
            h.folded_threads += 1;
        }
        if let Some(tid) = t["tid"].as_u64() {
            // Flattened into the row today; under `time` would do too.
            let us = t.get("wall_us").or(t["time"].get("wall_us"));
            let us = us.and_then(Value::as_f64).unwrap_or(0.0);
            wall.insert(tid as u32, us / 1e6);
        }
    }
    let want = (until - from) as f64;
    for tid in tids {
        match wall.get(tid) {
            None => h.missing += 1,
            Some(s) if (s - want).abs() <= tolerance_s(until - from) => h.whole += 1,
            Some(s) => h.off.push((*tid, *s)),
        }
    }
    let a = ask(
        port,
        &format!("/folded?pid={}&{window}&group=thread", h.pid),
    )?;
    if a.status != 200 {
        bail!("/folded: {} {}", a.status, a.body.trim());
    }
    h.folded_lines = a.body.lines().filter(|l| l.contains(FOLDED)).count();
    Ok(())
}

/// One latency query: seconds since the run started, and its answer's
/// milliseconds and status, or the error.
pub type Latency = (f64, Result<(f64, u16), String>);

/// Asks `/threads?pid=PID&seconds=600` every `every` on its own thread,
/// from `begin` until stopped.
pub struct LatencyProbe {
    pub log: Arc<Mutex<Vec<Latency>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LatencyProbe {
    pub fn start(port: u16, pid: u32, start: Instant, begin: Duration, every: Duration) -> Self {
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (log.clone(), stop.clone());
        let path = format!("/threads?pid={pid}&seconds={LATENCY_SECONDS}");
        let thread = std::thread::spawn(move || {
            let mut next = start + begin;
            loop {
                while Instant::now() < next {
                    if s.load(Ordering::Relaxed) {
                        return;
                    }
                    sleep(Duration::from_millis(100));
                }
                let at = start.elapsed().as_secs_f64();
                let r = ask(port, &path).map(|a| (a.ms, a.status));
                let r = r.map_err(|e| format!("{e:#}"));
                l.lock().unwrap_or_else(|e| e.into_inner()).push((at, r));
                next += every;
            }
        });
        LatencyProbe {
            log,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the probe (after the query under way) and returns its log.
    pub fn finish(mut self) -> Vec<Latency> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.log.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for LatencyProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
