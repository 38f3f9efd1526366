//! Table-driven user stack unwinding (issue #5), before and after: `wallscope
//! serve --unwind fp` (frame pointers only, the kernel's `bpf_get_stack`)
//! against `--unwind tables` (unwind tables from `.eh_frame` where a file
//! has no frame pointers, as Debian's glibc).
//!
//! 1. Cost: `perf bench sched pipe` (a glibc program, so with tables its
//!    stacks are walked by the table path) with no daemon, with `fp` and
//!    with `tables`, round-robin over `WS_BENCH_ROUNDS` rounds, a fresh
//!    daemon per run; then one more run per mode with
//!    `kernel.bpf_stats_enabled=1` for each BPF program's run time per
//!    event and the total per context switch.
//! 2. Depth: a parked ForkJoinPool JVM (`tests/workloads/java/Churn.java`)
//!    under each mode: the stack depth distribution of its futex time (and
//!    CPU samples) from `/folded`, and how much reaches a Java frame and
//!    `start_thread`.
//!
//! Other BPF programs (another daemon, a test run) slow every context
//! switch: each run first waits up to `WS_BENCH_QUIET_S` (default 60) for
//! none to be loaded, and runs that still saw some are counted.
//!
//! Prints the tables and writes `bench/results/unwind.md`. Needs root,
//! linux-perf, bpftool and a JDK 17. Env: `WS_BENCH_ROUNDS` (default 5).
//!
//! This file runs the bench; `unwind/report.rs` holds the folded rows'
//! depth statistics and writes the report.

#[path = "common/mod.rs"]
mod common;
#[path = "unwind/report.rs"]
mod report;

use anyhow::{bail, ensure, Context, Result};
use common::{Guard, ROOT};
use report::{parse, render_cost, render_jvm, walks, Folded};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The context-switch workload, ~8 s on a quiet host; pinned to one CPU
/// because unpinned its time is bimodal (see `bench/offcpu.rs`).
const PIPE: &str = "taskset -c 0 perf bench sched pipe -l 2000000";
/// Programs the bench runs, with their Debian packages.
const NEEDED: [(&str, &str); 5] = [
    ("perf", "linux-perf"),
    ("taskset", "util-linux"),
    ("bpftool", "bpftool"),
    ("java", "openjdk-17-jdk-headless"),
    ("javac", "openjdk-17-jdk-headless"),
];
/// Configurations of the timed rounds; `None` runs no daemon.
const MODES: [(&str, Option<&str>); 3] = [
    ("baseline", None),
    ("fp (before)", Some("fp")),
    ("tables (after)", Some("tables")),
];
/// Drains before measuring: the first ones load the unwind tables and
/// symbolize every binary, a start-up cost.
const WARM_DRAINS: u64 = 3;
const SETTLE: Duration = Duration::from_secs(1);
/// Start of the BPF stats window into a run.
const STEADY_AFTER: Duration = Duration::from_secs(3);
/// The JVM, `Churn SECONDS WORKERS`, is queried WAIT_S after it is ready,
/// for its last WINDOW_S seconds.
const JVM_ARGS: [&str; 2] = ["25", "4"];
const WAIT_S: u64 = 15;
const WINDOW_S: u64 = 10;

/// `events.unwind_walks` and `lost.unwind_*`, by name.
type Counters = BTreeMap<String, u64>;
/// BPF run count and run time (ns) by program name.
type Progs = BTreeMap<String, (u64, u64)>;

/// A running daemon, its port and whether it walks with tables.
struct Daemon {
    guard: Guard,
    port: u16,
    tables: bool,
}

impl Daemon {
    /// Starts `wallscope serve --unwind MODE` and waits until it is warm.
    fn start(bin: &Path, mode: &str, log: &Path) -> Result<Self> {
        let port = common::free_port()?;
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--unwind", mode, "--listen"])
            .arg(format!("127.0.0.1:{port}"));
        let mut guard = common::spawn_logged(&mut cmd, log)?;
        let log = || fs::read_to_string(log).unwrap_or_default();
        common::wait_healthy(&mut guard, port).with_context(|| format!("log:\n{}", log()))?;
        common::wait_drains(port, WARM_DRAINS)?;
        sleep(SETTLE);
        let tables = mode == "tables";
        Ok(Daemon {
            guard,
            port,
            tables,
        })
    }

    /// `/healthz`, retried for 10 s: a busy daemon (building tables on a
    /// loaded host) can miss the 2 s timeout.
    fn healthz(&self) -> Result<serde_json::Value> {
        for _ in 0..20 {
            if let Some(h) = common::healthz(self.port) {
                return Ok(h);
            }
            sleep(Duration::from_millis(500));
        }
        bail!("/healthz stopped answering")
    }

    /// `events.unwind_walks` and the `lost.unwind_*` counters.
    fn unwind_counters(&self) -> Result<Counters> {
        let h = self.healthz()?;
        let mut out = Counters::new();
        for section in ["events", "lost"] {
            let map = h[section].as_object().context("bad /healthz")?;
            for (k, v) in map.iter().filter(|(k, _)| k.starts_with("unwind_")) {
                out.insert(k.clone(), v.as_u64().unwrap_or(0));
            }
        }
        Ok(out)
    }

    fn stop(mut self) -> Result<()> {
        if let Some(status) = self.guard.0.try_wait()? {
            bail!("the daemon exited with {status} during the run");
        }
        self.guard.stop(libc::SIGINT)
    }
}

/// `after - before` per counter, added to `sum`.
fn add_delta(sum: &mut Counters, before: &Counters, after: Counters) {
    for (k, v) in after {
        *sum.entry(k.clone()).or_default() +=
            v.saturating_sub(before.get(&k).copied().unwrap_or(0));
    }
}

/// One workload run: seconds, context switches (all CPUs), the daemon's
/// unwind counters' growth, and whether other BPF programs were loaded.
struct Run {
    secs: f64,
    switches: u64,
    unwind: Counters,
    disturbed: bool,
}

/// One JVM run: futex rows (process and thread grouping), cpu rows, the
/// unwind counters' growth and `pipeline.unwind` at the end.
struct Jvm {
    futex: Folded,
    threads: Folded,
    cpu: Folded,
    unwind: Counters,
    tables: serde_json::Value,
}

fn main() {
    common::main("unwind", run);
}

fn run() -> Result<()> {
    common::require_root("wallscope loads eBPF programs")?;
    let rounds = common::env_u64("WS_BENCH_ROUNDS", 5)? as usize;
    let quiet = Duration::from_secs(common::env_u64("WS_BENCH_QUIET_S", 60)?);
    for (program, package) in NEEDED {
        common::find_tool(program, package)?;
    }
    let bin = common::daemon_binary()?;
    let tmp = tempfile::tempdir()?;
    let log = tmp.path().join("daemon.log");
    let load_start = fs::read_to_string("/proc/loadavg")?.trim().to_string();

    let mut runs: Vec<Vec<Run>> = MODES.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds {
        for i in (0..MODES.len()).map(|i| (i + round - 1) % MODES.len()) {
            let (name, mode) = MODES[i];
            let ctx = || format!("round {round}, {name}");
            wait_quiet(quiet)?;
            let daemon = mode.map(|m| Daemon::start(&bin, m, &log));
            let daemon = daemon.transpose().with_context(ctx)?;
            let (r, _) = measure(daemon.as_ref(), false).with_context(ctx)?;
            daemon.map(Daemon::stop).transpose().with_context(ctx)?;
            let walks = walks(&r.unwind);
            let note = ["", ", other BPF loaded"][r.disturbed as usize];
            eprintln!(
                "round {round}/{rounds} {name:<15} {:.3} s, {walks} walks{note}",
                r.secs
            );
            runs[i].push(r);
        }
    }

    let stats_at_start = common::bpf_stats_enabled()?;
    let mut costs = Vec::new();
    {
        let _stats = common::BpfStats::enable()?;
        for mode in ["fp", "tables"] {
            wait_quiet(quiet)?;
            let daemon = Daemon::start(&bin, mode, &log)?;
            let cost =
                measure(Some(&daemon), true).with_context(|| format!("BPF stats, {mode}"))?;
            daemon.stop()?;
            eprintln!("BPF stats {mode}: {:.3} s", cost.0.secs);
            costs.push(cost);
        }
    }
    let stats = format!("{stats_at_start} / {}", common::bpf_stats_enabled()?);

    let classes = tmp.path().join("classes");
    let src = Path::new(ROOT).join("tests/workloads/java/Churn.java");
    common::check(Command::new("javac").arg("-d").arg(&classes).arg(src))?;
    let mut jvm = Vec::new();
    for mode in ["fp", "tables"] {
        wait_quiet(quiet)?;
        let r = jvm_run(&bin, mode, &classes, tmp.path());
        jvm.push(r.with_context(|| format!("JVM, {mode}"))?);
    }
    let mut report = render_cost(&load_start, &stats, &runs, &costs)?;
    report += &render_jvm(&jvm);
    common::write_report("unwind", &report)
}

/// Ids of all loaded BPF programs.
fn all_progs() -> Result<BTreeSet<u64>> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()?;
    ensure!(out.status.success(), "bpftool prog show failed");
    let progs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    Ok(progs.iter().filter_map(|p| p["id"].as_u64()).collect())
}

/// Whether BPF programs other than `daemon`'s are loaded.
fn others_loaded(daemon: Option<&Daemon>) -> Result<bool> {
    let ours = daemon.map_or_else(BTreeSet::new, |d| common::linked_progs(d.guard.0.id()));
    Ok(!all_progs()?.is_subset(&ours))
}

/// Waits up to `limit` until no BPF program is loaded.
fn wait_quiet(limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    while others_loaded(None)? && Instant::now() < deadline {
        sleep(Duration::from_millis(500));
    }
    Ok(())
}

/// Runs [`PIPE`] once with `daemon`'s unwind counters around it. With
/// `bpf_stats`, also its programs' run counts and times, and then the
/// context switches and BPF stats are counted only from [`STEADY_AFTER`]
/// into the run, and (tables) once table walks have begun: a new process
/// gets its tables at a drain after it appears, 1–2 s, walked with frame
/// pointers until then.
fn measure(daemon: Option<&Daemon>, bpf_stats: bool) -> Result<(Run, Progs)> {
    let ids = daemon.map_or_else(BTreeSet::new, |d| common::linked_progs(d.guard.0.id()));
    ensure!(
        daemon.is_none() || !ids.is_empty(),
        "the daemon holds no BPF links"
    );
    let stats = || match bpf_stats {
        true => common::prog_stats(&ids),
        false => Ok(BTreeMap::new()),
    };
    let counters = || daemon.map_or(Ok(Counters::new()), Daemon::unwind_counters);
    let (unwind0, others0) = (counters()?, others_loaded(daemon)?);
    let (mut progs0, mut switches0) = (stats()?, common::context_switches()?);
    let argv: Vec<&str> = PIPE.split(' ').collect();
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut child, started) = (cmd.spawn()?, Instant::now());
    let tables = daemon.is_some_and(|d| d.tables);
    let mut waiting = bpf_stats;
    while waiting && child.try_wait()?.is_none() {
        let walking = !tables || walks(&counters()?) > walks(&unwind0);
        if walking && started.elapsed() >= STEADY_AFTER {
            (progs0, switches0, waiting) = (stats()?, common::context_switches()?, false);
        }
        sleep(Duration::from_millis(200));
    }
    ensure!(!waiting, "the run ended before its BPF stats window opened");
    let out = child.wait_with_output()?;
    let switches = common::context_switches()? - switches0;
    let mut progs = Progs::new();
    for (id, (prog, cnt, ns)) in stats()? {
        let (cnt0, ns0) = progs0.get(&id).map_or((0, 0), |b| (b.1, b.2));
        let sum = progs.entry(prog).or_default();
        sum.0 += cnt.saturating_sub(cnt0);
        sum.1 += ns.saturating_sub(ns0);
    }
    let disturbed = others0 || others_loaded(daemon)?;
    // The counters reach /healthz at the next drain (1 s).
    sleep(Duration::from_millis(1500));
    let mut unwind = Counters::new();
    add_delta(&mut unwind, &unwind0, counters()?);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "`{PIPE}` failed: {stderr}");
    let total = stdout.split("Total time:").nth(1);
    let secs = total.and_then(|t| t.split_whitespace().next()?.parse().ok());
    let secs = secs.with_context(|| format!("no total time in perf's output:\n{stdout}"))?;
    let run = Run {
        secs,
        switches,
        unwind,
        disturbed,
    };
    Ok((run, progs))
}

/// A daemon with `--unwind MODE`, then the Churn JVM, queried [`WAIT_S`]
/// after it is ready.
fn jvm_run(bin: &Path, mode: &str, classes: &Path, tmp: &Path) -> Result<Jvm> {
    let daemon = Daemon::start(bin, mode, &tmp.join("daemon.log"))?;
    let unwind0 = daemon.unwind_counters()?;
    let mut cmd = Command::new("java");
    cmd.args(["-XX:+PreserveFramePointer", "-cp"])
        .arg(classes)
        .arg("Churn")
        .args(JVM_ARGS);
    let jvm_log = tmp.join("jvm.log");
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut jvm = Guard(cmd.stderr(fs::File::create(&jvm_log)?).spawn()?);
    let stdout = jvm.0.stdout.take().context("no JVM stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
        let _ = tx.send(lines.find_map(|l| l.strip_prefix("ready ")?.parse::<u32>().ok()));
    });
    let pid = rx.recv_timeout(Duration::from_secs(60)).ok().flatten();
    let jvm_err = || fs::read_to_string(&jvm_log).unwrap_or_default();
    let pid = pid.with_context(|| format!("no `ready PID` from the JVM:\n{}", jvm_err()))?;
    eprintln!("JVM pid {pid} under --unwind {mode}, waiting {WAIT_S} s");
    sleep(Duration::from_secs(WAIT_S));
    ensure!(
        jvm.0.try_wait()?.is_none(),
        "the JVM exited early:\n{}",
        jvm_err()
    );
    let fetch = |kind: &str| -> Result<Folded> {
        let query = format!("/folded?pid={pid}&kind={kind}&seconds={WINDOW_S}");
        let url = format!("http://127.0.0.1:{}{query}", daemon.port);
        let body = ureq::get(&url).timeout(Duration::from_secs(30)).call();
        let body = body.with_context(|| format!("GET {query}"))?;
        Ok(parse(&body.into_string()?))
    };
    let (futex, threads) = (fetch("futex")?, fetch("futex&group=thread")?);
    let cpu = fetch("cpu")?;
    let mut unwind = Counters::new();
    add_delta(&mut unwind, &unwind0, daemon.unwind_counters()?);
    let tables = daemon.healthz()?["pipeline"]["unwind"].clone();
    drop(jvm);
    // The perf map wallscope had the JVM write; nothing reads it any more.
    let _ = fs::remove_file(format!("/tmp/perf-{pid}.map"));
    daemon.stop()?;
    Ok(Jvm {
        futex,
        threads,
        cpu,
        unwind,
        tables,
    })
}
