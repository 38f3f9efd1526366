//! One measured window of a profiler process: its CPU by thread
//! (`/proc/PID/task/*/stat` every 5 s, the threads that exited in between
//! from the process's own total), its RSS (VmRSS every 5 s, VmHWM at the
//! end), the host's CPU and load; for wallscope also `/healthz` once a
//! second: drains, merged and dropped batches, and each symbolized batch's
//! time (`last_symbolize_us` whenever `symbolized_batches` moved on).

use crate::common::{healthz, procfs};
use anyhow::{ensure, Result};
use serde_json::Value;
use std::fs;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Period of the `/healthz` reads (the drain interval is 1 s).
const POLL: Duration = Duration::from_secs(1);
/// `/healthz` reads between two CPU-by-thread and RSS samples.
const SAMPLE_EVERY: u64 = 5;

/// What one window measured.
pub struct Window {
    pub secs: f64,
    /// CPU seconds of the whole process (exited threads included).
    pub cpu_s: f64,
    /// CPU seconds by thread name, most first; threads that exited between
    /// two samples are in `cpu_s` only.
    pub by_thread: Vec<(String, f64)>,
    /// VmRSS samples (KiB) and VmHWM at the end.
    pub rss_kib: Vec<u64>,
    pub hwm_kib: u64,
    /// Host CPUs kept busy (all but idle and iowait), on average.
    pub host_busy: f64,
    pub load_end: [f64; 3],
    /// `/healthz` over the window: drains and batches merged and dropped.
    pub health: Option<Health>,
}

/// What `/healthz` said over a window.
pub struct Health {
    pub drains: u64,
    pub merged: u64,
    pub dropped: u64,
    /// Each symbolized batch's time, ms: exact when one poll saw one new
    /// batch; when it saw several, the last exact and the others their mean.
    pub symbolize_ms: Vec<f64>,
    pub exact: usize,
    /// `/healthz` at the end.
    pub last: Value,
}

/// The `pipeline` counters a window is measured by.
#[derive(Clone, Copy)]
struct Counters {
    drains: u64,
    merged: u64,
    dropped: u64,
    batches: u64,
    total_us: u64,
    last_us: u64,
}

impl Counters {
    fn of(h: &Value) -> Option<Counters> {
        let p = &h["pipeline"];
        let n = |k: &str| p[k].as_u64();
        Some(Counters {
            drains: n("drains")?,
            merged: n("batches_merged")?,
            dropped: n("batches_dropped")?,
            batches: n("symbolized_batches")?,
            total_us: n("symbolize_us_total")?,
            last_us: n("last_symbolize_us")?,
        })
    }
}

/// Measures process `pid` for `secs` seconds (wallscope's `/healthz` on
/// `port`, if given), calling `alive` (which fails if the process or its
/// load died) every second.
pub fn window(
    pid: u32,
    port: Option<u16>,
    secs: u64,
    alive: &mut dyn FnMut() -> Result<()>,
) -> Result<Window> {
    let ticks = || -> Result<u64> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
        Ok(procfs::stat_ticks(&stat)?.1)
    };
    // On a very busy host one read may time out (2 s): tried for 60 s.
    let counters = |port: u16| -> Result<Counters> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(c) = healthz(port).as_ref().and_then(Counters::of) {
                return Ok(c);
            }
            ensure!(
                Instant::now() < deadline,
                "no pipeline counters in /healthz for 60 s"
            );
            sleep(POLL);
        }
    };
    let first = port.map(counters).transpose()?;
    let mut previous = first;
    let mut symbolize_ms = Vec::new();
    let mut exact = 0;
    let mut last = Value::Null;
    let mut threads = procfs::ThreadCpu::default();
    threads.sample(pid)?;
    let mut rss_kib = vec![procfs::status_kib(pid, "VmRSS:")?];
    let (host0, ticks0) = (procfs::host_cpu()?, ticks()?);
    let start = Instant::now();
    for tick in 1..=secs {
        sleep((start + POLL * tick as u32).saturating_duration_since(Instant::now()));
        alive()?;
        if let Some(port) = port {
            // A busy host may leave one read unanswered; the next catches up.
            if let Some((h, c)) = healthz(port).and_then(|h| Some((h.clone(), Counters::of(&h)?))) {
                let p = previous.unwrap_or(c);
                let new = c.batches.saturating_sub(p.batches);
                if new > 0 {
                    symbolize_ms.push(c.last_us as f64 / 1e3);
                    exact += (new == 1) as usize;
                    let rest = c.total_us.saturating_sub(p.total_us + c.last_us);
                    let mean = rest as f64 / 1e3 / (new - 1).max(1) as f64;
                    symbolize_ms.extend(std::iter::repeat_n(mean, new as usize - 1));
                }
                (previous, last) = (Some(c), h);
            }
        }
        if tick % SAMPLE_EVERY == 0 || tick == secs {
            threads.sample(pid)?;
            rss_kib.push(procfs::status_kib(pid, "VmRSS:")?);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let (host1, ticks1) = (procfs::host_cpu()?, ticks()?);
    let hwm_kib = procfs::status_kib(pid, "VmHWM:")?;
    let health = match (first, previous) {
        (Some(a), Some(b)) => {
            ensure!(!last.is_null(), "/healthz never answered in the window");
            Some(Health {
                drains: b.drains - a.drains,
                merged: b.merged - a.merged,
                dropped: b.dropped - a.dropped,
                symbolize_ms,
                exact,
                last,
            })
        }
        _ => None,
    };
    let busy = (host1.0 - host0.0) as f64 / (host1.1 - host0.1).max(1) as f64;
    Ok(Window {
        secs: elapsed,
        cpu_s: (ticks1 - ticks0) as f64 / procfs::clock_ticks(),
        by_thread: threads.by_name(),
        rss_kib,
        hwm_kib,
        host_busy: busy * std::thread::available_parallelism()?.get() as f64,
        load_end: procfs::load_average()?,
        health,
    })
}

impl Window {
    /// Percent of one CPU the process used.
    pub fn cpu_pct(&self) -> f64 {
        self.cpu_s / self.secs * 100.0
    }

    /// Median VmRSS, MB.
    pub fn rss_mb(&self) -> f64 {
        crate::common::median(self.rss_kib.iter().map(|k| *k as f64)).unwrap_or(0.0) / 1024.0
    }

    pub fn hwm_mb(&self) -> f64 {
        self.hwm_kib as f64 / 1024.0
    }
}
