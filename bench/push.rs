//! Pushing at a real Pyroscope's pace: a Pyroscope answers a push only
//! after its ~500 ms flush. Forty busy processes (`busy-NN`, each its own
//! program) run while the release daemon pushes every 5 s to a loopback
//! server that answers each request after `WS_BENCH_FLUSH_MS` (500), at
//! `--push-top` 32 and 100, for `WS_BENCH_INTERVALS` (12) intervals; the
//! same runs against a server that answers at once give the side-by-side
//! ratio.
//!
//! Figures per run: requests per interval, the share of the time the
//! server had a request in flight, the interval's send time (from
//! queueing its requests to the last answer: `/healthz`
//! `push.last_interval.send_s`, read every interval) as median and max
//! and as a share of the interval, requests in flight at most (seen by
//! the server), the most requests queued, profiles dropped, and the time
//! from SIGTERM to exit with the last interval sent. With
//! `WS_BENCH_BEFORE=/path/to/an/older/wallscope` the older daemon is
//! measured the same way in the same run.
//!
//! Prints the table and writes `bench/results/push.md`. Needs root and a C
//! compiler.

#[path = "common/mod.rs"]
mod common;

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use common::{check, free_port, healthz, median, spawn_logged, table, wait_healthy, Guard, ROOT};

const BUSY: usize = 40;
const INTERVAL_S: u64 = 5;

fn main() {
    common::main("push", run);
}

/// A loopback server that answers every request with 200 after `delay`,
/// counting requests and the most in flight at once. Not a Pyroscope
/// check (the e2e stand-in does that): only its pace.
#[derive(Default)]
struct Pace {
    requests: u64,
    in_flight: u64,
    max_in_flight: u64,
    /// Time with a request in flight: since when, and in all.
    busy_since: Option<Instant>,
    busy: Duration,
}

fn serve(delay: Duration) -> Result<(u16, Arc<Mutex<Pace>>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let pace = Arc::new(Mutex::new(Pace::default()));
    let shared = pace.clone();
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let pace = shared.clone();
            thread::spawn(move || answer(conn, delay, &pace));
        }
    });
    Ok((port, pace))
}

fn answer(conn: TcpStream, delay: Duration, pace: &Mutex<Pace>) {
    let Ok(read) = conn.try_clone() else { return };
    let mut reader = BufReader::new(read);
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim().to_ascii_lowercase();
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    {
        let mut p = pace.lock().unwrap();
        p.requests += 1;
        p.in_flight += 1;
        p.max_in_flight = p.max_in_flight.max(p.in_flight);
        p.busy_since.get_or_insert_with(Instant::now);
    }
    thread::sleep(delay);
    let mut p = pace.lock().unwrap();
    p.in_flight -= 1;
    if p.in_flight == 0 {
        if let Some(since) = p.busy_since.take() {
            p.busy += since.elapsed();
        }
    }
    drop(p);
    let mut conn = conn;
    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
}

/// What one run measured.
#[derive(Debug)]
struct Run {
    intervals: u64,
    requests: u64,
    /// Share of the measured time the server had a request in flight.
    server_busy: f64,
    send_s: Vec<f64>,
    max_in_flight: u64,
    max_queued: u64,
    dropped: u64,
    exit_s: f64,
}

fn measure(daemon: &Path, top: u64, flush: Duration, intervals: u64, log: &Path) -> Result<Run> {
    let (server, pace) = serve(flush)?;
    let port = free_port()?;
    let mut cmd = Command::new(daemon);
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--push-url", &format!("http://127.0.0.1:{server}")])
        .args(["--push-interval", &format!("{INTERVAL_S}s")])
        .args(["--push-top", &top.to_string()]);
    let mut guard = spawn_logged(&mut cmd, log)?;
    wait_healthy(&mut guard, port)?;
    let push = |port| healthz(port).map(|h| h["push"].clone());
    // From the first interval sent (the first drains build unwind tables).
    let deadline = Instant::now() + Duration::from_secs(180);
    let first = loop {
        let p = push(port).context("no /healthz")?;
        if p["sent_requests"].as_u64() > Some(0) {
            break p;
        }
        ensure!(Instant::now() < deadline, "nothing pushed in 180 s");
        thread::sleep(Duration::from_millis(200));
    };
    let (start_intervals, start_requests, start_busy) = {
        let p = pace.lock().unwrap();
        (
            first["intervals"].as_u64().unwrap_or(0),
            p.requests,
            p.busy + p.busy_since.map_or(Duration::ZERO, |s| s.elapsed()),
        )
    };
    let started = Instant::now();
    let mut send_s = Vec::new();
    let mut seen = start_intervals;
    let last = loop {
        thread::sleep(Duration::from_millis(250));
        let p = push(port).context("no /healthz")?;
        let n = p["intervals"].as_u64().unwrap_or(0);
        if n > seen {
            seen = n;
            if let Some(s) = p["last_interval"]["send_s"].as_f64() {
                send_s.push(s);
            }
        }
        if n >= start_intervals + intervals {
            break p;
        }
    };
    let (requests, server_busy) = {
        let p = pace.lock().unwrap();
        let busy = p.busy + p.busy_since.map_or(Duration::ZERO, |s| s.elapsed()) - start_busy;
        (
            p.requests - start_requests,
            busy.as_secs_f64() / started.elapsed().as_secs_f64(),
        )
    };
    let stopped = Instant::now();
    guard.stop(libc::SIGTERM)?;
    let exit_s = stopped.elapsed().as_secs_f64();
    let max_in_flight = pace.lock().unwrap().max_in_flight;
    Ok(Run {
        intervals,
        requests,
        server_busy,
        send_s,
        max_in_flight,
        max_queued: last["max_queued_requests"].as_u64().unwrap_or(0),
        dropped: last["dropped_profiles"].as_u64().unwrap_or(0),
        exit_s,
    })
}

/// Builds `tests/workloads/cpu_shares.c` and starts it as `busy-NN`.
fn busy(dir: &Path) -> Result<Vec<Guard>> {
    let bin = dir.join("cpu_shares");
    check(
        Command::new("clang")
            .args(["-O1", "-pthread", "-o"])
            .arg(&bin)
            .arg(Path::new(ROOT).join("tests/workloads/cpu_shares.c")),
    )?;
    (0..BUSY)
        .map(|i| {
            let link = dir.join(format!("busy-{i:02}"));
            std::os::unix::fs::symlink(&bin, &link)?;
            spawn_logged(Command::new(&link).arg("3600"), &dir.join("busy.log"))
        })
        .collect()
}

fn run() -> Result<()> {
    common::require_root("loads BPF programs")?;
    let flush = Duration::from_millis(common::env_u64("WS_BENCH_FLUSH_MS", 500)?);
    let intervals = common::env_u64("WS_BENCH_INTERVALS", 12)?;
    let tmp = tempfile::tempdir()?;
    let mut daemons = vec![("this build".to_string(), common::daemon_binary()?)];
    if let Ok(before) = std::env::var("WS_BENCH_BEFORE") {
        daemons.insert(0, (format!("before ({before})"), PathBuf::from(before)));
    }
    let workers = busy(tmp.path())?;
    let (date, kernel, _) = common::system()?;
    let mut rows = Vec::new();
    for (name, daemon) in &daemons {
        for top in [32, 100] {
            for delay in [flush, Duration::ZERO] {
                let log = tmp.path().join("daemon.log");
                let r = measure(daemon, top, delay, intervals, &log)?;
                println!("{name} top {top} server {delay:?}: {r:?}");
                // An older daemon may not report its send times.
                let med = median(r.send_s.iter().copied());
                let max = r.send_s.iter().copied().reduce(f64::max);
                let secs = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{s:.2} s"));
                rows.push(vec![
                    name.clone(),
                    top.to_string(),
                    format!("{} ms", delay.as_millis()),
                    format!("{:.1}", r.requests as f64 / r.intervals as f64),
                    format!("{:.0} %", 100.0 * r.server_busy),
                    secs(med),
                    secs(max),
                    max.map_or("-".into(), |m| {
                        format!("{:.0} %", 100.0 * m / INTERVAL_S as f64)
                    }),
                    r.max_in_flight.to_string(),
                    r.max_queued.to_string(),
                    r.dropped.to_string(),
                    format!("{:.2} s", r.exit_s),
                ]);
            }
        }
    }
    drop(workers);
    let (_, _, load) = common::system()?;
    let report = format!(
        "# Push at a real Pyroscope's pace\n\n\
         {date}, kernel {kernel}, load after: {load}. {BUSY} busy processes, \
         {INTERVAL_S} s intervals, {intervals} intervals a run after the first push, \
         the release daemon; a loopback server answering each request after the \
         delay given (a real Pyroscope answers after its ~500 ms flush), and the \
         same runs against one that answers at once. Send time: from queueing an \
         interval's requests to the last answer (`/healthz` \
         `push.last_interval.send_s`; an older daemon does not report it). \
         Server busy: the share of the time the server had a request in \
         flight. Written by `cargo bench --bench push`.\n\n{}\n",
        table(
            &[
                "daemon",
                "--push-top",
                "server",
                "requests / interval",
                "server busy",
                "send time (median)",
                "send time (max)",
                "max / interval",
                "in flight (max)",
                "queued (max)",
                "dropped profiles",
                "SIGTERM to exit",
            ],
            &rows,
        )
    );
    common::write_report("push", &report)
}
