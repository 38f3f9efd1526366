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

/// A wallscope frame's Python qualname: frames are named
/// `qualname (file.py:first_line)_[py]` (3.10: `co_name` in place of the
/// qualname), so `_[py]` and then the place are cut off; other frames
/// (native, kernel, `[GIL]`) are not Python functions. wallscope's own
/// markers (`[unknown]_[py]`, `[more Python frames]_[py]`) have no place
/// and are kept as they are.
fn wallscope_frame(frame: &str) -> Option<&str> {
    Some(strip_place(frame.strip_suffix("_[py]")?))
}

/// A py-spy raw frame's qualname: `qualname (file.py:line)`.
fn pyspy_frame(frame: &str) -> &str {
    strip_place(frame)
}

/// `name (place)` -> `name`; anything else unchanged. A qualname has no
/// ` (`, a file name may.
fn strip_place(frame: &str) -> &str {
    match frame.split_once(" (") {
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
        (
            "outer_a.<locals>.inner_a (shares.py:57)_[py]",
            Some("inner_a"),
        ),
        ("inner_a (shares.py:57)_[py]", Some("inner_a")),
        ("Worker.crunch (shares.py:97)_[py]", Some("crunch")),
        (
            "main.<locals>.<lambda> (shares.py:201)_[py]",
            Some("<lambda>"),
        ),
        ("<module> (shares.py:1)_[py]", Some("<module>")),
        ("f (a (b).py:3)_[py]", Some("f")),
        ("[unknown]_[py]", Some("[unknown]")),
        ("[GIL]", None),
        ("_PyEval_EvalFrameDefault", None),
        ("MainThread [tid 42]", None),
    ];
    for (frame, want) in ws {
        let got = wallscope_frame(frame).map(key);
        ensure!(got.as_deref() == want, "wallscope {frame:?}: {got:?}");
    }
    let ps = [
        ("Worker.crunch (shares.py:97)", "crunch"),
        ("<module> (shares.py:234)", "<module>"),
        ("inner_a (/a b/shares.py:70)", "inner_a"),
        ("f (/tmp/a (b).py:3)", "f"),
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
            Config::Wallscope => write!(f, "wallscope {HZ} Hz --python on"),
        }
    }
}

/// A configuration's name in the per-round table.
fn short(c: Config) -> &'static str {
    match c {
        Config::Alone => "alone",
        Config::PySpy => "py-spy",
        Config::Wallscope => "wallscope",
    }
}

/// tight.py, running through all the overhead windows.
struct Tight {
    child: Guard,
    pid: u32,
    report: PathBuf,
}

impl Tight {
    /// `tight.py --depth 30` and `args`.
    fn start(python: &Path, tmp: &Path, args: &[&str]) -> Result<Tight> {
        let report = tmp.join("tight.json");
        let _ = fs::remove_file(&report);
        let out = report.to_string_lossy().to_string();
        let mut all = vec!["--depth", "30", "--out", &out];
        all.extend(args);
        let (child, pid) = start_python(python, "tight.py", &all)?;
        sleep(Duration::from_millis(2500));
        Ok(Tight { child, pid, report })
    }

    /// Iterations and ns since its loop started, and the iterations/s of
    /// the second before, as last reported.
    fn counters(&self) -> Result<(f64, f64, f64)> {
        let v = read_json(&self.report)?;
        let n = |f: &str| {
            v[f].as_f64()
                .with_context(|| format!("no {f} in tight.json"))
        };
        Ok((n("iterations")?, n("elapsed_ns")?, n("rate")?))
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
    quiet: Quiet,
    /// tight.py's interpreter.
    python: String,
}

struct Run {
    /// Loop iterations per second.
    rate: f64,
    /// The median of the window's per-second rates: the VM's dips of a
    /// few seconds (the loop slowed by a third, with or without a
    /// profiler) weigh less.
    second_median: f64,
    /// CPU seconds the profiler used during the window.
    tool_cpu_s: Option<f64>,
    /// CPUs the rest of the host kept busy on average over the window
    /// (neither tight.py nor the profiler).
    others: f64,
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
        Config::Wallscope => (
            Some(serve(daemon, &log, &["--python", "on"])?.0),
            libc::SIGTERM,
        ),
    };
    sleep(SETTLE);
    if let Some(t) = tool.as_mut() {
        if let Some(status) = t.0.try_wait()? {
            bail!("{c} exited with {status}: {}", fs::read_to_string(&log)?);
        }
    }
    // Whole reports only: wait for the next one, then count to the one
    // `secs` later, keeping each second's rate on the way.
    let (i0, t0) = next_report(tight, None)?;
    let cpu0 = tool.as_ref().map(|t| t.cpu_seconds()).transpose()?;
    let (host0, tight0, wall0) = (host_busy_s()?, tight.child.cpu_seconds()?, Instant::now());
    let until = t0 + (secs as f64 - 0.5) * 1e9;
    let deadline = Instant::now() + Duration::from_secs(secs + 30);
    let (mut seen, mut seconds) = (t0, Vec::new());
    let (i1, t1) = loop {
        let (i, t, rate) = tight.counters()?;
        if t > seen {
            seconds.push(rate);
            seen = t;
            if t >= until {
                break (i, t);
            }
        }
        ensure!(Instant::now() < deadline, "tight.py stopped reporting");
        sleep(Duration::from_millis(50));
    };
    let cpu1 = tool.as_ref().map(|t| t.cpu_seconds()).transpose()?;
    let (host1, tight1) = (host_busy_s()?, tight.child.cpu_seconds()?);
    let tool_cpu_s = cpu0.zip(cpu1).map(|(a, b)| b - a);
    let others = (host1 - host0) - (tight1 - tight0) - tool_cpu_s.unwrap_or(0.0);
    let others = others.max(0.0) / wall0.elapsed().as_secs_f64();
    if let Some(t) = tool.as_mut() {
        t.stop(signal)?;
    }
    Ok(Run {
        rate: (i1 - i0) * 1e9 / (t1 - t0),
        second_median: common::median(seconds).unwrap_or(f64::NAN),
        tool_cpu_s,
        others,
    })
}

/// CPU seconds all CPUs spent busy since boot (`/proc/stat`: user, nice,
/// system, irq, softirq, steal).
fn host_busy_s() -> Result<f64> {
    let stat = fs::read_to_string("/proc/stat")?;
    let cpu = stat.lines().find_map(|l| l.strip_prefix("cpu "));
    let ticks: Vec<u64> = cpu
        .context("no cpu line in /proc/stat")?
        .split_whitespace()
        .map(|t| t.parse().unwrap_or(0))
        .collect();
    ensure!(ticks.len() >= 8, "short cpu line in /proc/stat");
    let busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6] + ticks[7];
    // SAFETY: sysconf has no preconditions.
    Ok(busy as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// CPUs the host keeps busy on average over `over`.
fn host_busy(over: Duration) -> Result<f64> {
    let (b0, t0) = (host_busy_s()?, Instant::now());
    sleep(over);
    Ok((host_busy_s()? - b0) / t0.elapsed().as_secs_f64())
}

/// The host's load before the overhead part: waited for, up to `max`,
/// until [`QUIET_CPUS`] or less over [`QUIET_OVER`].
struct Quiet {
    /// CPUs busy over the last look.
    busy: f64,
    waited: Duration,
    reached: bool,
}

/// A host is quiet when the rest of it keeps no more CPU than this busy.
const QUIET_CPUS: f64 = 0.25;
const QUIET_OVER: Duration = Duration::from_secs(5);

fn wait_quiet(max: Duration) -> Result<Quiet> {
    let start = Instant::now();
    loop {
        let busy = host_busy(QUIET_OVER)?;
        let reached = busy <= QUIET_CPUS;
        if reached || start.elapsed() >= max {
            eprintln!(
                "overhead: host {} ({busy:.2} CPUs busy) after {:.0} s",
                if reached { "quiet" } else { "still busy" },
                start.elapsed().as_secs_f64()
            );
            return Ok(Quiet {
                busy,
                waited: start.elapsed(),
                reached,
            });
        }
        eprintln!("overhead: host busy ({busy:.2} CPUs), waiting for it to quieten");
        sleep(Duration::from_secs(10));
    }
}

/// The first report tight.py writes after now (and at or after
/// `min_elapsed_ns` of its clock).
fn next_report(tight: &Tight, min_elapsed_ns: Option<f64>) -> Result<(f64, f64)> {
    let (_, now, _) = tight.counters()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (i, t, _) = tight.counters()?;
        if t > now && t >= min_elapsed_ns.unwrap_or(0.0) {
            return Ok((i, t));
        }
        ensure!(Instant::now() < deadline, "tight.py stopped reporting");
        sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------- BPF cost

/// What tight.py does beside the daemon in a BPF cost window.
#[derive(Clone, Copy, PartialEq)]
enum Scenario {
    /// Computes: each on-CPU sample of it walks its Python stack.
    OnCpu,
    /// Sleeps 1 ms at a time: each wakeup's off-CPU stack is walked.
    OffCpu,
}

const SCENARIOS: [Scenario; 2] = [Scenario::OnCpu, Scenario::OffCpu];

impl Scenario {
    fn tight_args(self) -> &'static [&'static str] {
        match self {
            Scenario::OnCpu => &[],
            Scenario::OffCpu => &["--block"],
        }
    }

    /// The daemon's options besides `--python`: off-CPU, every interval's
    /// stack (not 1 in 50 of 1 ms ones), so that each wakeup walks.
    fn daemon_args(self) -> &'static [&'static str] {
        match self {
            Scenario::OnCpu => &[],
            Scenario::OffCpu => &["--offcpu-sample-us", "0"],
        }
    }

    /// The program whose runs walk the workload's Python stack.
    fn program(self) -> &'static str {
        match self {
            Scenario::OnCpu => "on_cpu_sample",
            Scenario::OffCpu => "on_switched_in",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Scenario::OnCpu => "on-CPU (a, per sample)",
            Scenario::OffCpu => "off-CPU (b, per walk at switch-in)",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Scenario::OnCpu => "(a) on-CPU: `tight.py --depth 30`",
            Scenario::OffCpu => "(b) off-CPU: `tight.py --depth 30 --block`",
        }
    }
}

/// One daemon run of a cost window.
struct CostRun {
    python: bool,
    round: usize,
    /// Wall seconds between the two reads.
    secs: f64,
    /// Run count and run time (ns) per program name, over the window.
    progs: BTreeMap<String, (u64, u64)>,
    /// `python_stack_walks` over the window.
    walks: u64,
    /// tight.py's iterations per second.
    rate: f64,
    /// CPUs the host kept busy besides the daemon and tight.py.
    others: f64,
    /// The daemon's own timer of user stack walks since it started.
    walk_time: Option<WalkTime>,
}

/// The commonest depth of user stack walks (with unwind tables) in the
/// daemon's `wallscope_stack_walk_seconds`, and its median walk.
struct WalkTime {
    frames: String,
    walks: u64,
    /// The upper bound of the slot holding the median, ns.
    p50_ns: f64,
}

impl WalkTime {
    fn read(port: u16) -> Result<Option<WalkTime>> {
        let text = common::get(port, "/metrics")?;
        let label = |line: &str, name: &str| -> Option<String> {
            let start = line.find(&format!("{name}=\""))? + name.len() + 2;
            let len = line[start..].find('"')?;
            Some(line[start..start + len].to_string())
        };
        let value = |line: &str| line.rsplit_once(' ')?.1.parse::<f64>().ok();
        let rows = text.lines().filter(|l| l.contains("kind=\"user_tables\""));
        let mut counts = Vec::new();
        let mut p50 = BTreeMap::new();
        for line in rows {
            let Some(frames) = label(line, "frames") else {
                continue;
            };
            if line.starts_with("wallscope_stack_walk_seconds_count{") {
                counts.push((frames, value(line).unwrap_or(0.0) as u64));
            } else if label(line, "quantile").as_deref() == Some("0.5") {
                p50.insert(frames, value(line).unwrap_or(f64::NAN) * 1e9);
            }
        }
        let top = counts.into_iter().max_by_key(|(_, n)| *n);
        Ok(top.map(|(frames, walks)| WalkTime {
            p50_ns: p50.get(&frames).copied().unwrap_or(f64::NAN),
            frames,
            walks,
        }))
    }
}

impl CostRun {
    fn bpf_ns_per_s(&self) -> f64 {
        self.progs.values().map(|p| p.1).sum::<u64>() as f64 / self.secs
    }

    fn walks_per_s(&self) -> f64 {
        self.walks as f64 / self.secs
    }

    /// `name`'s ns per run and runs per second.
    fn prog(&self, name: &str) -> Option<(f64, f64)> {
        let (cnt, ns) = *self.progs.get(name)?;
        (cnt > 0).then(|| (ns as f64 / cnt as f64, cnt as f64 / self.secs))
    }

    /// `name`'s run time per second.
    fn prog_ns_per_s(&self, name: &str) -> f64 {
        self.progs.get(name).map_or(0.0, |p| p.1 as f64) / self.secs
    }
}

struct Cost {
    rounds: usize,
    seconds: u64,
    /// `kernel.bpf_stats_enabled` during, before and after the part.
    stats: String,
    python: String,
    /// Per scenario, every run in the order run.
    runs: Vec<(Scenario, Vec<CostRun>)>,
    /// Other Python processes running meanwhile: their walks count too.
    other_pythons: BTreeSet<String>,
}

/// The BPF cost part: each scenario's workload, the daemon with
/// `--python off` and `on` in turn beside it.
fn cost(daemon: &Path, python: &Path, tmp: &Path) -> Result<Cost> {
    find_tool("bpftool", "bpftool")?;
    let rounds = env_u64("WS_BENCH_COST_ROUNDS", 5)? as usize;
    let seconds = env_u64("WS_BENCH_COST_SECONDS", 10)?;
    let stats_before = common::bpf_stats_enabled()?;
    let stats = common::BpfStats::enable()?;
    let stats_during = common::bpf_stats_enabled()?;
    let mut all = Vec::new();
    let mut other_pythons = BTreeSet::new();
    for scenario in SCENARIOS {
        let tight = Tight::start(python, tmp, scenario.tight_args())?;
        let mut runs = Vec::new();
        for round in 1..=rounds {
            // Alternate which side goes first, so drift does not favour one.
            let order = if round % 2 == 1 {
                [false, true]
            } else {
                [true, false]
            };
            for on in order {
                other_pythons.extend(other_pythons_running(tight.pid));
                let r = cost_window(daemon, scenario, on, round, seconds, &tight, tmp)
                    .with_context(|| {
                        format!(
                            "{}, round {round}, --python {}",
                            scenario.describe(),
                            on_off(on)
                        )
                    })?;
                let prog = r.prog(scenario.program()).unwrap_or_default();
                eprintln!(
                    "cost {} round {round}/{rounds} --python {:<3}: BPF {:>10.0} ns/s, \
                     {:>6.1} Python walks/s, {} {:.0} ns x {:.0}/s, rest of host {:.2} CPUs",
                    scenario.program(),
                    on_off(on),
                    r.bpf_ns_per_s(),
                    r.walks_per_s(),
                    scenario.program(),
                    prog.0,
                    prog.1,
                    r.others
                );
                runs.push(r);
            }
        }
        drop(tight);
        all.push((scenario, runs));
    }
    drop(stats);
    Ok(Cost {
        rounds,
        seconds,
        stats: format!(
            "{stats_during} during the part; {stats_before} before it, {} after",
            common::bpf_stats_enabled()?
        ),
        python: python_version(python),
        runs: all,
        other_pythons,
    })
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// Python processes other than `pid`: the daemon walks their stacks too.
fn other_pythons_running(pid: u32) -> Vec<String> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    dir.flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_str()?.parse().ok()?;
            let exe = fs::read_link(e.path().join("exe")).ok()?;
            let name = exe.file_name()?.to_string_lossy().to_string();
            let comm = fs::read_to_string(e.path().join("comm")).ok()?;
            let comm = comm.trim();
            let python = name.starts_with("python") && !name.contains('-');
            (p != pid && p != me && python).then(|| {
                let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                format!("{comm} (pid {p}): `{}`", cmd.trim())
            })
        })
        .collect()
}

/// `/healthz` `events.python_stack_walks`, and the sum of all its
/// counters (which moves at every drain's stats).
fn walks_and_counters(port: u16) -> Result<(u64, u64)> {
    let h = healthz(port).context("/healthz stopped answering")?;
    let walks = h["events"]["python_stack_walks"].as_u64();
    let walks = walks.context("/healthz has no events.python_stack_walks: rebuild the daemon")?;
    let sum = |v: &Value| {
        v.as_object()
            .map_or(0, |o| o.values().filter_map(Value::as_u64).sum::<u64>())
    };
    let all = sum(&h["events"]) + sum(&h["lost"]) + h["samples"].as_u64().unwrap_or(0);
    Ok((walks, all))
}

/// Name, run count and run time (ns) of BPF programs, by id.
type ProgStats = BTreeMap<u64, (String, u64, u64)>;

/// Waits for the daemon's counters to move (a drain's stats reached its
/// store), then reads the programs' stats at once: the walks and the run
/// times then cover the same seconds, to within a drain's symbolization.
fn at_drain(port: u16, ids: &BTreeSet<u64>) -> Result<(u64, ProgStats, Instant)> {
    let (_, before) = walks_and_counters(port)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (walks, now) = walks_and_counters(port)?;
        if now != before {
            return Ok((walks, common::prog_stats(ids)?, Instant::now()));
        }
        ensure!(Instant::now() < deadline, "no drain in 10 s");
        sleep(Duration::from_millis(20));
    }
}

fn cost_window(
    daemon: &Path,
    scenario: Scenario,
    on: bool,
    round: usize,
    secs: u64,
    tight: &Tight,
    tmp: &Path,
) -> Result<CostRun> {
    ensure!(
        Path::new(&format!("/proc/{}", tight.pid)).exists(),
        "tight.py is gone"
    );
    let log = tmp.join("cost.log");
    let mut args = vec!["--python", on_off(on)];
    args.extend(scenario.daemon_args());
    let (mut d, port) = serve(daemon, &log, &args)?;
    let log_text = || fs::read_to_string(&log).unwrap_or_default();
    if on {
        // The daemon registers the interpreter at its first drains: its
        // walks have begun once the counter moves.
        let deadline = Instant::now() + Duration::from_secs(30);
        while walks_and_counters(port)?.0 == 0 {
            ensure!(
                Instant::now() < deadline,
                "no Python stack walked in 30 s; log:\n{}",
                log_text()
            );
            sleep(Duration::from_millis(200));
        }
    }
    sleep(SETTLE);
    let ids = common::linked_progs(d.0.id());
    ensure!(!ids.is_empty(), "no BPF programs linked by the daemon");
    let (walks0, progs0, t0) = at_drain(port, &ids)?;
    let (host0, daemon0, tight0) = (host_busy_s()?, d.cpu_seconds()?, tight.child.cpu_seconds()?);
    let (i0, e0, _) = tight.counters()?;
    sleep(Duration::from_secs(secs).saturating_sub(Duration::from_millis(500)));
    let (walks1, progs1, t1) = at_drain(port, &ids)?;
    let (host1, daemon1, tight1) = (host_busy_s()?, d.cpu_seconds()?, tight.child.cpu_seconds()?);
    let (i1, e1, _) = tight.counters()?;
    if let Some(status) = d.0.try_wait()? {
        bail!("wallscope exited with {status}; log:\n{}", log_text());
    }
    let walk_time = WalkTime::read(port)?;
    d.stop(libc::SIGTERM)?;
    let mut progs = BTreeMap::new();
    for (id, (name, cnt, ns)) in progs1 {
        let (cnt0, ns0) = progs0.get(&id).map_or((0, 0), |b| (b.1, b.2));
        let sum: &mut (u64, u64) = progs.entry(name).or_default();
        sum.0 += cnt.saturating_sub(cnt0);
        sum.1 += ns.saturating_sub(ns0);
    }
    let secs = (t1 - t0).as_secs_f64();
    let others = (host1 - host0) - (daemon1 - daemon0) - (tight1 - tight0);
    Ok(CostRun {
        python: on,
        round,
        secs,
        progs,
        walks: walks1.saturating_sub(walks0),
        rate: if e1 > e0 {
            (i1 - i0) * 1e9 / (e1 - e0)
        } else {
            f64::NAN
        },
        others: others.max(0.0) / secs,
        walk_time,
    })
}

fn render_cost(c: &Cost) -> Result<String> {
    let mut s = format!(
        "## BPF cost of Python frames\n\nWhat walking Python frames adds to the \
         daemon's BPF programs. `kernel.bpf_stats_enabled`: {stats}; \
         tight.py under {py}; the release daemon at {HZ} Hz, run with `--python off` \
         and with `--python on` in turn ({rounds} rounds, the first side alternating), \
         each run measured over {secs} s once the interpreter is registered. BPF ns/s: \
         the run time of all the programs the daemon linked (`bpftool prog show`), \
         host-wide. Python walks/s: `/healthz` `events.python_stack_walks` (every \
         Python thread on the host). Added per walk: (BPF ns/s on - off) / (walks/s \
         on), of the medians, and per round (paired, min / max). Per program: its \
         `run_time_ns / run_cnt` (every run, most of which walk no Python stack) and \
         its own added ns/s per walk. With `--python on` a Python process's native \
         walks are not reused either (its registers say nothing of its Python stack), \
         so the added cost includes the reuse lost. User stack walk: the daemon's own \
         timer of its user stack walks (`/metrics` `wallscope_stack_walk_seconds`, \
         `kind=\"user_tables\"`, since it started): the upper bound of the slot (19 % \
         wide) holding the median walk of the commonest depth, native and Python \
         frames together, a cross-check of the walk's own cost. {measured}",
        stats = c.stats,
        py = c.python,
        rounds = c.rounds,
        secs = c.seconds,
        measured = measured()?,
    );
    let med = |runs: &[&CostRun], f: &dyn Fn(&CostRun) -> f64| {
        common::median(runs.iter().map(|r| f(r))).unwrap_or(f64::NAN)
    };
    let spread = |runs: &[&CostRun], f: &dyn Fn(&CostRun) -> f64| {
        let m = med(runs, f);
        if m == 0.0 || !m.is_finite() {
            return "-".to_string();
        }
        let (lo, hi) = common::spread(runs.iter().map(|r| f(r)), m);
        format!("{lo:+.0} / {hi:+.0} %")
    };
    let mut summary = Vec::new();
    for (scenario, runs) in &c.runs {
        let program = scenario.program();
        let side = |on: bool| runs.iter().filter(|r| r.python == on).collect::<Vec<_>>();
        let (off, on) = (side(false), side(true));
        let bpf = |r: &CostRun| r.bpf_ns_per_s();
        let walks = |r: &CostRun| r.walks_per_s();
        let prog_ns = |r: &CostRun| r.prog(program).map_or(f64::NAN, |p| p.0);
        let prog_rate = |r: &CostRun| r.prog(program).map_or(f64::NAN, |p| p.1);
        let prog_total = |r: &CostRun| r.prog_ns_per_s(program);
        let walks_on = med(&on, &walks);
        let added = (med(&on, &bpf) - med(&off, &bpf)) / walks_on;
        let added_prog = (med(&on, &prog_total) - med(&off, &prog_total)) / walks_on;
        // Per round: that round's on and off runs.
        let paired: Vec<f64> = (1..=c.rounds)
            .filter_map(|round| {
                let a = on.iter().find(|r| r.round == round)?;
                let b = off.iter().find(|r| r.round == round)?;
                Some((a.bpf_ns_per_s() - b.bpf_ns_per_s()) / a.walks_per_s())
            })
            .collect();
        let (plo, phi) = paired
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
                (lo.min(*p), hi.max(*p))
            });
        let mut rows = Vec::new();
        for (label, runs) in [("--python off", &off), ("--python on", &on)] {
            rows.push(vec![
                label.to_string(),
                format!("{:.0} ({})", med(runs, &bpf), spread(runs, &bpf)),
                format!("{:.1} ({})", med(runs, &walks), spread(runs, &walks)),
                format!("{:.0} ({})", med(runs, &prog_ns), spread(runs, &prog_ns)),
                format!("{:.0}", med(runs, &prog_rate)),
                format!("{:.0}", med(runs, &prog_total)),
                format!("{:.0}", med(runs, &|r: &CostRun| r.rate)),
                format!("{:.2}", med(runs, &|r: &CostRun| r.others)),
            ]);
        }
        s += &format!(
            "### {}\n\nAdded per Python walk: **{added:.0} ns** (all programs; paired per \
             round: median {:.0}, min {plo:.0} / max {phi:.0}); `{program}` alone: \
             {added_prog:.0} ns.\n\n",
            scenario.describe(),
            common::median(paired.iter().copied()).unwrap_or(f64::NAN),
        );
        s += &common::table(
            &[
                "daemon",
                "BPF ns/s, all programs: median (min / max)",
                "Python walks/s",
                &format!("`{program}` ns/run"),
                &format!("`{program}` runs/s"),
                &format!("`{program}` ns/s"),
                "tight.py it/s",
                "rest of host, CPUs",
            ],
            &rows,
        );
        let walk = |side: &[&CostRun]| {
            let p50 = med(side, &|r: &CostRun| {
                r.walk_time.as_ref().map_or(f64::NAN, |w| w.p50_ns)
            });
            let frames = side.iter().find_map(|r| r.walk_time.as_ref());
            let frames = frames.map_or("?", |w| w.frames.as_str());
            format!("{:.1} µs ({frames} frames)", p50 / 1e3)
        };
        s += &format!(
            "\nUser stack walk, median over runs of the median walk: `--python off` {}, \
             `--python on` {}.\n",
            walk(&off),
            walk(&on)
        );
        if *scenario == Scenario::OnCpu {
            let (ns_on, ns_off) = (med(&on, &prog_total), med(&off, &prog_total));
            s += &format!(
                "\nSampling at {HZ} Hz takes `{program}` {ns_on:.0} ns/s with `--python on`, \
                 {:.3} % of a CPU, and {ns_off:.0} ns/s with `--python off`, {:.3} % (the \
                 host's every sample; with the host quiet, nearly all tight.py's): what \
                 the sampled thread loses to it, cache effects aside. Python frames add \
                 {added:.0} ns x {walks_on:.0} walks/s = {:.3} % of its CPU.\n",
                ns_on / 1e7,
                ns_off / 1e7,
                added * walks_on / 1e7,
            );
        }
        s += "\nEach run:\n\n";
        let rows: Vec<Vec<String>> = runs
            .iter()
            .map(|r| {
                let (ns, rate) = r.prog(program).unwrap_or((f64::NAN, f64::NAN));
                vec![
                    format!("{} --python {}", r.round, on_off(r.python)),
                    format!("{:.2}", r.secs),
                    format!("{:.0}", r.bpf_ns_per_s()),
                    format!("{:.1}", r.walks_per_s()),
                    format!("{ns:.0} x {rate:.0}/s"),
                    r.walk_time.as_ref().map_or("-".into(), |w| {
                        format!(
                            "{:.1} µs ({} frames, {} walks)",
                            w.p50_ns / 1e3,
                            w.frames,
                            w.walks
                        )
                    }),
                    format!("{:.2}", r.others),
                ]
            })
            .collect();
        s += &common::table(
            &[
                "round",
                "s",
                "BPF ns/s",
                "Python walks/s",
                &format!("`{program}`"),
                "user stack walk, median (commonest depth)",
                "rest of host, CPUs",
            ],
            &rows,
        );
        s += "\n";
        summary.push(format!(
            "{}: {added:.0} ns (`{program}` alone: {added_prog:.0} ns)",
            scenario.label()
        ));
    }
    s += &format!("Added per 30-deep Python walk: {}.\n\n", summary.join("; "));
    if !c.other_pythons.is_empty() {
        s += "Other Python processes ran meanwhile (their walks are in the counts, \
              their stacks shallower):\n\n";
        c.other_pythons
            .iter()
            .for_each(|p| s += &format!("- {p}\n"));
        s += "\n";
    }
    Ok(s)
}

// ---------------------------------------------------------------- report

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

fn render_accuracy(seconds: u64, accuracy: &[Accuracy]) -> Result<String> {
    let mut s = format!(
        "## Accuracy\n\n`tests/workloads/python/shares.py`, {seconds} s watched by both at once, \
         against the CPU time the workload measured itself per function over the same \
         window. Shares are of the main thread's samples (the other threads only \
         block; the share of samples a profiler put on them is listed). Inclusive \
         share: of those samples, the ones whose stack contains the function (truth: \
         its CPU time with its callees' over the main thread's). \
         Leaf share: those whose innermost Python frame it is (truth: its self time). \
         Functions match by the innermost part of the qualname. Targets: wallscope's \
         and py-spy's top-{TOP} by inclusive share share >= {MIN_OVERLAP}, each \
         differing by <= {MAX_DIFF} points (verdict); the same against the truth (last \
         column). {measured}",
        measured = measured()?
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
        let vs_truth = |p: &Profile| {
            let meets = p.has_frames()
                && overlap(p, &a.truth) >= MIN_OVERLAP
                && max_diff(p, &a.truth, &keys).is_some_and(|d| d <= MAX_DIFF);
            if meets {
                "meets"
            } else {
                "misses"
            }
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
            format!("{} / {}", vs_truth(&a.pyspy), vs_truth(&a.wallscope)),
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
            "vs truth: py-spy / wallscope",
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

    s += "\n";
    Ok(s)
}

/// Largest slowdown of the workload with wallscope (medians) that meets
/// the target, %.
const MAX_SLOWDOWN: f64 = 1.0;

fn render_overhead(o: &Overhead) -> Result<String> {
    let (rounds, overhead_s, runs) = (o.rounds, o.seconds, &o.runs);
    // Rounds none of whose windows had the rest of the host busy; the
    // figures are theirs when there are at least 5.
    let quiet_round = |k: usize| {
        runs.iter()
            .all(|r| r.get(k).is_some_and(|r| r.others <= QUIET_CPUS))
    };
    let quiet: Vec<usize> = (0..rounds).filter(|k| quiet_round(*k)).collect();
    let used: Vec<usize> = if quiet.len() >= 5 {
        quiet.clone()
    } else {
        (0..rounds).collect()
    };
    let q = &o.quiet;
    let mut s = format!(
        "## Overhead\n\n`tests/workloads/python/tight.py --depth 30` under {py} (one \
         process throughout), its own loop iterations/s over {overhead_s} s windows: alone, \
         with py-spy attached, with the wallscope daemon running (`--python on`: each \
         sample walks the 30 Python frames); {rounds} rounds, the first configuration \
         rotated each round. Per window, two rates: iterations over the window's time \
         (mean), and the median of its per-second rates (robust to this VM's dips: the \
         loop's speed drops by up to a third for a few seconds, profiler or not). \
         Slowdown: alone / with - 1, of the medians over rounds and (paired) the median \
         of each round's own; target with wallscope: < {MAX_SLOWDOWN} %. Profiler CPU: \
         the profiler process's user + system time over the window. Rest of host: the \
         CPUs that neither tight.py nor the profiler kept busy, from `/proc/stat`, \
         averaged over the window. Before the part the host was {state} \
         ({busy:.2} CPUs busy over {over} s, after waiting {waited:.0} s); rounds with \
         every window quiet (rest of host <= {QUIET_CPUS} CPUs): {nquiet} of {rounds}, \
         the figures below are of {which}. {measured}",
        py = o.python,
        state = if q.reached { "quiet" } else { "NOT quiet" },
        busy = q.busy,
        over = QUIET_OVER.as_secs(),
        waited = q.waited.as_secs_f64(),
        nquiet = quiet.len(),
        which = if used.len() == rounds {
            "all rounds".to_string()
        } else {
            format!("those {}", used.len())
        },
        measured = measured()?,
    );
    let pick = |c: usize, f: fn(&Run) -> f64| -> Vec<f64> {
        used.iter().filter_map(|k| runs[c].get(*k)).map(f).collect()
    };
    let mean = |r: &Run| r.rate;
    let second = |r: &Run| r.second_median;
    // Slowdown of configuration `c` by `f`: of the medians, and paired:
    // median, min and max of the rounds' own.
    let slowdown = |c: usize, f: fn(&Run) -> f64| -> (f64, f64, f64, f64) {
        let (base, with) = (pick(0, f), pick(c, f));
        let of_medians = common::median(base.iter().copied()).unwrap_or(f64::NAN)
            / common::median(with.iter().copied()).unwrap_or(f64::NAN);
        let per_round: Vec<f64> = base
            .iter()
            .zip(&with)
            .map(|(b, x)| (b / x - 1.0) * 100.0)
            .collect();
        let (lo, hi) = per_round
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
                (lo.min(*p), hi.max(*p))
            });
        let paired = common::median(per_round.iter().copied()).unwrap_or(f64::NAN);
        ((of_medians - 1.0) * 100.0, paired, lo, hi)
    };
    let mut rows = Vec::new();
    for (i, c) in CONFIGS.iter().enumerate() {
        let m = common::median(pick(i, mean)).unwrap_or(f64::NAN);
        let (lo, hi) = common::spread(pick(i, mean), m);
        let cpu = common::median(
            used.iter()
                .filter_map(|k| runs[i].get(*k))
                .filter_map(|r| r.tool_cpu_s),
        );
        let others = pick(i, |r| r.others);
        let max_others = others.iter().copied().fold(0.0, f64::max);
        let others = common::median(others).unwrap_or(f64::NAN);
        let dash = || "-".to_string();
        let slow = |f: fn(&Run) -> f64| {
            if i == 0 {
                return [dash(), dash()];
            }
            let (m, p, lo, hi) = slowdown(i, f);
            [
                format!("{m:+.2} %"),
                format!("{p:+.2} % ({lo:+.2} / {hi:+.2})"),
            ]
        };
        let [mean_m, mean_p] = slow(mean);
        let [sec_m, sec_p] = slow(second);
        rows.push(vec![
            c.to_string(),
            format!("{m:.0}"),
            format!("{lo:+.2} % / {hi:+.2} %"),
            mean_m,
            mean_p,
            sec_m,
            sec_p,
            cpu.map_or_else(dash, |c| format!("{c:.2}")),
            format!("{others:.2} (max {max_others:.2})"),
        ]);
    }
    s += &common::table(
        &[
            "configuration",
            "it/s (mean): median",
            "min / max vs median",
            "slowdown, means: of medians",
            "paired: median (min / max)",
            "slowdown, per-second medians: of medians",
            "paired: median (min / max)",
            "profiler CPU s/window",
            "rest of host, CPUs: median (max)",
        ],
        &rows,
    );
    for (i, c) in CONFIGS.iter().enumerate().skip(1) {
        let (m, p, _, _) = slowdown(i, mean);
        let (sm, sp, _, _) = slowdown(i, second);
        let verdict = if *c == Config::Wallscope {
            let all = [m, p, sm, sp];
            format!(
                " (target < {MAX_SLOWDOWN} %: {})",
                if all.iter().all(|v| *v < MAX_SLOWDOWN) {
                    "meets"
                } else if all.iter().all(|v| *v >= MAX_SLOWDOWN) {
                    "MISSES"
                } else {
                    "neither shown nor refuted: the estimates disagree"
                }
            )
        } else {
            String::new()
        };
        s += &format!(
            "\nWith {c}: {m:+.2} % / {p:+.2} % (means: of medians / paired), \
             {sm:+.2} % / {sp:+.2} % (per-second medians){verdict}.\n"
        );
    }
    s += "\nPer round (it/s; the slowdowns against that round's `alone`; the \
          busiest window's rest of host):\n\n";
    let mut rows = Vec::new();
    for round in 0..rounds {
        let order: Vec<String> = (0..CONFIGS.len())
            .map(|i| short(CONFIGS[(i + round) % CONFIGS.len()]).to_string())
            .collect();
        let mut row = vec![format!("{}", round + 1), order.join(", ")];
        let rates: Vec<Option<f64>> = runs.iter().map(|r| r.get(round).map(|r| r.rate)).collect();
        for r in &rates {
            row.push(r.map_or_else(|| "-".into(), |r| format!("{r:.0}")));
        }
        for r in &rates[1..] {
            let slow = rates[0].zip(*r).map(|(b, x)| (b / x - 1.0) * 100.0);
            row.push(slow.map_or_else(|| "-".into(), |p| format!("{p:+.2} %")));
        }
        let busiest = runs.iter().filter_map(|r| r.get(round)).map(|r| r.others);
        let busiest = busiest.fold(0.0, f64::max);
        row.push(format!(
            "{busiest:.2}{}",
            if used.contains(&round) {
                ""
            } else {
                " (left out)"
            }
        ));
        rows.push(row);
    }
    let mut header = vec!["round".to_string(), "order".to_string()];
    header.extend(CONFIGS.iter().map(|c| short(*c).to_string()));
    header.extend(
        CONFIGS[1..]
            .iter()
            .map(|c| format!("slowdown {}", short(*c))),
    );
    header.push("rest of host, CPUs".into());
    s += &common::table(&header, &rows);
    if !o.foreign.is_empty() {
        s += "\nNot alone: profilers this bench did not start ran during the `alone` \
              windows (and so during all of them):\n\n";
        o.foreign.iter().for_each(|f| s += &format!("- {f}\n"));
    }
    let alone = pick(0, mean);
    let m = common::median(alone.iter().copied()).unwrap_or(f64::NAN);
    let (lo, hi) = common::spread(alone, m);
    s += &format!(
        "\nNoise: the `alone` windows alone span {lo:+.1} % to {hi:+.1} % around their \
         median. On this VM the loop's speed swings by 10-20 % over seconds while its \
         CPU time stays at 1.00 s/s and no steal time shows (the physical host's other \
         tenants, presumably): timing cannot resolve 1 %. The measured direct cost is in \
         the BPF cost section: the sampling program's run time per second on the \
         sampled CPU.\n"
    );
    s += "\nWith more than one CPU the single-threaded workload leaves the profilers \
          a CPU of their own: the overhead is what sampling costs the workload's \
          thread (py-spy's reads of its memory, wallscope's in-kernel walk); the \
          profiler's own CPU is listed apart.\n\n";
    Ok(s)
}
