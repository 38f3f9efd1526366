//! Java CPU profile accuracy: wallscope's `kind=cpu` against async-profiler's
//! cpu mode on one CPU-bound JVM run (`bench/workloads/Burn.java`, twelve
//! methods with known self-time shares, two threads) with the JIT's
//! defaults: C2 inlines the twelve methods into their caller, and both
//! profilers must still name them (async-profiler as `_[i]` frames from the
//! JIT's debug info; wallscope, issue #12, from HotSpot's own structures).
//! Both profilers watch the same run: async-profiler is loaded into the JVM
//! at startup, wallscope serves from outside (`--jvm-frames full` where the
//! daemon has the option) and makes the JVM write its perf map itself. The
//! first seconds (interpreter, JIT compilation, no perf map yet) are left
//! out on both sides.
//!
//! Self time of a Java method: the weight of the samples whose innermost
//! Java frame (compiled, C1, inlined or interpreted) is that method, as a
//! share of all the JVM's samples that have a Java frame. Acceptance (issue
//! #12): the two top-10s share at least 9 methods, and the shares of those
//! differ by at most 3 percentage points. A FAIL verdict is reported, not
//! an error; the bench fails only when the comparison cannot be made.
//! Since issue #27 the JVM runs without any flag (no frame pointers), and
//! both must also agree on how many samples reach the thread's entry
//! (`java.lang.Thread.run`) within 5 points.
//! Prints a table and writes `bench/results/jvm.md`.
//!
//! Needs root and a JDK (java, javac, jar). Downloads async-profiler from
//! Maven Central into `target/bench-tools/` once. Env: `WS_BENCH_SECONDS`
//! (default 20, rounded up to a multiple of 5): the steady-state window.
//!
//! This file runs the bench (`run`, `measure` and the constants of a run);
//! `jvm/async_profiler.rs` fetches async-profiler and reads its output,
//! `jvm/profile.rs` turns folded rows into Java self time, and
//! `jvm/report.rs` writes the report.

#[path = "common/mod.rs"]
mod common;

#[path = "jvm/async_profiler.rs"]
mod async_profiler;
#[path = "jvm/profile.rs"]
mod profile;
#[path = "jvm/report.rs"]
mod report;

use anyhow::{bail, ensure, Context, Result};
use async_profiler::{ap_profile, async_profiler};
use common::java::{has_jvm_frames, Workload};
use common::{check, env_u64, find_tool, free_port, healthz, Guard, ROOT};
use profile::{parse, Profile, Tool};
use report::{heaviest, render};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// async-profiler's sampling interval (CPU time per sample).
const AP_INTERVAL: &str = "10ms";
/// Left out at the start on both sides; also async-profiler's `loop`
/// period, so its first output file is exactly the warmup.
const WARMUP_S: u64 = 5;
/// The JVM runs this long past the steady window, so the window does not
/// catch its exit.
const TAIL_S: u64 = 5;
/// Drains the daemon completes before the JVM starts.
const WARM_DRAINS: u64 = 3;
/// Most the share of samples reaching the thread's entry may differ
/// between the tools (issue #27), in percentage points.
const MAX_ENTRY_DIFF_PP: f64 = 5.0;
/// Percent of a round each Burn method is designed to take.
const DESIGN: [(&str, f64); 12] = [
    ("Burn.alpha", 22.0),
    ("Burn.bravo", 17.0),
    ("Burn.charlie", 13.0),
    ("Burn.delta", 11.0),
    ("Burn.echo", 9.0),
    ("Burn.foxtrot", 7.0),
    ("Burn.golf", 6.0),
    ("Burn.hotel", 5.0),
    ("Burn.india", 4.0),
    ("Burn.juliet", 3.0),
    ("Burn.kilo", 2.0),
    ("Burn.lima", 1.0),
];
const TOP: usize = 10;
const MIN_OVERLAP: usize = 9;
const MAX_DIFF_PP: f64 = 3.0;

fn main() {
    common::main("jvm", run);
}

/// Fixed inputs of a run.
struct Setup {
    java: PathBuf,
    agent: PathBuf,
    classes: PathBuf,
    tmp: tempfile::TempDir,
    port: u16,
    steady_s: u64,
    daemon_log: PathBuf,
    /// The daemon has `--jvm-frames` and runs with `full`; without it, it
    /// names compiled code from the perf map only (before issue #12).
    full_frames: bool,
    /// The JVM's flags: none by default (the JIT's defaults, no frame
    /// pointers: issue #27); `WS_BENCH_JVM_FLAGS` (space-separated) to
    /// compare, e.g. `-XX:+PreserveFramePointer`.
    jvm_flags: Vec<String>,
}

/// What one JVM run measured.
struct Run {
    event: &'static str,
    pid: u32,
    command: String,
    query: String,
    ws: Profile,
    ap: Result<Profile, String>,
    ap_messages: Vec<String>,
    daemon_jvm_log: Vec<String>,
    lost: BTreeMap<String, u64>,
    /// CPU seconds the JVM used in the steady window (`/proc/PID/stat`).
    jvm_cpu_s: f64,
}

fn run() -> Result<()> {
    common::require_root("wallscope loads eBPF programs; async-profiler uses perf_events")?;
    let steady_s = env_u64("WS_BENCH_SECONDS", 20)?.div_ceil(WARMUP_S) * WARMUP_S;
    let java = find_tool("java", "openjdk-17-jdk-headless")?;
    let javac = find_tool("javac", "openjdk-17-jdk-headless")?;
    let agent = async_profiler()?;
    let agent_str = agent.to_str().context("non-UTF-8 path")?;
    ensure!(
        !agent_str.contains([',', '=']),
        "{agent_str}: async-profiler's agent options cannot carry ',' or '='"
    );
    let daemon = common::daemon_binary()?;
    let tmp = tempfile::tempdir()?;
    let classes = tmp.path().join("classes");
    let src = Path::new(ROOT).join("bench/workloads/Burn.java");
    check(Command::new(javac).arg("-d").arg(&classes).arg(src))?;

    let port = free_port()?;
    let daemon_log = tmp.path().join("daemon.log");
    let full_frames = has_jvm_frames(&daemon)?;
    let mut cmd = Command::new(&daemon);
    cmd.arg("serve")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"));
    if full_frames {
        cmd.args(["--jvm-frames", "full"]);
    } else {
        eprintln!(
            "{}: no --jvm-frames (before issue #12): perf-map frames only",
            daemon.display()
        );
    }
    let mut wallscope = common::spawn_logged(&mut cmd, &daemon_log)?;
    let log = || fs::read_to_string(&daemon_log).unwrap_or_default();
    common::wait_healthy(&mut wallscope, port).with_context(|| format!("log:\n{}", log()))?;
    common::wait_drains(port, WARM_DRAINS)?;
    let setup = Setup {
        java,
        agent,
        classes,
        tmp,
        port,
        steady_s,
        daemon_log: daemon_log.clone(),
        full_frames,
        jvm_flags: std::env::var("WS_BENCH_JVM_FLAGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect(),
    };

    // `cpu` is perf_events' cpu-clock here (no hardware PMU); if
    // async-profiler cannot use it, `itimer` (setitimer signals) instead.
    let mut failed = Vec::new();
    for event in ["cpu", "itimer"] {
        let run = measure(&setup, event).with_context(|| format!("run with event={event}"))?;
        if let Some(status) = wallscope.0.try_wait()? {
            bail!("wallscope exited with {status}; log:\n{}", log());
        }
        ensure!(
            run.ws.java > 0.0,
            "wallscope has no Java frame for JVM pid {} ({} rows, none named `*_[j]`, \
             `*_[i]`, `*_[0]`, `*_[1]` or `Interpreter`): is the perf map written? Rows:\n{}",
            run.pid,
            run.ws.rows,
            heaviest(&run.ws.no_java, 10)
        );
        match &run.ap {
            Ok(_) => {
                wallscope.stop(libc::SIGTERM)?;
                return common::write_report("jvm", &render(&setup, &run, &failed)?);
            }
            Err(e) => {
                eprintln!("async-profiler failed with event={event}: {e}");
                failed.push(format!("event={event}: {e}"));
            }
        }
    }
    bail!(
        "async-profiler produced no usable profile:\n{}",
        failed.join("\n")
    )
}

/// One JVM run with async-profiler's `event`, wallscope watching.
fn measure(setup: &Setup, event: &'static str) -> Result<Run> {
    let out_dir = setup.tmp.path().join(format!("ap-{event}"));
    fs::create_dir_all(&out_dir)?;
    // `loop` dumps (and restarts) every WARMUP_S seconds, each period into
    // its own file (`%n`): file 0 is the warmup, files 1..=N the steady window.
    let agent = format!(
        "-agentpath:{}=start,event={event},interval={AP_INTERVAL},loop={WARMUP_S}s,\
         collapsed,ann,file={}/ap-%n{{1000}}.collapsed",
        setup.agent.display(),
        out_dir.display()
    );
    let duration = WARMUP_S + setup.steady_s + TAIL_S;
    let mut cmd = Command::new(&setup.java);
    cmd.args(&setup.jvm_flags)
        .arg(&agent)
        .arg("-cp")
        .arg(&setup.classes);
    cmd.arg("Burn").arg(duration.to_string());
    let command = format!("{cmd:?}").replace('"', "");
    let jvm_log = setup.tmp.path().join(format!("jvm-{event}.log"));
    let lost_before = lost(setup.port)?;
    let start = Instant::now();
    let Workload {
        mut jvm,
        pid,
        lines,
        mut messages,
        ..
    } = Workload::start(&mut cmd, &jvm_log)?;
    eprintln!(
        "JVM pid {pid} (event={event}): {WARMUP_S} s warmup, {} s steady, {TAIL_S} s tail",
        setup.steady_s
    );
    // The JVM's own CPU time over the steady window, for scale.
    let until = |s: Duration| sleep((start + s).saturating_duration_since(Instant::now()));
    let alive = |jvm: &mut Guard| -> Result<()> {
        ensure!(
            jvm.0.try_wait()?.is_none(),
            "the JVM exited early; stderr:\n{}",
            fs::read_to_string(&jvm_log).unwrap_or_default()
        );
        Ok(())
    };
    until(Duration::from_secs(WARMUP_S));
    alive(&mut jvm)?;
    let cpu_before = jvm.cpu_seconds()?;
    until(Duration::from_secs(WARMUP_S + setup.steady_s));
    alive(&mut jvm)?;
    let jvm_cpu_s = jvm.cpu_seconds()? - cpu_before;
    // The daemon's slices are one drain (1 s) long and reach the query
    // only after that drain: 1.5 s after the steady window's end, the last
    // `steady_s` slices cover it to within a second.
    until(Duration::from_secs(WARMUP_S + setup.steady_s) + Duration::from_millis(1500));
    alive(&mut jvm)?;
    let query = format!("/folded?pid={pid}&kind=cpu&seconds={}", setup.steady_s);
    let folded = common::get(setup.port, &query)?;
    let ws = parse(&folded, Tool::Wallscope);

    let deadline = Instant::now() + Duration::from_secs(TAIL_S + 60);
    let status = loop {
        if let Some(status) = jvm.0.try_wait()? {
            break status;
        }
        ensure!(Instant::now() < deadline, "the JVM did not exit");
        sleep(Duration::from_millis(100));
    };
    // The perf map wallscope had the JVM write; nothing reads it any more.
    let _ = fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let stderr = fs::read_to_string(&jvm_log).unwrap_or_default();
    ensure!(
        status.success(),
        "the JVM failed ({status}); stderr:\n{stderr}"
    );
    messages.extend(lines.try_iter());
    messages.extend(stderr.lines().map(str::to_string));
    // async-profiler reports problems as `[WARN] ...` / `[ERROR] ...` on
    // the JVM's stdout; the workload prints `done CHECKSUM`.
    messages.retain(|m| !m.starts_with("done "));
    let ap = ap_profile(&out_dir, setup.steady_s, &messages);

    let lost_after = lost(setup.port)?;
    let lost = lost_after
        .into_iter()
        .map(|(k, v)| (k.clone(), v - lost_before.get(&k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    let daemon_log = fs::read_to_string(&setup.daemon_log).unwrap_or_default();
    let needle = format!("pid={pid}");
    let daemon_jvm_log = daemon_log
        .lines()
        .map(strip_ansi)
        .filter(|l| l.contains(&needle))
        .collect();
    Ok(Run {
        event,
        pid,
        command,
        query,
        ws,
        ap,
        ap_messages: messages,
        daemon_jvm_log,
        lost,
        jvm_cpu_s,
    })
}

/// wallscope's loss counters from `/healthz`, by reason.
fn lost(port: u16) -> Result<BTreeMap<String, u64>> {
    let health = healthz(port).context("/healthz stopped answering")?;
    let lost = health["lost"].as_object().context("/healthz has no lost")?;
    let lost = lost
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)));
    Ok(lost.collect())
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            out.push(c);
        }
    }
    out
}
