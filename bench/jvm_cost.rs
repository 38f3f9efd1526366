//! Cost of Java frames, issue #12: "the BPF walk cost per event and
//! symbolization time per drain on a JVM with 10,000 compiled methods,
//! before and after". One JVM (`jvm_cost/workload.rs`: a generated class
//! whose 10,000 methods four threads keep calling) is started and left to
//! compile every method; then the release daemon watches it with
//! `--jvm-frames perf-map` ("before": one frame per compiled blob from the
//! perf map, `Interpreter` for interpreted code) and `--jvm-frames full`
//! ("after": frames from HotSpot's own structures), one daemon after the
//! other, alternating the order each round. A daemon without the option
//! (before issue #12 is merged) runs the "before" side only, and the report
//! says so.
//!
//! Each daemon run, once it names the JVM's compiled code and a few seconds
//! more, is measured over `WS_BENCH_SECONDS` (default 30): (a) each BPF
//! program's `run_time_ns / run_cnt` with `kernel.bpf_stats_enabled=1`
//! (restored after): ns per on-CPU sample and per off-CPU event; (b) the
//! daemon's `/healthz` `pipeline.symbolize_us_total` and
//! `symbolized_batches`: the mean symbolization time per drain, with the
//! p50 and max of `last_symbolize_us` read every second. Prints the report
//! and writes `bench/results/jvm_cost.md` (`jvm_cost/report.rs`).
//!
//! Needs root, a JDK 17 (java, javac, jcmd) and bpftool
//! (`scripts/deps.sh bench`). Env: `WS_BENCH_SECONDS`, `WS_BENCH_ROUNDS`
//! (default 2: each side measured twice).

#[path = "common/mod.rs"]
mod common;

// The jvm bench's folded-profile reader, of which this bench uses a part.
#[allow(dead_code)]
#[path = "jvm/profile.rs"]
mod profile;
#[path = "jvm_cost/report.rs"]
mod report;
#[path = "jvm_cost/workload.rs"]
mod workload;

use anyhow::{bail, ensure, Context, Result};
use common::java::{has_jvm_frames, Workload};
use common::{find_tool, free_port, healthz};
use profile::{parse, Profile, Tool, UNNAMED};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};
use workload::CodeList;

/// Drains the daemon completes before anything else (its first drains
/// symbolize every binary on the host once).
const WARM_DRAINS: u64 = 3;
/// Longest the daemon may take to name the JVM's compiled code (attach,
/// perf map written and read).
const NAMED_TIMEOUT: Duration = Duration::from_secs(60);
/// Time the daemon gets after that before the window starts.
const SETTLE: Duration = Duration::from_secs(5);
/// Longest the JIT may take to compile the workload's methods.
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(300);
/// Share of the methods with C2 code the window waits for: past it the JIT
/// is mostly done and the code cache stays about the same.
pub const C2_SHARE: f64 = 0.99;
/// The JVM flag wallscope's frame-pointer walk needs in JIT-ed code.
pub const JVM_FLAGS: [&str; 1] = ["-XX:+PreserveFramePointer"];

fn main() {
    common::main("jvm_cost", run);
}

/// How the daemon names Java frames (`--jvm-frames`).
#[derive(Clone, Copy, PartialEq)]
pub enum Frames {
    /// Before issue #12: the perf map only.
    PerfMap,
    /// After: HotSpot's own structures.
    Full,
}

impl Frames {
    /// The option's value.
    pub fn arg(self) -> &'static str {
        match self {
            Frames::PerfMap => "perf-map",
            Frames::Full => "full",
        }
    }

    /// Its side of the comparison.
    pub fn side(self) -> &'static str {
        match self {
            Frames::PerfMap => "before",
            Frames::Full => "after",
        }
    }
}

/// What the whole run was.
pub struct Setup {
    pub java: PathBuf,
    pub command: String,
    pub pid: u32,
    /// The daemon has `--jvm-frames`.
    pub has_option: bool,
    pub window_s: u64,
    pub rounds: usize,
    /// Code list when the JIT was done enough, and how long it took.
    pub compiled: CodeList,
    pub compile_s: f64,
    /// `kernel.bpf_stats_enabled` before the run / after it.
    pub stats: String,
}

/// One daemon run's measured window.
pub struct Window {
    pub frames: Frames,
    pub round: usize,
    pub secs: f64,
    /// Per BPF program: runs and run time (ns) in the window.
    pub progs: BTreeMap<String, (u64, u64)>,
    /// `/healthz` counter deltas by name (`pipeline.symbolize_us_total`...).
    pub counters: BTreeMap<&'static str, u64>,
    /// `last_symbolize_us` read every second, when a new batch was in.
    pub symbolize_us: Vec<u64>,
    /// The daemon's CPU seconds in the window.
    pub daemon_cpu_s: f64,
    /// Seconds from the daemon's start to its first named compiled frame.
    pub named_after_s: f64,
    /// The JVM's CPU profile over the window, as the daemon showed it.
    pub profile: Profile,
    pub code: CodeList,
}

/// `/healthz` counters read at both ends of a window.
pub const COUNTERS: [&str; 5] = [
    "pipeline.symbolize_us_total",
    "pipeline.symbolized_batches",
    "samples",
    "events.switches",
    "events.offcpu_stack_walks",
];

fn run() -> Result<()> {
    common::require_root("wallscope loads eBPF programs; bpftool reads their stats")?;
    let window_s = common::env_u64("WS_BENCH_SECONDS", 30)?;
    let rounds = common::env_u64("WS_BENCH_ROUNDS", 2)? as usize;
    let java = find_tool("java", "openjdk-17-jdk-headless")?;
    let javac = find_tool("javac", "openjdk-17-jdk-headless")?;
    let jcmd = find_tool("jcmd", "openjdk-17-jdk-headless")?;
    find_tool("bpftool", "bpftool")?;
    let daemon = common::daemon_binary()?;
    let has_option = has_jvm_frames(&daemon)?;
    let sides = if has_option {
        vec![Frames::PerfMap, Frames::Full]
    } else {
        eprintln!(
            "{}: no --jvm-frames (issue #12 not merged): measuring the perf-map side only",
            daemon.display()
        );
        vec![Frames::PerfMap]
    };

    let tmp = tempfile::tempdir()?;
    let src = tmp.path().join("Many.java");
    fs::write(&src, workload::source())?;
    eprintln!("compiling {} methods with javac", workload::METHODS);
    let classes = tmp.path().join("classes");
    common::check(Command::new(&javac).arg("-d").arg(&classes).arg(&src))?;

    let stats_before = common::bpf_stats_enabled()?;
    let stats = common::BpfStats::enable()?;
    // Long enough for every window; the JVM is stopped when done.
    let per_run = window_s + NAMED_TIMEOUT.as_secs() + 30;
    let life = COMPILE_TIMEOUT.as_secs() + (rounds * sides.len()) as u64 * per_run + 60;
    let mut cmd = Command::new(&java);
    cmd.args(JVM_FLAGS)
        .arg("-cp")
        .arg(&classes)
        .arg("Many")
        .arg(life.to_string());
    let command = format!("{cmd:?}").replace('"', "");
    let mut jvm = Workload::start(&mut cmd, &tmp.path().join("jvm.log"))?;
    let pid = jvm.pid;
    let (compiled, compile_s) = wait_compiled(&jcmd, &mut jvm)?;

    let mut windows = Vec::new();
    for round in 1..=rounds {
        // Alternate which side goes first, so drift (the JIT's last
        // compilations, the host's load) does not favour one.
        let mut order = sides.clone();
        if round % 2 == 0 {
            order.reverse();
        }
        for frames in order {
            let ctx = || format!("round {round}, --jvm-frames {}", frames.arg());
            let w = measure(
                &daemon, has_option, frames, round, window_s, &jcmd, &mut jvm,
            )
            .with_context(ctx)?;
            windows.push(w);
        }
    }
    jvm.jvm.stop(libc::SIGTERM)?;
    // The perf map the daemon had the JVM write; nothing reads it any more.
    let _ = fs::remove_file(format!("/tmp/perf-{pid}.map"));
    drop(stats);
    let setup = Setup {
        java,
        command: command.replace(&tmp.path().display().to_string(), "$TMP"),
        pid,
        has_option,
        window_s,
        rounds,
        compiled,
        compile_s,
        stats: format!("{stats_before} / {}", common::bpf_stats_enabled()?),
    };
    common::write_report("jvm_cost", &report::render(&setup, &windows)?)
}

/// Fails unless the JVM is still running.
fn alive(jvm: &mut Workload) -> Result<()> {
    ensure!(
        jvm.jvm.0.try_wait()?.is_none(),
        "the JVM exited early; stderr:\n{}",
        jvm.stderr()
    );
    Ok(())
}

/// Waits until every method has compiled code and nearly all have C2 code
/// (or [`COMPILE_TIMEOUT`] passed with every method compiled); the code
/// list then and the seconds it took.
fn wait_compiled(jcmd: &Path, jvm: &mut Workload) -> Result<(CodeList, f64)> {
    let start = Instant::now();
    loop {
        sleep(Duration::from_secs(5));
        alive(jvm)?;
        let list = CodeList::read(jcmd, jvm.pid)?;
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "{secs:.0} s: {} nmethods; {} of {} methods compiled, {} by C2",
            list.nmethods,
            list.compiled,
            workload::METHODS,
            list.c2
        );
        let all = list.compiled >= workload::METHODS;
        if all && list.c2 as f64 >= C2_SHARE * workload::METHODS as f64 {
            return Ok((list, secs));
        }
        if start.elapsed() >= COMPILE_TIMEOUT {
            ensure!(
                all,
                "only {} methods compiled after {COMPILE_TIMEOUT:?}",
                list.compiled
            );
            return Ok((list, secs));
        }
    }
}

/// One daemon run: started with `frames`, measured over `window_s` once it
/// names the JVM's compiled code, stopped.
fn measure(
    daemon: &Path,
    has_option: bool,
    frames: Frames,
    round: usize,
    window_s: u64,
    jcmd: &Path,
    jvm: &mut Workload,
) -> Result<Window> {
    let port = free_port()?;
    let log = std::env::temp_dir().join(format!("ws-jvm-cost-{}.log", std::process::id()));
    let mut cmd = Command::new(daemon);
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")]);
    if has_option {
        cmd.args(["--jvm-frames", frames.arg()]);
    }
    let started = Instant::now();
    let mut ws = common::spawn_logged(&mut cmd, &log)?;
    let log_text = || fs::read_to_string(&log).unwrap_or_default();
    common::wait_healthy(&mut ws, port).with_context(|| format!("log:\n{}", log_text()))?;
    common::wait_drains(port, WARM_DRAINS)?;
    wait_named(port, jvm.pid)?;
    let named_after_s = started.elapsed().as_secs_f64();
    eprintln!(
        "round {round}, {} ({}): JVM frames named after {named_after_s:.1} s; \
         measuring {window_s} s",
        frames.side(),
        frames.arg()
    );
    sleep(SETTLE);
    alive(jvm)?;

    let ids = common::linked_progs(ws.0.id());
    ensure!(!ids.is_empty(), "no BPF programs linked by the daemon");
    let progs_before = common::prog_stats(&ids)?;
    let health_before = healthz(port).context("/healthz stopped answering")?;
    let cpu_before = ws.cpu_seconds()?;
    let t0 = Instant::now();
    let mut symbolize_us = Vec::new();
    let mut batches = counter(&health_before, COUNTERS[1])?;
    while t0.elapsed() < Duration::from_secs(window_s) {
        sleep(Duration::from_secs(1));
        let h = healthz(port).context("/healthz stopped answering")?;
        let now = counter(&h, COUNTERS[1])?;
        // A new batch since the last look: its time, counted once.
        if now != batches {
            batches = now;
            symbolize_us.push(counter(&h, "pipeline.last_symbolize_us")?);
        }
    }
    let progs_after = common::prog_stats(&ids)?;
    let health_after = healthz(port).context("/healthz stopped answering")?;
    let daemon_cpu_s = ws.cpu_seconds()? - cpu_before;
    let secs = t0.elapsed().as_secs_f64();
    alive(jvm)?;
    if let Some(status) = ws.0.try_wait()? {
        bail!("wallscope exited with {status}; log:\n{}", log_text());
    }

    let mut progs = BTreeMap::new();
    for (id, (name, cnt, ns)) in progs_after {
        let (cnt0, ns0) = progs_before.get(&id).map_or((0, 0), |b| (b.1, b.2));
        let sum: &mut (u64, u64) = progs.entry(name).or_default();
        sum.0 += cnt.saturating_sub(cnt0);
        sum.1 += ns.saturating_sub(ns0);
    }
    let mut counters = BTreeMap::new();
    for name in COUNTERS {
        let delta = counter(&health_after, name)?.saturating_sub(counter(&health_before, name)?);
        counters.insert(name, delta);
    }
    // The slices reach the store a drain after their second: 1.5 s on,
    // the last `window_s` slices cover the window to within a second.
    sleep(Duration::from_millis(1500));
    let query = format!("/folded?pid={}&kind=cpu&seconds={window_s}", jvm.pid);
    let profile = parse(&common::get(port, &query)?, Tool::Wallscope);
    let code = CodeList::read(jcmd, jvm.pid)?;
    ws.stop(libc::SIGTERM)?;
    let _ = fs::remove_file(&log);
    Ok(Window {
        frames,
        round,
        secs,
        progs,
        counters,
        symbolize_us,
        daemon_cpu_s,
        named_after_s,
        profile,
        code,
    })
}

/// Waits until the daemon names some of the JVM `pid`'s samples by a Java
/// method (it has attached and read the JVM's perf map or code cache).
fn wait_named(port: u16, pid: u32) -> Result<()> {
    let deadline = Instant::now() + NAMED_TIMEOUT;
    let query = format!("/folded?pid={pid}&kind=cpu&seconds=2");
    loop {
        let profile = parse(&common::get(port, &query)?, Tool::Wallscope);
        let unnamed = profile.kinds.get(UNNAMED).copied().unwrap_or(0.0);
        if profile.java > unnamed {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "no named Java frame of pid {pid} after {NAMED_TIMEOUT:?}"
        );
        sleep(Duration::from_millis(500));
    }
}

/// The `/healthz` counter at `path` (`a.b`); an error names a daemon built
/// before the counter existed.
fn counter(health: &Value, path: &str) -> Result<u64> {
    let value = path.split('.').fold(health, |v, k| &v[k]);
    value.as_u64().with_context(|| {
        format!("/healthz has no {path}: rebuild the daemon (`cargo build --release`)")
    })
}
