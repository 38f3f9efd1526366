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
//! Overhead: `tests/workloads/python/tight.py` (a loop under 30 Python
//! frames) counts its own iterations/s alone, with py-spy attached (99 Hz,
//! non-blocking) and with the wallscope daemon running (99 Hz), in turn,
//! each round starting with a different one.
//!
//! Prints the figures and writes `bench/results/python.md`. Needs root and
//! py-spy (`scripts/deps.sh bench` puts it in /opt/wallscope-pyspy). Env:
//! `WS_BENCH_PYTHONS` (comma-separated interpreters instead of the
//! default), `WS_BENCH_SECONDS` (default 20: each accuracy window),
//! `WS_BENCH_ROUNDS` (default 3) and `WS_BENCH_OVERHEAD_SECONDS` (default
//! 10: each overhead window).

#[path = "common/mod.rs"]
mod common;

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
    let pyspy = pyspy()?;
    let daemon = common::daemon_binary()?;
    let tmp = tempfile::tempdir()?;
    let pythons = pythons()?;
    ensure!(!pythons.is_empty(), "no CPython found (WS_BENCH_PYTHONS)");
    let seconds = env_u64("WS_BENCH_SECONDS", 20)?;
    let rounds = env_u64("WS_BENCH_ROUNDS", 3)? as usize;
    let overhead_s = env_u64("WS_BENCH_OVERHEAD_SECONDS", 10)?;

    let mut accuracy = Vec::new();
    {
        let (mut d, port) = serve(&daemon, &tmp.path().join("daemon.log"))?;
        for python in &pythons {
            eprintln!("accuracy: {} ({seconds} s)", python.display());
            let a = compare(&pyspy, python, port, seconds, tmp.path())
                .with_context(|| format!("accuracy under {}", python.display()))?;
            eprintln!("  {}", a.summary());
            accuracy.push(a);
        }
        d.stop(libc::SIGTERM)?;
    }

    let mut runs: Vec<Vec<Run>> = CONFIGS.iter().map(|_| Vec::new()).collect();
    let mut foreign = BTreeSet::new();
    let tight = Tight::start(&pythons[0], tmp.path())?;
    for round in 1..=rounds {
        for i in (0..CONFIGS.len()).map(|i| (i + round - 1) % CONFIGS.len()) {
            let c = CONFIGS[i];
            if c == Config::Alone {
                foreign.extend(foreign_profilers());
            }
            let r = measure(c, &tight, &pyspy, &daemon, overhead_s, tmp.path())
                .with_context(|| format!("round {round}, {c}"))?;
            eprintln!("round {round}/{rounds} {c:<22} {:>12.0} it/s", r.rate);
            runs[i].push(r);
        }
    }
    drop(tight);
    let versions = Versions::read(&pyspy, &pythons[0])?;
    let overhead = Overhead {
        rounds,
        seconds: overhead_s,
        runs,
        foreign,
    };
    let report = render(&versions, seconds, &accuracy, &overhead)?;
    common::write_report("python", &report)
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

/// `wallscope serve` at [`HZ`], past its first drains.
fn serve(daemon: &Path, log: &Path) -> Result<(Guard, u16)> {
    let port = free_port()?;
    let mut cmd = Command::new(daemon);
    cmd.args(["serve", "--frequency", &HZ.to_string(), "--listen"])
        .arg(format!("127.0.0.1:{port}"));
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

/// Per-function shares (0..1) of one profile, by [`key`].
#[derive(Default)]
struct Profile {
    /// The main thread's samples (py-spy), µs (wallscope) or ns (truth).
    total: f64,
    /// Other threads' samples or µs: not in the shares.
    other: f64,
    /// Of stacks containing the function.
    inclusive: BTreeMap<String, f64>,
    /// Of stacks whose innermost Python frame it is.
    leaf: BTreeMap<String, f64>,
    /// The longest name seen per key (a qualname when there is one).
    names: BTreeMap<String, String>,
}

impl Profile {
    /// From stacks of Python qualnames (root first), their weights and
    /// whether they are the main thread's: only those count, the others'
    /// weight is kept in `other`.
    fn from_stacks(stacks: impl IntoIterator<Item = (Vec<String>, f64, bool)>) -> Profile {
        let mut p = Profile::default();
        for (frames, weight, main) in stacks {
            if !main {
                p.other += weight;
                continue;
            }
            p.total += weight;
            let keys: BTreeSet<String> = frames.iter().map(|f| p.name(f)).collect();
            for k in keys {
                *p.inclusive.entry(k).or_default() += weight;
            }
            if let Some(leaf) = frames.last() {
                *p.leaf.entry(key(leaf)).or_default() += weight;
            }
        }
        p.normalise();
        p
    }

    fn name(&mut self, qualname: &str) -> String {
        let k = key(qualname);
        let name = self.names.entry(k.clone()).or_default();
        if qualname.len() > name.len() {
            *name = qualname.to_string();
        }
        k
    }

    fn normalise(&mut self) {
        let total = self.total.max(1e-9);
        self.inclusive.values_mut().for_each(|v| *v /= total);
        self.leaf.values_mut().for_each(|v| *v /= total);
    }

    /// The [`TOP`] keys by inclusive share (ties by name).
    fn top(&self) -> Vec<String> {
        let mut all: Vec<(&String, &f64)> = self.inclusive.iter().collect();
        all.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
        all.into_iter().take(TOP).map(|(k, _)| k.clone()).collect()
    }

    fn has_frames(&self) -> bool {
        !self.inclusive.is_empty()
    }
}

/// What functions are matched by: the qualname's innermost component
/// (`outer_a.<locals>.inner_a` -> `inner_a`), as py-spy and 3.10 name them.
fn key(qualname: &str) -> String {
    qualname.rsplit('.').next().unwrap_or(qualname).to_string()
}

/// A wallscope frame's Python qualname: `qualname_[py]` or
/// `file.py:qualname_[py]` (a qualname has no `:`); other frames (native,
/// kernel, `[GIL]`) are not Python functions.
fn wallscope_frame(frame: &str) -> Option<&str> {
    let f = frame.strip_suffix("_[py]")?;
    Some(f.rsplit_once(':').map_or(f, |(_file, q)| q))
}

/// A py-spy raw frame's qualname: `qualname (file.py:line)`.
fn pyspy_frame(frame: &str) -> &str {
    match frame.rsplit_once(" (") {
        Some((name, place)) if place.ends_with(')') => name,
        _ => frame,
    }
}

/// Folded text (`a;b;c N` lines) as frames and weights.
fn folded(text: &str) -> impl Iterator<Item = (Vec<&str>, f64)> {
    text.lines().filter_map(|line| {
        let (stack, n) = line.rsplit_once(' ')?;
        Some((stack.split(';').collect(), n.trim().parse().ok()?))
    })
}

/// py-spy's `--threads` output: each stack under `thread (ID): NAME`, ID
/// the kernel tid (3.11+: the main thread's is the pid) or, where py-spy
/// has no tid, `0x` and the pthread id; Python's name for the main thread
/// is `MainThread`.
fn pyspy_profile(text: &str, pid: u32) -> Profile {
    let by_tid = format!("thread ({pid})");
    Profile::from_stacks(folded(text).map(|(frames, n)| {
        let (main, frames) = match frames.split_first() {
            Some((t, rest)) if t.starts_with("thread (") => {
                (t.ends_with("): MainThread") || t.starts_with(&by_tid), rest)
            }
            _ => (true, &frames[..]),
        };
        let py = frames.iter().map(|f| pyspy_frame(f).to_string());
        (py.collect(), n, main)
    }))
}

/// wallscope's `group=thread` output: each stack under `NAME [tid T]`;
/// the main thread's tid is the pid.
fn wallscope_profile(text: &str, pid: u32) -> Profile {
    let main_thread = format!("[tid {pid}]");
    Profile::from_stacks(folded(text).map(|(frames, n)| {
        let main = frames.iter().take(3).any(|f| f.ends_with(&main_thread));
        let py = frames.iter().filter_map(|f| wallscope_frame(f));
        (py.map(str::to_string).collect(), n, main)
    }))
}

/// The workload's truth over a window: the difference of two of its
/// cumulative JSON reports.
fn truth_profile(before: &Value, after: &Value) -> Result<Profile> {
    let ns = |v: &Value, field: &str, name: &str| v[field][name].as_f64().unwrap_or(0.0);
    let total = after["total_ns"].as_f64().context("no total_ns")?
        - before["total_ns"].as_f64().unwrap_or(0.0);
    ensure!(total > 0.0, "the workload used no CPU in the window");
    let mut p = Profile {
        total,
        ..Profile::default()
    };
    let names = after["inclusive"].as_object().context("no inclusive")?;
    for name in names.keys() {
        let k = p.name(name);
        let incl = ns(after, "inclusive", name) - ns(before, "inclusive", name);
        let own = ns(after, "functions", name) - ns(before, "functions", name);
        p.inclusive.insert(k.clone(), incl);
        p.leaf.insert(k, own);
    }
    p.normalise();
    Ok(p)
}

/// The normalisers on the frame forms each tool writes.
fn check_normalisers() -> Result<()> {
    let ws = [
        ("shares.py:outer_a.<locals>.inner_a_[py]", Some("inner_a")),
        ("Worker.crunch_[py]", Some("crunch")),
        ("/usr/lib/x.py:<lambda>_[py]", Some("<lambda>")),
        ("[GIL]", None),
        ("_PyEval_EvalFrameDefault", None),
    ];
    for (frame, want) in ws {
        let got = wallscope_frame(frame).map(key);
        ensure!(got.as_deref() == want, "wallscope {frame:?}: {got:?}");
    }
    let ps = [
        ("Worker.crunch (shares.py:97)", "crunch"),
        ("<module> (shares.py:234)", "<module>"),
        ("inner_a (/a b/shares.py:70)", "inner_a"),
    ];
    for (frame, want) in ps {
        let got = key(pyspy_frame(frame));
        ensure!(got == want, "py-spy {frame:?}: {got:?}");
    }
    Ok(())
}

// ---------------------------------------------------------------- accuracy

/// One interpreter's comparison.
struct Accuracy {
    python: String,
    truth: Profile,
    pyspy: Profile,
    wallscope: Profile,
    pyspy_samples: u64,
    pyspy_errors: u64,
    window_s: f64,
}

impl Accuracy {
    fn summary(&self) -> String {
        format!(
            "py-spy {} samples, top-10 vs truth {}/10, max diff {:.1} pts; wallscope {:.0} ms, \
             vs truth {}/10, vs py-spy {}/10",
            self.pyspy_samples,
            overlap(&self.pyspy, &self.truth),
            max_diff(&self.pyspy, &self.truth, &self.truth.top()).unwrap_or(f64::NAN),
            self.wallscope.total / 1000.0,
            overlap(&self.wallscope, &self.truth),
            overlap(&self.wallscope, &self.pyspy),
        )
    }
}

/// Runs shares.py under `python` with py-spy and the daemon at `port`
/// watching the same window.
fn compare(pyspy: &Path, python: &Path, port: u16, secs: u64, tmp: &Path) -> Result<Accuracy> {
    let truth_path = tmp.join("truth.json");
    let _ = fs::remove_file(&truth_path);
    let truth_arg = truth_path.to_string_lossy().to_string();
    let (mut workload, pid) = start_python(python, "shares.py", &["--truth", &truth_arg])?;
    sleep(WARMUP);
    let before = read_json(&truth_path)?;
    let out = tmp.join("pyspy.txt");
    let log = tmp.join("pyspy.log");
    let mut cmd = Command::new(pyspy);
    cmd.args(["record", "--format", "raw", "--nonblocking", "--threads"])
        .args(["--rate", &HZ.to_string(), "--duration", &secs.to_string()])
        .args(["--pid", &pid.to_string(), "-o"])
        .arg(&out);
    // py-spy prints its sample and error counts on stdout.
    let file = fs::File::create(&log)?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    let mut spy = Guard(cmd.spawn().context("starting py-spy")?);
    let status = spy.0.wait()?;
    // py-spy samples for `secs` once attached: the window ends now.
    let until = unix_now();
    let from = until - secs as f64;
    let after = read_json(&truth_path)?;
    let spy_log = fs::read_to_string(&log).unwrap_or_default();
    ensure!(status.success(), "py-spy failed ({status}):\n{spy_log}");
    ensure!(workload.0.try_wait()?.is_none(), "shares.py exited early");
    sleep(Duration::from_millis(1500));
    settle(port)?;
    let query = format!("/folded?pid={pid}&group=thread&from={from:.3}&until={until:.3}");
    let body = common::get(port, &query)?;
    workload.stop(libc::SIGKILL)?;
    let pyspy_text = fs::read_to_string(&out)?;
    let (samples, errors) = pyspy_counts(&spy_log);
    let before_s = before["total_ns"].as_f64().unwrap_or(0.0);
    let after_s = after["total_ns"].as_f64().unwrap_or(0.0);
    Ok(Accuracy {
        python: after["python"].as_str().unwrap_or("?").to_string(),
        truth: truth_profile(&before, &after)?,
        pyspy: pyspy_profile(&pyspy_text, pid),
        wallscope: wallscope_profile(&body, pid),
        pyspy_samples: samples,
        pyspy_errors: errors,
        window_s: (after_s - before_s) / 1e9,
    })
}

/// py-spy's "Samples: N Errors: M".
fn pyspy_counts(log: &str) -> (u64, u64) {
    let after = |word: &str| {
        let rest = log.rsplit_once(word)?.1;
        rest.split_whitespace().next()?.parse().ok()
    };
    (
        after("Samples:").unwrap_or(0),
        after("Errors:").unwrap_or(0),
    )
}

/// Functions the two top-10s share.
fn overlap(a: &Profile, b: &Profile) -> usize {
    let b = b.top();
    a.top().iter().filter(|k| b.contains(k)).count()
}

/// Largest difference in inclusive share (points) over `keys`; `None` if
/// either profile has no Python frames.
fn max_diff(a: &Profile, b: &Profile, keys: &[String]) -> Option<f64> {
    if !a.has_frames() || !b.has_frames() {
        return None;
    }
    let share = |p: &Profile, k: &String| p.inclusive.get(k).copied().unwrap_or(0.0);
    let diffs = keys
        .iter()
        .map(|k| (share(a, k) - share(b, k)).abs() * 100.0);
    diffs.reduce(f64::max)
}

// ---------------------------------------------------------------- overhead

/// What runs beside tight.py in an overhead window.
#[derive(Clone, Copy, PartialEq)]
enum Config {
    Alone,
    PySpy,
    Wallscope,
}

const CONFIGS: [Config; 3] = [Config::Alone, Config::PySpy, Config::Wallscope];

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Config::Alone => write!(f, "alone"),
            Config::PySpy => write!(f, "py-spy {HZ} Hz nonblocking"),
            Config::Wallscope => write!(f, "wallscope {HZ} Hz"),
        }
    }
}

/// tight.py, running through all the overhead windows.
struct Tight {
    child: Guard,
    pid: u32,
    report: PathBuf,
}

impl Tight {
    fn start(python: &Path, tmp: &Path) -> Result<Tight> {
        let report = tmp.join("tight.json");
        let out = report.to_string_lossy().to_string();
        let (child, pid) = start_python(python, "tight.py", &["--depth", "30", "--out", &out])?;
        sleep(Duration::from_millis(2500));
        Ok(Tight { child, pid, report })
    }

    /// Iterations and ns since its loop started, as last reported.
    fn counters(&self) -> Result<(f64, f64)> {
        let v = read_json(&self.report)?;
        let n = |f: &str| {
            v[f].as_f64()
                .with_context(|| format!("no {f} in tight.json"))
        };
        Ok((n("iterations")?, n("elapsed_ns")?))
    }
}

impl Drop for Tight {
    fn drop(&mut self) {
        let _ = self.child.stop(libc::SIGKILL);
    }
}

/// Profilers running that this bench did not start (another wallscope,
/// py-spy, perf): the `alone` runs are not alone then.
fn foreign_profilers() -> Vec<String> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id().to_string();
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().into_string().ok()?;
            let comm = fs::read_to_string(e.path().join("comm")).ok()?;
            let ours = fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, r)| r.split_whitespace().nth(1) == Some(&me))
                })
                .unwrap_or(false);
            let comm = comm.trim();
            let profiler = ["wallscope", "py-spy", "perf"].contains(&comm);
            (profiler && !ours).then(|| {
                let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                format!("{comm} (pid {pid}): `{}`", cmd.trim())
            })
        })
        .collect()
}

/// The overhead windows' results, by [`CONFIGS`].
struct Overhead {
    rounds: usize,
    seconds: u64,
    runs: Vec<Vec<Run>>,
    foreign: BTreeSet<String>,
}

struct Run {
    /// Loop iterations per second.
    rate: f64,
    /// CPU seconds the profiler used during the window.
    tool_cpu_s: Option<f64>,
}

fn measure(
    c: Config,
    tight: &Tight,
    pyspy: &Path,
    daemon: &Path,
    secs: u64,
    tmp: &Path,
) -> Result<Run> {
    ensure!(
        Path::new(&format!("/proc/{}", tight.pid)).exists(),
        "tight.py is gone"
    );
    let log = tmp.join("overhead.log");
    let (mut tool, signal) = match c {
        Config::Alone => (None, 0),
        Config::PySpy => {
            let mut cmd = Command::new(pyspy);
            cmd.args(["record", "--format", "raw", "--nonblocking"])
                .args(["--rate", &HZ.to_string(), "--pid", &tight.pid.to_string()])
                .arg("-o")
                .arg(tmp.join("overhead-pyspy.txt"));
            (Some(common::spawn_logged(&mut cmd, &log)?), libc::SIGINT)
        }
        Config::Wallscope => (Some(serve(daemon, &log)?.0), libc::SIGTERM),
    };
    sleep(SETTLE);
    if let Some(t) = tool.as_mut() {
        if let Some(status) = t.0.try_wait()? {
            bail!("{c} exited with {status}: {}", fs::read_to_string(&log)?);
        }
    }
    // Whole reports only: wait for the next one, then count to the one
    // `secs` later.
    let (i0, t0) = next_report(tight, None)?;
    let cpu0 = tool.as_ref().map(|t| t.cpu_seconds()).transpose()?;
    sleep(Duration::from_secs(secs.saturating_sub(1)));
    let (i1, t1) = next_report(tight, Some(t0 + (secs as f64 - 0.5) * 1e9))?;
    let cpu1 = tool.as_ref().map(|t| t.cpu_seconds()).transpose()?;
    if let Some(t) = tool.as_mut() {
        t.stop(signal)?;
    }
    Ok(Run {
        rate: (i1 - i0) * 1e9 / (t1 - t0),
        tool_cpu_s: cpu0.zip(cpu1).map(|(a, b)| b - a),
    })
}

/// The first report tight.py writes after now (and at or after
/// `min_elapsed_ns` of its clock).
fn next_report(tight: &Tight, min_elapsed_ns: Option<f64>) -> Result<(f64, f64)> {
    let (_, now) = tight.counters()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (i, t) = tight.counters()?;
        if t > now && t >= min_elapsed_ns.unwrap_or(0.0) {
            return Ok((i, t));
        }
        ensure!(Instant::now() < deadline, "tight.py stopped reporting");
        sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------- report

struct Versions {
    pyspy: String,
    wallscope: String,
    tight_python: String,
    cpu: String,
}

impl Versions {
    fn read(pyspy: &Path, python: &Path) -> Result<Versions> {
        let out = |cmd: &mut Command| -> String {
            cmd.output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default()
        };
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo.lines().find_map(|l| l.strip_prefix("model name"));
        let model = model.map(|m| m.trim_start_matches([' ', '\t', ':']).to_string());
        Ok(Versions {
            pyspy: out(Command::new(pyspy).arg("--version")),
            wallscope: out(Command::new("git")
                .args(["describe", "--always", "--dirty"])
                .current_dir(ROOT)),
            tight_python: out(Command::new(python).arg("--version")),
            cpu: format!(
                "{} x {}",
                std::thread::available_parallelism()?.get(),
                model.unwrap_or_else(|| "?".into())
            ),
        })
    }
}

/// Share (%) of a profile's weight on other threads than main.
fn other_pct(p: &Profile) -> f64 {
    p.other * 100.0 / (p.total + p.other).max(1e-9)
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.1}", v * 100.0))
}

fn pts(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

fn render(v: &Versions, seconds: u64, accuracy: &[Accuracy], o: &Overhead) -> Result<String> {
    let (rounds, overhead_s, runs) = (o.rounds, o.seconds, &o.runs);
    let (date, kernel, load) = common::system()?;
    let mut s = format!(
        "# Python: wallscope against py-spy\n\n- date: {date}\n- kernel: {kernel}\n\
         - CPUs: {cpu}\n\
         - py-spy: {pyspy} (`record --format raw --nonblocking --threads --rate {HZ}`)\n\
         - wallscope: {ws} (`serve --frequency {HZ}`, \
         `GET /folded?pid=P&group=thread&from=F&until=U`)\n\
         - load average after the runs: {load}\n\n",
        cpu = v.cpu,
        pyspy = v.pyspy,
        ws = v.wallscope,
    );
    s += &format!(
        "## Accuracy\n\n`tests/workloads/python/shares.py`, {seconds} s watched by both at once, \
         against the CPU time the workload measured itself per function over the same \
         window. Shares are of the main thread's samples (the other threads only \
         block; the share of samples a profiler put on them is listed). Inclusive \
         share: of those samples, the ones whose stack contains the function (truth: \
         its CPU time with its callees' over the main thread's). \
         Leaf share: those whose innermost Python frame it is (truth: its self time). \
         Functions match by the innermost part of the qualname. Targets: wallscope's \
         and py-spy's top-{TOP} by inclusive share share >= {MIN_OVERLAP}, each \
         differing by <= {MAX_DIFF} points.\n\n"
    );
    let mut rows = Vec::new();
    for a in accuracy {
        let keys = a.truth.top();
        let both: Vec<String> = {
            let mut k = a.pyspy.top();
            k.extend(a.wallscope.top());
            k.sort();
            k.dedup();
            k
        };
        let ws_vs_spy = max_diff(&a.wallscope, &a.pyspy, &both);
        let verdict = if !a.wallscope.has_frames() {
            "wallscope: NO PYTHON FRAMES".to_string()
        } else if overlap(&a.wallscope, &a.pyspy) >= MIN_OVERLAP
            && ws_vs_spy.is_some_and(|d| d <= MAX_DIFF)
        {
            "MEETS".to_string()
        } else {
            "MISSES".to_string()
        };
        rows.push(vec![
            a.python.clone(),
            format!(
                "{:.0} / {} ({} errors)",
                a.pyspy.total, a.pyspy_samples, a.pyspy_errors
            ),
            format!("{:.1}", other_pct(&a.pyspy)),
            format!("{:.0}", a.wallscope.total / 1000.0),
            format!("{:.1}", other_pct(&a.wallscope)),
            format!("{}/{TOP}", overlap(&a.pyspy, &a.truth)),
            format!("{}/{TOP}", overlap(&a.wallscope, &a.truth)),
            format!("{}/{TOP}", overlap(&a.wallscope, &a.pyspy)),
            pts(max_diff(&a.pyspy, &a.truth, &keys)),
            pts(max_diff(&a.wallscope, &a.truth, &keys)),
            pts(ws_vs_spy),
            verdict,
        ]);
    }
    s += &common::table(
        &[
            "CPython",
            "py-spy samples: main thread / all",
            "py-spy other threads %",
            "wallscope CPU ms, main thread",
            "wallscope other threads %",
            "top-10 py-spy ∩ truth",
            "wallscope ∩ truth",
            "wallscope ∩ py-spy",
            "max Δ py-spy/truth (pts)",
            "max Δ wallscope/truth",
            "max Δ wallscope/py-spy",
            "verdict",
        ],
        &rows,
    );
    for a in accuracy {
        s += &format!(
            "\n### CPython {} (truth window {:.1} s of main-thread CPU)\n\n",
            a.python, a.window_s
        );
        let mut keys = a.truth.top();
        for k in a.pyspy.top().into_iter().chain(a.wallscope.top()) {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let rows: Vec<Vec<String>> = keys
            .iter()
            .map(|k| {
                let name = [&a.truth, &a.wallscope, &a.pyspy]
                    .iter()
                    .find_map(|p| p.names.get(k))
                    .cloned()
                    .unwrap_or_else(|| k.clone());
                let incl = |p: &Profile| {
                    p.has_frames()
                        .then(|| p.inclusive.get(k).copied().unwrap_or(0.0))
                };
                let leaf = |p: &Profile| {
                    p.has_frames()
                        .then(|| p.leaf.get(k).copied().unwrap_or(0.0))
                };
                let diff = incl(&a.wallscope)
                    .zip(incl(&a.pyspy))
                    .map(|(w, p)| (w - p).abs() * 100.0);
                vec![
                    format!("`{name}`"),
                    pct(incl(&a.truth)),
                    pct(incl(&a.pyspy)),
                    pct(incl(&a.wallscope)),
                    pct(leaf(&a.truth)),
                    pct(leaf(&a.pyspy)),
                    pct(leaf(&a.wallscope)),
                    pts(diff),
                ]
            })
            .collect();
        s += &common::table(
            &[
                "function",
                "inclusive % truth",
                "py-spy",
                "wallscope",
                "leaf % truth",
                "py-spy",
                "wallscope",
                "Δ inclusive wallscope/py-spy (pts)",
            ],
            &rows,
        );
    }

    let rate = |r: &[Run]| common::median(r.iter().map(|r| r.rate)).unwrap_or(f64::NAN);
    let base = rate(&runs[0]);
    s += &format!(
        "\n## Overhead\n\n`tests/workloads/python/tight.py --depth 30` under {py} (one \
         process throughout), its own loop iterations/s over {overhead_s} s windows: alone, \
         with py-spy attached, with the wallscope daemon running; {rounds} rounds, the \
         first configuration rotated each round. Profiler CPU: the profiler process's \
         user + system time over the window.\n\n",
        py = v.tight_python
    );
    let mut rows = Vec::new();
    for (c, r) in CONFIGS.iter().zip(runs) {
        let m = rate(r);
        let (lo, hi) = common::spread(r.iter().map(|r| r.rate), m);
        let paired = common::median(
            runs[0]
                .iter()
                .zip(r)
                .map(|(b, x)| (b.rate / x.rate - 1.0) * 100.0),
        );
        let cpu = common::median(r.iter().filter_map(|r| r.tool_cpu_s));
        let is_base = *c == Config::Alone;
        rows.push(vec![
            c.to_string(),
            format!("{m:.0}"),
            format!("{lo:+.2} % / {hi:+.2} %"),
            if is_base {
                "-".into()
            } else {
                format!("{:.4}", base / m)
            },
            if is_base {
                "-".into()
            } else {
                paired.map_or("-".into(), |p| format!("{p:+.2} %"))
            },
            cpu.map_or("-".into(), |c| format!("{c:.2}")),
        ]);
    }
    s += &common::table(
        &[
            "configuration",
            "median it/s",
            "min / max vs median",
            "ratio alone / this (medians)",
            "paired overhead (median of per-round)",
            "profiler CPU s/window",
        ],
        &rows,
    );
    if !o.foreign.is_empty() {
        s += "\nNot alone: profilers this bench did not start ran during the `alone` \
              windows (and so during all of them):\n\n";
        o.foreign.iter().for_each(|f| s += &format!("- {f}\n"));
    }
    s += "\nWith more than one CPU the single-threaded workload leaves the profilers \
          a CPU of their own: the overhead is what sampling costs the workload's \
          thread (py-spy's reads of its memory, wallscope's in-kernel walk); the \
          profiler's own CPU is listed apart.\n";
    Ok(s)
}
