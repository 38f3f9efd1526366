//! Web UI: how long the pages take to draw in Debian's headless chromium,
//! and how much they weigh, on a host with 500 live processes and one of
//! 10,000 threads, against the release daemon.
//!
//! Measured as the page itself reports it (`performance.now()` when every
//! panel has drawn: navigation, scripts, every API answer and drawing) and
//! the bytes the browser received (`transferSize` of the page and of every
//! request it made). Issue #14 asks for the 10,000-thread process page in
//! under 2 s: the report gives each figure's ratio to that budget.
//! Writes `bench/results/web.md`. Needs root and chromium
//! (`scripts/deps.sh bench`).

#[path = "../tests/e2e/support/browser.rs"]
mod browser;
#[path = "common/mod.rs"]
mod common;

use anyhow::{ensure, Context, Result};
use browser::Browser;
use common::{
    check, daemon_binary, free_port, get, median, require_root, spawn_logged, system, table,
    wait_drains, wait_healthy, write_report, Guard, ROOT,
};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

const PROCESSES: usize = 500;
const THREADS: usize = 10_000;
const RUNS: usize = 5;
/// The budget for the 10,000-thread process page.
const BUDGET_MS: f64 = 2000.0;

fn main() {
    common::main("web", run);
}

/// One page load: ms to the last panel drawn, bytes received.
struct Load {
    ms: f64,
    bytes: f64,
}

fn load(b: &mut Browser, port: u16, url: &str) -> Load {
    b.goto("about:blank");
    idle(port);
    b.goto(url);
    let ms = b.wait_for(
        url,
        "document.body.dataset.loadedMs && Number(document.body.dataset.loadedMs)",
        Duration::from_secs(60),
    );
    let bytes = b.eval(
        "performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'))
           .reduce((a, e) => a + (e.transferSize || e.encodedBodySize || 0), 0)",
    );
    Load {
        ms: ms.as_f64().unwrap_or(f64::NAN),
        bytes: bytes.as_f64().unwrap_or(f64::NAN),
    }
}

/// Waits until no query of an earlier load is running or waiting: a query
/// whose page went away still runs to its end, and each load is measured
/// alone.
fn idle(port: u16) {
    for _ in 0..600 {
        let busy = get(port, "/metrics").map_or(true, |m| {
            !(m.contains("wallscope_queries{state=\"running\"} 0")
                && m.contains("wallscope_queries{state=\"waiting\"} 0"))
        });
        if !busy {
            return;
        }
        sleep(Duration::from_millis(100));
    }
}

fn run() -> Result<()> {
    require_root("the daemon loads eBPF programs")?;
    let daemon_bin = daemon_binary()?;
    let dir = Path::new(ROOT).join("target/bench-web");
    std::fs::create_dir_all(&dir)?;
    let threads_bin = dir.join("many_threads");
    let src = Path::new(ROOT).join("tests/workloads/many_threads.c");
    check(
        Command::new("gcc")
            .args(["-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
            .arg(&threads_bin)
            .arg(src),
    )?;

    let port = free_port()?;
    let mut daemon = spawn_logged(
        Command::new(&daemon_bin).args(["serve", "--listen", &format!("127.0.0.1:{port}")]),
        &dir.join("daemon.log"),
    )?;
    wait_healthy(&mut daemon, port)?;
    wait_drains(port, 3)?;

    // 500 single-thread processes that wake about four times a second
    // (not shell loops: their fork and exec of `sleep` a thousand times a
    // second loaded 2 cores to a load average of 300), and one of 10,000
    // threads.
    let mut others = Vec::with_capacity(PROCESSES);
    for _ in 0..PROCESSES {
        let child = Command::new(&threads_bin)
            .args(["1", "600"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting a one-thread process")?;
        others.push(Guard(child));
    }
    let big = Guard(
        Command::new(&threads_bin)
            .args([THREADS.to_string(), "600".to_string()])
            .stdout(Stdio::null())
            .spawn()
            .context("starting many_threads")?,
    );
    let big_pid = big.0.id();
    sleep(Duration::from_secs(15));

    let mut b = Browser::launch();
    let base = format!("http://127.0.0.1:{port}");
    // Each page with what it must have drawn: a figure is only kept for a
    // page that shows the host's processes or the process's threads.
    let processes_listed = "document.querySelectorAll('#processes-table tr[data-pid]').length";
    let threads_counted = "Number((document.getElementById('summary-body').textContent.match(/(\\d+) threads/) || [])[1] || 0)";
    let pages = [
        (
            "host page, 500+ processes",
            format!("{base}/?seconds=30"),
            processes_listed,
            PROCESSES,
        ),
        (
            "process page, 10,000 threads",
            format!("{base}/process/{big_pid}?seconds=30"),
            threads_counted,
            THREADS,
        ),
        (
            "process page, 10,000 threads by pool",
            format!("{base}/process/{big_pid}?seconds=30&tgroup=pool"),
            threads_counted,
            THREADS,
        ),
    ];
    let mut rows = Vec::new();
    let mut worst_big = 0.0f64;
    for (name, url, drawn, least) in &pages {
        let mut loads = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            loads.push(load(&mut b, port, url));
            let shown = b.eval(drawn).as_u64().unwrap_or(0);
            ensure!(
                shown as usize >= *least,
                "{name}: {shown} drawn, {least} expected"
            );
        }
        let ms: Vec<f64> = loads.iter().map(|l| l.ms).collect();
        let max = ms.iter().cloned().fold(0.0, f64::max);
        if name.starts_with("process") {
            worst_big = worst_big.max(max);
        }
        let med = median(ms.iter().cloned()).unwrap_or(f64::NAN);
        let kib = median(loads.iter().map(|l| l.bytes)).unwrap_or(f64::NAN) / 1024.0;
        rows.push(vec![
            name.to_string(),
            format!("{med:.0}"),
            format!("{max:.0}"),
            format!("{:.2}", max / BUDGET_MS),
            format!("{kib:.0}"),
        ]);
    }
    let errors = b.console_errors();
    ensure!(errors.is_empty(), "console errors: {errors:#?}");

    let (date, kernel, loadavg) = system()?;
    let verdict = if worst_big < BUDGET_MS {
        "PASS"
    } else {
        "FAIL"
    };
    let report = format!(
        "# Web UI: time to draw and page weight\n\n\
         {date}, kernel {kernel}, load {loadavg}; release daemon, headless chromium, \
         {RUNS} loads of each page (median and slowest). Time: from navigation to the \
         last panel drawn, as the page measures it. Weight: bytes received for the page, \
         its scripts and every API answer.\n\n\
         Host: {PROCESSES} one-thread processes waking about four times a second besides the usual ones; \
         one process of {THREADS} threads (`many_threads`).\n\n{}\n\
         10,000-thread process page under {BUDGET_MS:.0} ms: **{verdict}** (slowest {worst_big:.0} ms).\n",
        table(
            &["page", "median ms", "slowest ms", "slowest / 2 s budget", "KiB received"],
            &rows
        )
    );
    write_report("web", &report)?;
    drop(big);
    drop(others);
    Ok(())
}
