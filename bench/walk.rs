//! What one user stack walk costs, by stack depth: a program spinning at a
//! fixed depth (`bench/workloads/deep.c`: 10, 30 and 90 frames), built
//! without frame pointers (walked with unwind tables) and with them, sampled
//! by the daemon at 999 Hz. The BPF programs time every walk into a
//! histogram (`/healthz` `walk_cost`), read here by kind and depth: walks,
//! p50 and p99 (upper bounds of 19 %-wide slots).
//!
//! Then a JVM started without any flag (`bench/workloads/DeepJava.java`, a
//! thread spinning under a deep chain of Java calls): its walks step
//! through compiled frames by their code blob's frame size (issue #27); the
//! rows of its depth buckets are reported as they come.
//!
//! Prints the table and writes `bench/results/walk.md`. Needs root, a C
//! compiler and a JDK. Env: `WS_BENCH_SECONDS` (default 10) per build.

#[path = "common/mod.rs"]
mod common;

use anyhow::{ensure, Context, Result};
use common::{healthz, table, Guard, ROOT};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

/// Stack depths measured, in frames (the program adds 5 below its levels:
/// `level` at depth 0, main, two of glibc's and `_start`).
const DEPTHS: [u32; 3] = [10, 30, 90];
const FRAMES_BELOW_LEVELS: u32 = 5;
/// The target of issue 25: a 30-frame walk's p50.
const TARGET_P50_NS_30: u64 = 1000;

/// A build of the workload: its name and the compiler flag that makes it.
const BUILDS: [(&str, &str); 2] = [
    ("tables (no frame pointers)", "-fomit-frame-pointer"),
    ("frame pointers", "-fno-omit-frame-pointer"),
];

fn main() {
    common::main("walk", run);
}

fn run() -> Result<()> {
    common::require_root("loads BPF programs")?;
    let seconds = common::env_u64("WS_BENCH_SECONDS", 10)?;
    let daemon = common::daemon_binary()?;
    let tmp = tempfile::tempdir()?;
    let (date, kernel, _) = common::system()?;
    let mut rows = Vec::new();
    let mut verdicts = Vec::new();
    for (build, flag) in BUILDS {
        let bin = compile(tmp.path(), flag)?;
        let measured = measure(&daemon, &bin, tmp.path(), seconds)?;
        for depth in DEPTHS {
            let from = depth / 8 * 8;
            for r in measured.iter().filter(|r| r.frames_from == from) {
                rows.push(vec![
                    build.to_string(),
                    depth.to_string(),
                    r.kind.clone(),
                    r.walks.to_string(),
                    r.p50_ns.to_string(),
                    r.p99_ns.to_string(),
                ]);
                if depth == 30 {
                    let met = if r.p50_ns <= TARGET_P50_NS_30 {
                        "met"
                    } else {
                        "MISSED"
                    };
                    verdicts.push(format!("{build}, {}: p50 {} ns ({met})", r.kind, r.p50_ns));
                }
            }
        }
    }
    let java_rows = measure_java(&daemon, tmp.path(), seconds)?;
    for r in &java_rows {
        rows.push(vec![
            "JVM, no flags (DeepJava)".to_string(),
            format!("{}-{}", r.frames_from, r.frames_from + 7),
            r.kind.clone(),
            r.walks.to_string(),
            r.p50_ns.to_string(),
            r.p99_ns.to_string(),
        ]);
    }
    if let Some(r) = java_rows.iter().max_by_key(|r| r.frames_from) {
        verdicts.push(format!(
            "JVM without flags, {}-{} frames (mixed Java and native): p50 {} ns",
            r.frames_from,
            r.frames_from + 7,
            r.p50_ns
        ));
    }
    let report = format!(
        "# Stack walk cost\n\n- date: {date}\n- kernel: {kernel}\n- {seconds} s per build at 999 Hz; \
         rows with at least 100 walks\n\n{}\np50/p99: upper bounds of the histogram slots that hold \
         them (slots are 19 % wide). Walks of one depth bucket (frames / 8) by any process on the \
         host count too; the spinning workloads make nearly all of them.\n\nVerdict (issue 25: \
         30-frame walk p50 <= {TARGET_P50_NS_30} ns): {}\n",
        table(
            &["build", "frames", "walked as", "walks", "p50 ns", "p99 ns"],
            &rows
        ),
        verdicts.join("; ")
    );
    common::write_report("walk", &report)
}

/// Java calls the JVM's thread makes down to its spin (C2 inlines some).
const JAVA_DEPTH: u32 = 160;

/// Runs DeepJava without any flag under a fresh daemon for `seconds` (after
/// a warm-up, so that its code is compiled) and returns the walk costs of
/// its depth buckets (deeper than any of the daemon's own walks).
fn measure_java(daemon: &Path, tmp: &Path, seconds: u64) -> Result<Vec<Row>> {
    let java = common::find_tool("java", "openjdk-17-jdk-headless")?;
    let javac = common::find_tool("javac", "openjdk-17-jdk-headless")?;
    let classes = tmp.join("classes");
    common::check(
        Command::new(javac)
            .arg("-d")
            .arg(&classes)
            .arg(Path::new(ROOT).join("bench/workloads/DeepJava.java")),
    )?;
    let mut cmd = Command::new(java);
    cmd.arg("-cp")
        .arg(&classes)
        .args([
            "DeepJava",
            &JAVA_DEPTH.to_string(),
            &(seconds + 60).to_string(),
        ])
        .stdout(Stdio::null());
    let jvm = Guard(cmd.spawn().context("starting the JVM")?);
    sleep(Duration::from_secs(5));
    let rows = measure_running(daemon, tmp, seconds)?;
    drop(jvm);
    Ok(rows.into_iter().filter(|r| r.frames_from >= 16).collect())
}

/// Builds `deep.c` with `flag` into `dir`.
fn compile(dir: &Path, flag: &str) -> Result<PathBuf> {
    let out = dir.join(format!("deep{flag}"));
    let src = Path::new(ROOT).join("bench/workloads/deep.c");
    common::check(
        Command::new("cc")
            .args(["-O2", flag, "-o"])
            .arg(&out)
            .arg(src),
    )?;
    Ok(out)
}

/// One `walk_cost` row of `/healthz`.
struct Row {
    kind: String,
    frames_from: u32,
    walks: u64,
    p50_ns: u64,
    p99_ns: u64,
}

/// Runs the three depths of `bin` under a fresh daemon for `seconds` and
/// returns its walk costs (rows with at least 100 walks).
fn measure(daemon: &Path, bin: &Path, tmp: &Path, seconds: u64) -> Result<Vec<Row>> {
    let mut spinners = Vec::new();
    for depth in DEPTHS {
        let levels = depth - FRAMES_BELOW_LEVELS;
        let mut cmd = Command::new(bin);
        cmd.arg(levels.to_string()).stdout(Stdio::null());
        spinners.push(Guard(cmd.spawn().context("starting the workload")?));
    }
    let rows = measure_running(daemon, tmp, seconds);
    drop(spinners);
    rows
}

/// The walk costs of what runs on the host, under a fresh daemon, over
/// `seconds` (rows with at least 100 walks).
fn measure_running(daemon: &Path, tmp: &Path, seconds: u64) -> Result<Vec<Row>> {
    // Tables are registered after the first drains: the walks counted
    // before are frame-pointer walks and show as such.
    let (mut d, port) = common::serve_999hz(daemon, &tmp.join("daemon.log"))?;
    sleep(Duration::from_secs(seconds));
    let h = healthz(port).context("no /healthz")?;
    d.stop(libc::SIGINT)?;
    let rows: Vec<Row> = h["pipeline"]["walk_cost"]
        .as_array()
        .context("no walk_cost in /healthz")?
        .iter()
        .filter_map(|r| {
            Some(Row {
                kind: r["kind"].as_str()?.to_string(),
                frames_from: r["frames_from"].as_u64()? as u32,
                walks: r["walks"].as_u64()?,
                p50_ns: r["p50_ns"].as_u64()?,
                p99_ns: r["p99_ns"].as_u64()?,
            })
        })
        .filter(|r| r.walks >= 100 && r.kind.starts_with("user"))
        .collect();
    ensure!(!rows.is_empty(), "no user stack walks counted");
    Ok(rows)
}
