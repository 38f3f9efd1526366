//! Short-lived processes: are their samples symbolized, and what does the
//! process table's reading of `/proc` cost? 100 processes that spin 50 ms
//! (`tests/workloads/lifecycle.c brief 50`) run one after another beside a
//! churn of `/bin/true` (about 100 a second, as on a busy build host),
//! sampled by the daemon at 999 Hz; then each one's `/folded` is read.
//!
//! Figures per daemon: the share of their samples named after the program,
//! in its own code (`variant_a_brief` and `variant_a_spin`), and with an
//! unknown user frame; and the table's maps reads, those that failed, and
//! those not made because the process had already exited. With
//! `WS_BENCH_BEFORE=/path/to/an/older/wallscope` the older daemon is
//! measured the same way in the same run, side by side.
//!
//! Prints the table and writes `bench/results/short_lived.md`. Needs root
//! and a C compiler.

#[path = "common/mod.rs"]
mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use common::{healthz, table, wait_drains, ROOT};

/// Processes measured per daemon, and how long each spins.
const PROCESSES: usize = 100;
const SPIN_MS: &str = "50";
/// `/bin/true`s started per second beside them.
const CHURN_PER_S: u64 = 100;

fn main() {
    common::main("short_lived", run);
}

fn run() -> Result<()> {
    common::require_root("loads BPF programs")?;
    let tmp = tempfile::tempdir()?;
    let brief = compile(tmp.path())?;
    let mut daemons = vec![("this build".to_string(), common::daemon_binary()?)];
    if let Ok(before) = std::env::var("WS_BENCH_BEFORE") {
        daemons.insert(0, (format!("before ({before})"), PathBuf::from(before)));
    }
    let (date, kernel, _) = common::system()?;
    let mut rows = Vec::new();
    for (name, daemon) in &daemons {
        let m = measure(daemon, &brief, tmp.path())?;
        println!("{name}: {m:?}");
        rows.push(vec![
            name.clone(),
            format!("{} of {PROCESSES}", m.sampled),
            m.rows.to_string(),
            format!("{:.2}", m.named),
            format!("{:.2}", m.code),
            format!("{:.2}", m.unknown),
            m.maps_reads.to_string(),
            format!(
                "{} ({:.1} %)",
                m.failures,
                100.0 * m.failures as f64 / m.maps_reads.max(1) as f64
            ),
            m.skipped.to_string(),
            m.exits.to_string(),
        ]);
    }
    let report = format!(
        "# Short-lived processes\n\n- date: {date}\n- kernel: {kernel}\n- {PROCESSES} processes \
         spinning {SPIN_MS} ms one after another, beside ~{CHURN_PER_S} `/bin/true` a second; \
         daemon at 999 Hz, release build\n\n{}\nnamed: share of their samples under the \
         program's name; code: with `variant_a_brief` and `variant_a_spin` (start-up, exec and \
         the loader, is the rest); unknown: with an unknown user frame. Maps reads, failures and \
         reads not made are the process table's (`/healthz` `pipeline.processes`) over the run, \
         the churn included: a failure is a process that exited while, or just before, its maps \
         were read; a read not made is one whose exit the table had already applied (older \
         builds count these as failures).\n",
        table(
            &[
                "daemon",
                "processes with samples",
                "stack rows",
                "named",
                "code",
                "unknown",
                "maps reads",
                "failed",
                "not made (exited)",
                "exits",
            ],
            &rows
        )
    );
    common::write_report("short_lived", &report)
}

/// Builds `lifecycle.c` as the tests do.
fn compile(dir: &Path) -> Result<PathBuf> {
    let out = dir.join("lifecycle_brief");
    let src = Path::new(ROOT).join("tests/workloads/lifecycle.c");
    common::check(
        Command::new("cc")
            .args(["-g", "-O1", "-fno-inline", "-fno-omit-frame-pointer", "-o"])
            .arg(&out)
            .arg(src),
    )?;
    Ok(out)
}

#[derive(Debug, Default)]
struct Measured {
    sampled: usize,
    rows: usize,
    named: f64,
    code: f64,
    unknown: f64,
    maps_reads: u64,
    failures: u64,
    skipped: u64,
    exits: u64,
}

/// Starts `/bin/true` about [`CHURN_PER_S`] times a second until `stop`.
fn churn(stop: Arc<AtomicBool>, started: Arc<AtomicU64>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let every = Duration::from_micros(1_000_000 / CHURN_PER_S);
        while !stop.load(Ordering::Relaxed) {
            if let Ok(mut c) = Command::new("/bin/true").spawn() {
                let _ = c.wait();
                started.fetch_add(1, Ordering::Relaxed);
            }
            thread::sleep(every);
        }
    })
}

fn table_stats(port: u16) -> Result<serde_json::Value> {
    let h = healthz(port).context("no /healthz")?;
    Ok(h["pipeline"]["processes"].clone())
}

fn measure(daemon: &Path, brief: &Path, tmp: &Path) -> Result<Measured> {
    let (mut d, port) = common::serve_999hz(daemon, &tmp.join("daemon.log"))?;
    let before = table_stats(port)?;
    let stop = Arc::new(AtomicBool::new(false));
    let churned = Arc::new(AtomicU64::new(0));
    let churner = churn(stop.clone(), churned.clone());
    let since = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() - 1;
    let mut pids = Vec::new();
    for _ in 0..PROCESSES {
        let child = Command::new(brief)
            .args(["brief", SPIN_MS])
            .stdout(Stdio::null())
            .spawn()?;
        pids.push(child.id());
        child.wait_with_output()?;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = churner.join();
    let drains = healthz(port)
        .and_then(|h| h["pipeline"]["drains"].as_u64())
        .unwrap_or(0);
    wait_drains(port, drains + 3)?;
    let after = table_stats(port)?;
    let mut rows: Vec<(Vec<String>, u64)> = Vec::new();
    let mut sampled = 0;
    for pid in &pids {
        let url = format!("http://127.0.0.1:{port}/folded?pid={pid}&from={since}");
        let Ok(answer) = ureq::get(&url).call() else {
            continue;
        };
        let body = answer.into_string()?;
        let before = rows.len();
        rows.extend(body.lines().filter_map(|l| {
            let (stack, n) = l.rsplit_once(' ')?;
            Some((
                stack.split(';').map(str::to_string).collect(),
                n.parse().ok()?,
            ))
        }));
        sampled += usize::from(rows.len() > before);
    }
    d.stop(libc::SIGINT)?;
    let share = |pred: &dyn Fn(&[String]) -> bool| {
        let total: u64 = rows.iter().map(|r| r.1).sum();
        let with: u64 = rows.iter().filter(|r| pred(&r.0)).map(|r| r.1).sum();
        with as f64 / total.max(1) as f64
    };
    let has = |f: &[String], s: &str| f.iter().any(|x| x.contains(s));
    let delta = |k: &str| after[k].as_u64().unwrap_or(0) - before[k].as_u64().unwrap_or(0);
    Ok(Measured {
        sampled,
        rows: rows.len(),
        named: share(&|f| f[0] == "lifecycle_brief"),
        code: share(&|f| has(f, "variant_a_brief") && has(f, "variant_a_spin")),
        unknown: share(&|f| {
            f.iter()
                .any(|x| !x.ends_with("_[k]") && (x.contains("[unknown]") || x.contains("+0x")))
        }),
        maps_reads: delta("maps_reads"),
        failures: delta("maps_read_failures"),
        skipped: delta("maps_reads_skipped"),
        exits: delta("exits"),
    })
}
