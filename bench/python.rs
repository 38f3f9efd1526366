//! Python CPU profiles and overhead: wallscope against py-spy, both checked
//! against the workload's own measurement.
//!
//! Accuracy: for each CPython (`/usr/bin/python3.11` and every pyenv
//! 3.10-3.13 found), `tests/workloads/python/shares.py` runs while py-spy
//! (`record --format raw --nonblocking --threads --rate 99`) and the
//! wallscope daemon (99 Hz, `GET /folded?pid=P&group=thread&from=..&until=..`
//! over py-spy's window) watch the same seconds. The workload itself
//! measures the CPU time of each function of its main thread
//! (`time.thread_time_ns()`), the ground truth; its other threads only
//! block. Per function, of the main thread's samples:
//! - inclusive share: the share of samples whose stack contains the
//!   function (the truth: the function's CPU time, its callees' included,
//!   over the main thread's CPU time);
//! - leaf share: the share of samples whose innermost Python frame is the
//!   function (C code a function calls counts for it; the truth: its self
//!   time).
//!
//! Functions are matched by their innermost name component (`Worker.crunch`
//! and `crunch`, `outer_a.<locals>.inner_a` and `inner_a` match): py-spy
//! and 3.10 give `co_name` only. Targets: the top-10s by inclusive share
//! share at least 9 functions, and each of them differs by at most 5
//! points. A miss is reported, not an error.
//!
//! BPF cost of Python frames: with `kernel.bpf_stats_enabled=1`, the
//! daemon runs with `--python off` and `--python on` in turn (the order
//! alternating each round), beside `tight.py --depth 30` (on-CPU: each
//! sample of it walks 30 Python frames) and, apart, `tight.py --depth 30
//! --block` (1 ms sleeps 30 frames deep, the daemon with
//! `--offcpu-sample-us 0` so that every wakeup's off-CPU stack is walked,
//! at switch-in). Per window: the run time of all the daemon's linked BPF
//! programs per second, `python_stack_walks` per second (`/healthz`), and
//! so the ns added per Python walk: (BPF ns/s on - off) / (walks/s on);
//! per program, `run_time_ns / run_cnt`; and the daemon's own timer of its
//! user stack walks (`/metrics`) as a cross-check.
//!
//! Overhead: `tests/workloads/python/tight.py` (a loop under 30 Python
//! frames) counts its own iterations/s alone, with py-spy attached (99 Hz,
//! non-blocking) and with the wallscope daemon running (99 Hz, `--python
//! on`), in turn, each round starting with a different one: the rate over
//! each window and the median of its per-second rates (this VM's speed
//! dips for seconds at a time). Each window also records the CPU the rest
//! of the host used; the part first waits for a quiet host, and the
//! figures leave out rounds that were not quiet when 5 or more were.
//!
//! Prints the figures and writes `bench/results/python.md`. Needs root,
//! bpftool and py-spy (`scripts/deps.sh bench` puts it in
//! /opt/wallscope-pyspy). Env: `WS_BENCH_PARTS` (comma-separated, of
//! `accuracy,cost,overhead`, the default: the parts to run; the report
//! keeps the other parts' sections from the last report),
//! `WS_BENCH_PYTHONS` (comma-separated interpreters instead of the
//! default; the first runs tight.py), `WS_BENCH_SECONDS` (default 20:
//! each accuracy window), `WS_BENCH_COST_ROUNDS` (default 5) and
//! `WS_BENCH_COST_SECONDS` (default 10: each cost window),
//! `WS_BENCH_ROUNDS` (default 10) and `WS_BENCH_OVERHEAD_SECONDS` (default
//! 10: each overhead window), `WS_BENCH_QUIET_WAIT` (default 600: seconds
//! the overhead part waits at most for a quiet host).

#[path = "python/accuracy.rs"]
mod accuracy;
#[path = "common/mod.rs"]
mod common;
#[path = "python/cost.rs"]
mod cost;
#[path = "python/overhead.rs"]
mod overhead;
#[path = "python/profile.rs"]
mod profile;

use accuracy::*;
use cost::*;
use overhead::*;
use profile::*;

use anyhow::{bail, ensure, Context, Result};
use common::{env_u64, find_tool, free_port, healthz, Guard, ROOT};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use std::{env, fmt, fs};

/// Sampling rate of both profilers.
const HZ: u64 = 99;
/// Workload time before a window starts: its first JSON is written and
/// the daemon has found the process.
const WARMUP: Duration = Duration::from_secs(3);
/// Time a profiler gets to attach before an overhead window.
const SETTLE: Duration = Duration::from_secs(1);
/// Functions compared per profile.
const TOP: usize = 10;
/// Targets: shared functions in the two top-10s, and largest difference
/// (points of inclusive share).
const MIN_OVERLAP: usize = 9;
const MAX_DIFF: f64 = 5.0;

fn main() {
    common::main("python", run);
}

fn run() -> Result<()> {
    common::require_root("wallscope loads eBPF programs; py-spy reads other processes")?;
    check_normalisers()?;
    let parts = parts()?;
    let pyspy = pyspy()?;
    let daemon = common::daemon_binary()?;
    require_python_option(&daemon)?;
    let tmp = tempfile::tempdir()?;
    let pythons = pythons()?;
    ensure!(!pythons.is_empty(), "no CPython found (WS_BENCH_PYTHONS)");
    let mut sections = Vec::new();

    if parts.contains(&Part::Accuracy) {
        let seconds = env_u64("WS_BENCH_SECONDS", 20)?;
        let mut accuracy = Vec::new();
        let (mut d, port) = serve(&daemon, &tmp.path().join("daemon.log"), &[])?;
        for python in &pythons {
            eprintln!("accuracy: {} ({seconds} s)", python.display());
            let a = compare(&pyspy, python, port, seconds, tmp.path())
                .with_context(|| format!("accuracy under {}", python.display()))?;
            eprintln!("  {}", a.summary());
            accuracy.push(a);
        }
        d.stop(libc::SIGTERM)?;
        sections.push((Part::Accuracy, render_accuracy(seconds, &accuracy)?));
    }

    if parts.contains(&Part::Cost) {
        let cost = cost(&daemon, &pythons[0], tmp.path())?;
        sections.push((Part::Cost, render_cost(&cost)?));
    }

    if parts.contains(&Part::Overhead) {
        let rounds = env_u64("WS_BENCH_ROUNDS", 10)? as usize;
        let overhead_s = env_u64("WS_BENCH_OVERHEAD_SECONDS", 10)?;
        let quiet = wait_quiet(Duration::from_secs(env_u64("WS_BENCH_QUIET_WAIT", 600)?))?;
        let mut runs: Vec<Vec<Run>> = CONFIGS.iter().map(|_| Vec::new()).collect();
        let mut foreign = BTreeSet::new();
        let tight = Tight::start(&pythons[0], tmp.path(), &[])?;
        for round in 1..=rounds {
            for i in (0..CONFIGS.len()).map(|i| (i + round - 1) % CONFIGS.len()) {
                let c = CONFIGS[i];
                if c == Config::Alone {
                    foreign.extend(foreign_profilers());
                }
                let r = measure(c, &tight, &pyspy, &daemon, overhead_s, tmp.path())
                    .with_context(|| format!("round {round}, {c}"))?;
                eprintln!(
                    "round {round}/{rounds} {c:<32} {:>12.0} it/s, rest of host {:.2} CPUs",
                    r.rate, r.others
                );
                runs[i].push(r);
            }
        }
        drop(tight);
        let overhead = Overhead {
            rounds,
            seconds: overhead_s,
            runs,
            foreign,
            quiet,
            python: python_version(&pythons[0]),
        };
        sections.push((Part::Overhead, render_overhead(&overhead)?));
    }

    let versions = Versions::read(&pyspy)?;
    let report = assemble(&render_header(&versions)?, sections)?;
    common::write_report("python", &report)
}

/// A part of the bench, and of its report.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Part {
    Accuracy,
    Cost,
    Overhead,
}

impl Part {
    const ALL: [Part; 3] = [Part::Accuracy, Part::Cost, Part::Overhead];

    fn name(self) -> &'static str {
        match self {
            Part::Accuracy => "accuracy",
            Part::Cost => "cost",
            Part::Overhead => "overhead",
        }
    }

    /// Its section's heading in the report.
    fn heading(self) -> &'static str {
        match self {
            Part::Accuracy => "## Accuracy",
            Part::Cost => "## BPF cost of Python frames",
            Part::Overhead => "## Overhead",
        }
    }
}

/// The parts to run (`WS_BENCH_PARTS`, default all).
fn parts() -> Result<Vec<Part>> {
    let Ok(list) = env::var("WS_BENCH_PARTS") else {
        return Ok(Part::ALL.to_vec());
    };
    let parts = list.split(',').map(str::trim).filter(|p| !p.is_empty());
    let parts = parts.map(|p| {
        let found = Part::ALL.into_iter().find(|part| part.name() == p);
        found.with_context(|| format!("WS_BENCH_PARTS: {p:?} is none of accuracy, cost, overhead"))
    });
    let parts = parts.collect::<Result<Vec<_>>>()?;
    ensure!(!parts.is_empty(), "WS_BENCH_PARTS names no part");
    Ok(parts)
}

/// Fails unless the daemon has `--python` (an older build).
fn require_python_option(daemon: &Path) -> Result<()> {
    let out = Command::new(daemon).args(["serve", "--help"]).output()?;
    ensure!(
        String::from_utf8_lossy(&out.stdout).contains("--python"),
        "{} has no --python: rebuild it (`cargo build --release`)",
        daemon.display()
    );
    Ok(())
}

/// The interpreters to compare under: `WS_BENCH_PYTHONS`, or Debian's
/// python3.11 and each pyenv 3.10 to 3.13.
fn pythons() -> Result<Vec<PathBuf>> {
    if let Ok(list) = env::var("WS_BENCH_PYTHONS") {
        return Ok(list.split(',').map(PathBuf::from).collect());
    }
    let mut found = Vec::new();
    if Path::new("/usr/bin/python3.11").exists() {
        found.push(PathBuf::from("/usr/bin/python3.11"));
    }
    let root = env::var("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(&env::var("HOME").unwrap_or_default()).join(".pyenv"));
    let Ok(dir) = fs::read_dir(root.join("versions")) else {
        return Ok(found);
    };
    let mut versions: Vec<String> = dir
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    versions.sort_by_key(|v| {
        let n: Vec<u32> = v.split('.').filter_map(|p| p.parse().ok()).collect();
        n
    });
    for minor in 10..=13 {
        // The newest patch release of 3.minor.
        let prefix = format!("3.{minor}.");
        let newest = versions.iter().rev().find(|v| v.starts_with(&prefix));
        if let Some(v) = newest {
            let bin = root.join(format!("versions/{v}/bin/python3.{minor}"));
            if bin.exists() {
                found.push(bin);
            }
        }
    }
    Ok(found)
}

fn pyspy() -> Result<PathBuf> {
    let installed = Path::new("/opt/wallscope-pyspy/bin/py-spy");
    if installed.exists() {
        return Ok(installed.to_path_buf());
    }
    find_tool("py-spy", "py-spy from PyPI")
}

/// `wallscope serve` at [`HZ`] with `args`, past its first drains.
fn serve(daemon: &Path, log: &Path, args: &[&str]) -> Result<(Guard, u16)> {
    let port = free_port()?;
    let mut cmd = Command::new(daemon);
    cmd.args(["serve", "--frequency", &HZ.to_string(), "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .args(args);
    let mut d = common::spawn_logged(&mut cmd, log)?;
    let log = || fs::read_to_string(log).unwrap_or_default();
    common::wait_healthy(&mut d, port).with_context(|| format!("daemon log:\n{}", log()))?;
    common::wait_drains(port, 3)?;
    Ok((d, port))
}

/// Waits until the daemon has stored what happened before the call: two
/// more drains, each symbolized, merged or dropped (as the e2e tests'
/// `settle`).
fn settle(port: u16) -> Result<()> {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let drains = |h: &Value| n(&h["pipeline"]["drains"]);
    let from = drains(&healthz(port).context("/healthz")?);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let h = healthz(port).context("/healthz")?;
        let p = &h["pipeline"];
        let stored =
            n(&p["symbolized_batches"]) + n(&p["batches_dropped"]) + n(&p["batches_merged"]);
        if drains(&h) >= from + 2 && stored >= drains(&h) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "daemon did not catch up in 120 s"
        );
        sleep(Duration::from_millis(200));
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A started Python workload that printed `ready <pid>`.
fn start_python(python: &Path, script: &str, args: &[&str]) -> Result<(Guard, u32)> {
    let path = Path::new(ROOT).join("tests/workloads/python").join(script);
    let mut cmd = Command::new(python);
    cmd.arg(&path).args(args);
    let mut child = Guard(cmd.stdout(Stdio::piped()).spawn()?);
    let stdout = child.0.stdout.take().context("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let pid = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok());
    let pid = pid.with_context(|| format!("{script} printed {line:?}, not `ready <pid>`"))?;
    Ok((child, pid))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

// ---------------------------------------------------------------- profiles

struct Versions {
    pyspy: String,
    wallscope: String,
    cpu: String,
}

impl Versions {
    fn read(pyspy: &Path) -> Result<Versions> {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo.lines().find_map(|l| l.strip_prefix("model name"));
        let model = model.map(|m| m.trim_start_matches([' ', '\t', ':']).to_string());
        Ok(Versions {
            pyspy: output(Command::new(pyspy).arg("--version")),
            wallscope: output(
                Command::new("git")
                    .args(["describe", "--always", "--dirty"])
                    .current_dir(ROOT),
            ),
            cpu: format!(
                "{} x {}",
                std::thread::available_parallelism()?.get(),
                model.unwrap_or_else(|| "?".into())
            ),
        })
    }
}

/// A command's trimmed stdout, empty if it could not run.
fn output(cmd: &mut Command) -> String {
    cmd.output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// `python --version`.
fn python_version(python: &Path) -> String {
    output(Command::new(python).arg("--version"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.1}", v * 100.0))
}

fn pts(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

/// The report's header: what ran where.
fn render_header(v: &Versions) -> Result<String> {
    let (date, kernel, load) = common::system()?;
    Ok(format!(
        "# Python: wallscope against py-spy\n\n- date: {date}\n- kernel: {kernel}\n\
         - CPUs: {cpu} (a 2-vCPU VM)\n\
         - py-spy: {pyspy} (`record --format raw --nonblocking --threads --rate {HZ}`)\n\
         - wallscope: {ws} (`serve --frequency {HZ}`, \
         `GET /folded?pid=P&group=thread&from=F&until=U`)\n\
         - load average after the runs: {load}\n\n",
        cpu = v.cpu,
        pyspy = v.pyspy,
        ws = v.wallscope,
    ))
}

/// When a section was measured and how busy the host was then.
fn measured() -> Result<String> {
    let (date, _, load) = common::system()?;
    Ok(format!("Measured {date}; load average after: {load}.\n\n"))
}

/// The report: `header` and `sections`, with the sections of the parts
/// not run this time taken from the last report (`bench/results/`).
fn assemble(header: &str, sections: Vec<(Part, String)>) -> Result<String> {
    let last = fs::read_to_string(Path::new(ROOT).join("bench/results/python.md"));
    let last = last.unwrap_or_default();
    let mut s = header.to_string();
    for part in Part::ALL {
        if let Some((_, text)) = sections.iter().find(|(p, _)| *p == part) {
            s += text;
        } else if let Some(text) = last_section(&last, part) {
            s += &text;
        }
    }
    Ok(s)
}

/// `part`'s section in a report: from its heading to the next `## `.
fn last_section(report: &str, part: Part) -> Option<String> {
    let start = report.find(&format!("{}\n", part.heading()))?;
    let rest = &report[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 4);
    let text = rest[..end].trim_end();
    Some(format!("{text}\n\n"))
}
