//! What the soak measures of the daemon: its RSS and CPU time
//! (`/proc/PID/{status,stat}`), its drains and `/healthz` latency (a
//! poller thread), the whole-host heavy queries, the history it can
//! answer for, and how completely the many-threads process is recorded;
//! and the host's load average.

pub use crate::common::procfs::{host_cpu, host_forks, load_average};
use crate::common::{healthz, procfs::status_kib};
use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

/// `/healthz` poll period, heavy query or not.
const POLL: Duration = Duration::from_millis(50);
/// The heavy queries, one after the other: every process's wall time by
/// thread over 10 minutes, and the whole host's flame graph over them.
pub const HEAVY_QUERIES: [&str; 2] = [
    "/folded?seconds=600&kind=wall&group=thread",
    "/flamegraph?seconds=600&kind=wall",
];
/// Window of the many-threads process's completeness check.
pub const COVERAGE_SECONDS: u64 = 30;

/// Resident memory (RssAnon + RssFile, KiB) of `pid`: what the daemon
/// holds, leaving out shared memory it does not own.
pub fn rss_kib(pid: u32) -> Result<u64> {
    Ok(status_kib(pid, "RssAnon:")? + status_kib(pid, "RssFile:")?)
}

/// Seconds of the last `window` s the daemon has records of
/// (`x-wallscope-recorded-seconds` of `/threads?pid=PID&seconds=WINDOW`).
pub fn recorded_seconds(port: u16, pid: u32, window: u64) -> Result<u64> {
    let url = format!("http://127.0.0.1:{port}/threads?pid={pid}&seconds={window}");
    let answer = ureq::get(&url)
        .timeout(Duration::from_secs(60))
        .call()
        .map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    let header = answer.header("x-wallscope-recorded-seconds");
    let seconds = header.and_then(|h| h.trim().parse().ok());
    seconds.with_context(|| format!("{url}: no x-wallscope-recorded-seconds header"))
}

/// One `/healthz` answer seen by the poller.
pub struct Poll {
    /// Seconds since the soak started, when the request was sent.
    pub at: f64,
    pub latency_ms: f64,
    /// Whether a heavy query was running when the request was sent.
    pub heavy: bool,
    /// `pipeline.drains`, `None` if `/healthz` did not answer.
    pub drains: Option<u64>,
}

/// What the poller collected.
#[derive(Default)]
pub struct PollLog {
    pub polls: Vec<Poll>,
    /// `(at, last_drain_us)` of each drain seen alone since the previous
    /// poll (several drains between two polls show only the last one's
    /// time: those are counted in `drains_unseen`).
    pub drains: Vec<(f64, u64)>,
    pub drains_unseen: u64,
}

/// Polls `/healthz` on its own thread until dropped.
pub struct Poller {
    pub log: Arc<Mutex<PollLog>>,
    pub heavy: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    pub fn start(port: u16, start: Instant) -> Poller {
        let log = Arc::new(Mutex::new(PollLog::default()));
        let heavy = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, h, s) = (log.clone(), heavy.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut last: Option<u64> = None;
            while !s.load(Ordering::Relaxed) {
                let heavy = h.load(Ordering::Relaxed);
                let sent = Instant::now();
                let answer = healthz(port);
                let latency_ms = sent.elapsed().as_secs_f64() * 1e3;
                let at = sent.duration_since(start).as_secs_f64();
                let pipeline = answer.as_ref().map(|a| &a["pipeline"]);
                let drains = pipeline.and_then(|p| p["drains"].as_u64());
                let mut log = l.lock().unwrap_or_else(|e| e.into_inner());
                if let (Some(n), Some(prev), Some(p)) = (drains, last, pipeline) {
                    match n - prev.min(n) {
                        0 => {}
                        1 => log
                            .drains
                            .push((at, p["last_drain_us"].as_u64().unwrap_or(0))),
                        k => log.drains_unseen += k - 1,
                    }
                }
                last = drains.or(last);
                log.polls.push(Poll {
                    at,
                    latency_ms,
                    heavy,
                    drains,
                });
                drop(log);
                sleep(POLL.saturating_sub(sent.elapsed()));
            }
        });
        Poller {
            log,
            heavy,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One query's answer: HTTP status and body size, or the error.
pub type Answer = Result<(u16, usize), String>;

/// One run of [`HEAVY_QUERIES`].
pub struct Heavy {
    /// Seconds since the soak started.
    pub started: f64,
    pub secs: f64,
    /// Per query: seconds, and HTTP status and body size or the error.
    pub outcomes: Vec<(f64, Answer)>,
    /// Folded lines in the first answer.
    pub lines: usize,
}

/// Starts [`HEAVY_QUERIES`] on their own thread, `heavy` set while they
/// run.
pub fn heavy_query(port: u16, start: Instant, heavy: Arc<AtomicBool>) -> JoinHandle<Heavy> {
    std::thread::spawn(move || {
        heavy.store(true, Ordering::Relaxed);
        let sent = Instant::now();
        let mut outcomes = Vec::new();
        let mut lines = 0;
        for (i, query) in HEAVY_QUERIES.iter().enumerate() {
            let url = format!("http://127.0.0.1:{port}{query}");
            let t = Instant::now();
            let answer = ureq::get(&url).timeout(Duration::from_secs(900)).call();
            let body = answer.map_err(|e| e.to_string()).and_then(|r| {
                let status = r.status();
                Ok((status, r.into_string().map_err(|e| e.to_string())?))
            });
            if i == 0 {
                lines = body.as_ref().map_or(0, |(_, b)| b.lines().count());
            }
            let took = t.elapsed().as_secs_f64();
            outcomes.push((took, body.map(|(s, b)| (s, b.len()))));
        }
        let secs = sent.elapsed().as_secs_f64();
        heavy.store(false, Ordering::Relaxed);
        Heavy {
            started: sent.duration_since(start).as_secs_f64(),
            secs,
            outcomes,
            lines,
        }
    })
}

/// How completely the daemon recorded one process over the last
/// [`COVERAGE_SECONDS`]: its threads (`/threads`) and wall time by thread
/// against the `kind=wall` profile's total (`/folded`). Rows lost from the
/// BPF counts map are missing from the profile but not from the per-thread
/// totals, which BPF keeps in a map of their own.
pub struct Coverage {
    /// Seconds since the soak started.
    pub at: f64,
    pub threads: usize,
    pub threads_wall_us: u64,
    pub folded_us: u64,
}

impl Coverage {
    /// The profile's share of the per-thread wall time.
    pub fn ratio(&self) -> f64 {
        self.folded_us as f64 / self.threads_wall_us.max(1) as f64
    }
}

pub fn coverage(port: u16, pid: u32, at: f64) -> Result<Coverage> {
    let get = |path: String| -> Result<String> {
        let url = format!("http://127.0.0.1:{port}{path}");
        match ureq::get(&url).timeout(Duration::from_secs(60)).call() {
            Ok(answer) => Ok(answer.into_string()?),
            Err(ureq::Error::Status(code, answer)) => {
                let body = answer.into_string().unwrap_or_default();
                bail!("{path}: {code} {}", body.trim())
            }
            Err(e) => bail!("{path}: {e}"),
        }
    };
    let s = COVERAGE_SECONDS;
    let threads: Value = serde_json::from_str(&get(format!("/threads?pid={pid}&seconds={s}"))?)?;
    let folded = get(format!("/folded?pid={pid}&seconds={s}&kind=wall"))?;
    let weight = |l: &str| l.rsplit_once(' ').and_then(|(_, w)| w.parse::<u64>().ok());
    let rows: Vec<Option<u64>> = folded.lines().map(weight).collect();
    ensure!(rows.iter().all(Option::is_some), "bad folded line");
    Ok(Coverage {
        at,
        threads: threads["threads"].as_array().map_or(0, Vec::len),
        threads_wall_us: threads["process"]["wall_us"].as_u64().unwrap_or(0),
        folded_us: rows.into_iter().flatten().sum(),
    })
}

/// Every counter in `health` whose path names a loss or a merge: the
/// `lost` object, `samples_lost`, `pipeline.batches_dropped`, and any field
/// anywhere whose name contains `merge`, `drop`, `lost`, `full` or
/// `evicted`, by dotted path.
pub fn loss_counters(health: &Value) -> Vec<(String, u64)> {
    fn walk(path: &str, v: &Value, lossy: bool, out: &mut Vec<(String, u64)>) {
        let name = path.rsplit('.').next().unwrap_or(path);
        let lossy = lossy
            || ["merge", "drop", "lost", "full", "evicted"]
                .iter()
                .any(|w| name.contains(w));
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(&p, v, lossy, out);
                }
            }
            Value::Number(n) if lossy => out.push((path.to_string(), n.as_u64().unwrap_or(0))),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", health, false, &mut out);
    out
}
