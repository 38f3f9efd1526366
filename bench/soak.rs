//! Soak: the release daemon, with its default retention, watching a busy
//! host for `WS_SOAK_MINUTES` (default 30) minutes (issue #24): 10,000
//! mostly sleeping threads in one process, ~100 process spawns a second, a
//! JVM, `perf bench sched messaging` back to back (`soak/load.rs`), a
//! `cargo build` of a crate with dependencies in a loop and one hostile
//! input of each kind the security tests use, run as `nobody`
//! (`soak/extra.rs`).
//!
//! Every 10 s it samples the daemon's RSS and CPU time, the host's load
//! average and `/healthz` (memory by holder, history held, drain
//! percentiles, loss counters); a poller thread reads `/healthz` every
//! 50 ms for its latency and the drains; every minute it checks that the
//! last 600 s are answerable (`x-wallscope-recorded-seconds` of
//! `/threads?seconds=600`) and that the 10,000-thread process is fully
//! recorded; every 5 minutes it runs the heavy whole-window queries (all
//! processes by thread over 600 s, and the host's flame graph)
//! (`soak/probe.rs`). Acceptance (issue #24) is printed PASS/FAIL per line:
//! a FAIL is reported, not an error; the bench fails when it cannot
//! measure. Prints the report and writes `bench/results/soak.md`
//! (`soak/report.rs`).
//!
//! Needs root, gcc, clang, a JDK 17, perf and cargo with crates.io
//! (`scripts/deps.sh bench`). Every child dies with the bench, including
//! when it panics or is killed.

#[path = "common/mod.rs"]
mod common;

#[path = "soak/extra.rs"]
mod extra;
#[path = "soak/load.rs"]
mod load;
#[path = "soak/probe.rs"]
mod probe;
#[path = "soak/report.rs"]
mod report;

use anyhow::{bail, Context, Result};
use common::{free_port, healthz};
use probe::{Coverage, Heavy, PollLog, Poller};
use serde_json::Value;
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

/// Period of the RSS, CPU and `/healthz` samples.
const SAMPLE: Duration = Duration::from_secs(10);
/// Samples between two minute checks: the 600 s window answerable, and
/// the many-threads process completely recorded.
const COVERAGE_EVERY: u64 = 6;
/// Period of the heavy whole-window queries, first one after a period.
const HEAVY_EVERY_S: f64 = 300.0;
/// The duration; shorter runs say so in the report.
pub const FULL_MINUTES: u64 = 30;

fn main() {
    common::main("soak", run);
}

/// One 10-s sample of the daemon.
pub struct Sample {
    /// Seconds since the soak started.
    pub at: f64,
    pub rss_kib: u64,
    pub cpu_s: f64,
    /// The host's 1-, 5- and 15-minute load averages.
    pub load: [f64; 3],
    /// `/healthz`, `Null` if it did not answer.
    pub health: Value,
}

/// Everything a soak measured.
pub struct Soak {
    pub minutes: u64,
    pub secs: f64,
    pub samples: Vec<Sample>,
    pub polls: PollLog,
    pub heavy: Vec<Heavy>,
    pub coverage: Vec<Result<Coverage, String>>,
    /// `(at, recorded seconds of a 600 s window)` every minute.
    pub recorded: Vec<(f64, Result<u64, String>)>,
    /// The cargo build loop: builds completed and failed.
    pub cargo: (u64, u64),
    /// The hostile inputs that ran.
    pub attackers: Vec<String>,
    pub threads_pid: u32,
    pub jvm_pid: u32,
    /// Spawner: processes started and spawns failed.
    pub spawned: (u64, u64),
    /// `perf bench sched messaging`: runs completed and failed.
    pub messaging: (u64, u64),
    /// Host forks and CPU (busy, total ticks) over the soak.
    pub host_forks: u64,
    pub host_cpu: (u64, u64),
}

fn run() -> Result<()> {
    common::require_root("wallscope loads eBPF programs")?;
    let minutes = common::env_u64("WS_SOAK_MINUTES", FULL_MINUTES)?;
    let duration = Duration::from_secs(minutes * 60);
    let bin = common::daemon_binary()?;
    let tmp = tempfile::tempdir()?;
    eprintln!("soak: starting the load");
    let mut load = load::start(tmp.path())?;

    let port = free_port()?;
    let log_path = tmp.path().join("daemon.log");
    let mut daemon = common::serve(&bin, port, &[], &log_path)?;
    let log = || common::log_tail(&log_path, 30);
    let (forks0, cpu0) = (probe::host_forks()?, probe::host_cpu()?);
    let start = Instant::now();
    let poller = Poller::start(port, start);
    eprintln!(
        "soak: daemon pid {} on port {port}, {minutes} min",
        daemon.pid()
    );

    let mut samples = Vec::new();
    let mut coverage = Vec::new();
    let mut recorded = Vec::new();
    let mut heavy = Vec::new();
    let mut running: Option<JoinHandle<Heavy>> = None;
    let mut tick = 0u64;
    loop {
        let at = start.elapsed();
        let heavy_due = (heavy.len() + running.is_some() as usize + 1) as f64 * HEAVY_EVERY_S;
        if at >= duration && running.is_none() {
            break;
        }
        if let Some(status) = daemon.0 .0.try_wait()? {
            bail!("daemon exited with {status}; log:\n{}", log());
        }
        load.check_alive()?;
        let sample = Sample {
            at: at.as_secs_f64(),
            rss_kib: probe::rss_kib(daemon.pid())?,
            cpu_s: daemon.0.cpu_seconds()?,
            load: probe::load_average()?,
            health: healthz(port).unwrap_or(Value::Null),
        };
        progress(&sample, samples.last());
        samples.push(sample);
        if tick > 0 && tick.is_multiple_of(COVERAGE_EVERY) {
            let pid = load.threads.pid();
            let c = probe::coverage(port, pid, start.elapsed().as_secs_f64());
            coverage.push(c.map_err(|e| format!("{e:#}")));
            let r = probe::recorded_seconds(port, pid, 600);
            recorded.push((
                start.elapsed().as_secs_f64(),
                r.map_err(|e| format!("{e:#}")),
            ));
        }
        if running.as_ref().is_some_and(|r| r.is_finished()) {
            let done = running.take().map(JoinHandle::join);
            heavy.push(done.context("no query")?.ok().context("query panicked")?);
        }
        let secs = at.as_secs_f64();
        if running.is_none() && secs >= heavy_due && secs < duration.as_secs_f64() {
            eprintln!("soak: heavy queries at {secs:.0} s");
            running = Some(probe::heavy_query(port, start, poller.heavy.clone()));
        }
        // Absolute schedule: a slow sample shifts no later one.
        tick = (start.elapsed().as_secs_f64() / SAMPLE.as_secs_f64()) as u64 + 1;
        sleep((start + SAMPLE * tick as u32).saturating_duration_since(Instant::now()));
    }
    let secs = start.elapsed().as_secs_f64();
    let polls = std::mem::take(&mut *poller.log.lock().unwrap_or_else(|e| e.into_inner()));
    drop(poller);
    let (forks1, cpu1) = (probe::host_forks()?, probe::host_cpu()?);
    let messaging = load.messaging.stop();
    let cargo = load.cargo.stop();
    let spawned = load.stop_spawner()?;
    daemon.0.stop(libc::SIGTERM)?;
    let soak = Soak {
        minutes,
        secs,
        samples,
        polls,
        heavy,
        coverage,
        recorded,
        cargo,
        attackers: load.hostile.names(),
        threads_pid: load.threads.pid(),
        jvm_pid: load.jvm.pid(),
        spawned,
        messaging,
        host_forks: forks1 - forks0,
        host_cpu: (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1),
    };
    common::write_report("soak", &report::render(&soak)?)
}

/// One line on stderr per sample.
fn progress(s: &Sample, previous: Option<&Sample>) {
    let cpu = previous.map_or(0.0, |p| (s.cpu_s - p.cpu_s) / (s.at - p.at) * 100.0);
    let p = &s.health["pipeline"];
    eprintln!(
        "soak: {:>5.0} s  RSS {:>6.1} MB  CPU {cpu:>5.1} %  load {:.1}  drains {}  \
         drain p99 {} us  max {} us  history {} s  counts_map_full {}",
        s.at,
        s.rss_kib as f64 / 1024.0,
        s.load[0],
        p["drains"],
        p["drain_us_p99"],
        p["max_drain_us"],
        s.health["store"]["history_s"],
        s.health["lost"]["counts_map_full"],
    );
}
