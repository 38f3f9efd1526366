//! The soak's markdown report: how the run was made (with the host's
//! load), the issue #24 acceptance figures with their verdicts, the daemon
//! by minute (RSS total and by holder, history held, drains, `/healthz`
//! latency, CPU, load, rows dropped), the heavy queries, the many-threads
//! process's completeness checks, and every loss or merge counter's change.

use crate::common::{self, percentile, table, verdict};
use crate::extra::ATTACKS;
use crate::load::{JVM_FLAGS, MESSAGING, SPAWN_RATE, THREADS};
use crate::probe::{loss_counters, COVERAGE_SECONDS, HEAVY_QUERIES};
use crate::{Sample, Soak, FULL_MINUTES, HEAVY_EVERY_S};
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// RSS at any moment, MB.
const RSS_MAX_MB: f64 = 150.0;
/// RSS steady (the last [`STEADY_WINDOW_S`]), MB, and its spread, %.
const RSS_STEADY_MB: f64 = 100.0;
const STEADY_PCT: f64 = 10.0;
const STEADY_WINDOW_S: f64 = 1200.0;
/// The window that must be answerable, the seconds of it that count as
/// answered, and from when on.
const WINDOW_S: u64 = 600;
const ANSWERED_S: u64 = 590;
const ANSWERABLE_AFTER_S: f64 = 600.0;
const DRAIN_P99_MS: f64 = 100.0;
const HEALTHZ_P99_MS: f64 = 50.0;
/// Counters whose increase means rows lost: BPF's full maps, the
/// collector's dropped batches, the store's evicted and shed rows.
const ROW_LOSSES: [&str; 5] = [
    "lost.counts_map_full",
    "lost.threads_map_full",
    "pipeline.rows_dropped",
    "store.evicted_rows",
    "store.shed_rows",
];

fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Daemon CPU between two samples, % of one CPU.
fn cpu_pct(a: &Sample, b: &Sample) -> f64 {
    (b.cpu_s - a.cpu_s) / (b.at - a.at).max(1e-9) * 100.0
}

/// A `/healthz` number at a dotted path.
fn at(health: &Value, path: &str) -> Option<f64> {
    path.split('.').try_fold(health, |v, k| v.get(k))?.as_f64()
}

/// Rows lost by `health` (the [`ROW_LOSSES`] counters summed).
fn rows_lost(health: &Value) -> u64 {
    ROW_LOSSES.iter().filter_map(|p| at(health, p)).sum::<f64>() as u64
}

pub fn render(s: &Soak) -> Result<String> {
    let first = s.samples.first().context("no samples")?;
    let last = s.samples.last().context("no samples")?;
    let retention = s
        .samples
        .iter()
        .find_map(|x| x.health["retention_s"].as_u64());
    let retention = retention.context("/healthz never gave retention_s")? as f64;
    let mut out = setup(s, retention)?;
    let mut rows = Vec::new();
    let mut row = |figure: &str, target: String, measured: String, ok: Option<bool>| {
        println!("{:<5} {figure}: {measured} (target {target})", verdict(ok));
        rows.push(vec![figure.into(), target, measured, verdict(ok).into()]);
    };

    let max_rss = s.samples.iter().map(|x| x.rss_kib).max().unwrap_or(0);
    let hwm = s
        .samples
        .iter()
        .filter_map(|x| at(&x.health, "memory.hwm_bytes"))
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    let peak = hwm.map_or(mb(max_rss), |h| (h / 1048576.0).max(mb(max_rss)));
    row(
        "RSS max (samples' RssAnon + RssFile, and VmHWM)",
        format!("< {RSS_MAX_MB} MB"),
        format!(
            "{peak:.1} MB (samples max {:.1} MB, VmHWM {})",
            mb(max_rss),
            hwm.map_or("n/a".into(), |h| format!("{:.1} MB", h / 1048576.0))
        ),
        Some(peak < RSS_MAX_MB),
    );
    let from = s.secs - STEADY_WINDOW_S;
    let window: Vec<f64> = s
        .samples
        .iter()
        .filter(|x| x.at >= from)
        .map(|x| mb(x.rss_kib))
        .collect();
    let mean = window.iter().sum::<f64>() / window.len().max(1) as f64;
    let (lo, hi) = window
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(l, h), v| (l.min(*v), h.max(*v)));
    let dev = ((hi - mean).max(mean - lo)) / mean.max(1e-9) * 100.0;
    row(
        "RSS steady: last 20 min within ±10 % of their mean and under 100 MB",
        format!("±{STEADY_PCT} %, < {RSS_STEADY_MB} MB"),
        format!(
            "±{dev:.1} % around {mean:.1} MB ({lo:.1}–{hi:.1} MB, {} samples from {:.0} s)",
            window.len(),
            from.max(0.0)
        ),
        (s.secs >= STEADY_WINDOW_S + retention).then_some(dev <= STEADY_PCT && hi < RSS_STEADY_MB),
    );
    let late: Vec<&(f64, Result<u64, String>)> = s
        .recorded
        .iter()
        .filter(|(at, _)| *at >= ANSWERABLE_AFTER_S)
        .collect();
    // Answered: the header says the window is recorded and the store
    // holds that much history (`store.history_s` of the nearest sample).
    let history_near = |t: f64| {
        let near = s
            .samples
            .iter()
            .filter(|x| !x.health.is_null())
            .min_by(|a, b| (a.at - t).abs().total_cmp(&(b.at - t).abs()));
        near.and_then(|x| at(&x.health, "store.history_s"))
    };
    let answered = late
        .iter()
        .filter(|(t, r)| {
            r.as_ref().is_ok_and(|n| *n >= ANSWERED_S)
                && history_near(*t).is_some_and(|h| h >= ANSWERED_S as f64)
        })
        .count();
    let worst = late.iter().filter_map(|(_, r)| r.as_ref().ok()).min();
    row(
        "600 s of history answerable at every minute after the tenth",
        format!("recorded ≥ {ANSWERED_S} s of {WINDOW_S} s and `store.history_s` ≥ {ANSWERED_S}"),
        format!(
            "{answered} of {} minute checks (least {} s; `store.history_s` at the end {})",
            late.len(),
            worst.map_or("n/a".into(), |w| w.to_string()),
            at(&last.health, "store.history_s").map_or("n/a".into(), |h| h.to_string()),
        ),
        (!late.is_empty()).then_some(answered == late.len()),
    );
    let p99s: Vec<f64> = s
        .samples
        .iter()
        .filter_map(|x| at(&x.health, "pipeline.drain_us_p99"))
        .map(|u| u / 1e3)
        .collect();
    let p99 = p99s.iter().copied().reduce(f64::max);
    let max_drain = at(&last.health, "pipeline.max_drain_us").map(|u| u / 1e3);
    let max_gap = at(&last.health, "pipeline.max_drain_gap_us").map(|u| u / 1e3);
    row(
        "drain p99 (the daemon's, over its last 600 drains, worst sample)",
        format!("< {DRAIN_P99_MS} ms"),
        format!(
            "{} ms (max {} ms, longest gap between drains {} ms, priority {})",
            fmt(p99),
            fmt(max_drain),
            fmt(max_gap),
            last.health["pipeline"]["drain_priority"],
        ),
        p99.map(|p| p < DRAIN_P99_MS),
    );
    let heavy_polls: Vec<_> = s.polls.polls.iter().filter(|p| p.heavy).collect();
    let failed = heavy_polls.iter().filter(|p| p.drains.is_none()).count();
    let lat = || heavy_polls.iter().map(|p| p.latency_ms);
    let hp99 = percentile(lat(), 99.0);
    row(
        "`/healthz` p99 during the heavy queries",
        format!("< {HEALTHZ_P99_MS} ms"),
        format!(
            "{} ms (p50 {} ms, max {} ms, {} requests, {failed} unanswered)",
            fmt(hp99),
            fmt(percentile(lat(), 50.0)),
            fmt(percentile(lat(), 100.0)),
            heavy_polls.len()
        ),
        hp99.map(|m| m < HEALTHZ_P99_MS && failed == 0),
    );
    let deltas = counter_deltas(first, last);
    let lost = rows_lost(&last.health).saturating_sub(rows_lost(&first.health));
    let by: Vec<String> = ROW_LOSSES
        .iter()
        .map(|p| {
            let d = at(&last.health, p).map(|l| l - at(&first.health, p).unwrap_or(0.0));
            format!("{p} +{}", d.map_or("n/a".into(), |d| d.to_string()))
        })
        .collect();
    row(
        "rows dropped",
        "0".into(),
        format!("{lost} ({})", by.join(", ")),
        Some(lost == 0),
    );
    let steps: Vec<f64> = s
        .samples
        .windows(2)
        .map(|w| cpu_pct(&w[0], &w[1]))
        .collect();
    row(
        "daemon CPU (user + system), mean over the soak",
        "reported".into(),
        format!(
            "{:.1} % of one CPU (per 10 s: p50 {} %, max {} %)",
            cpu_pct(first, last),
            fmt(percentile(steps.iter().copied(), 50.0)),
            fmt(percentile(steps.iter().copied(), 100.0)),
        ),
        None,
    );
    // The process table's reads of `/proc/PID/maps` (issue 26): what fails
    // is a process that exits as it is read; a process whose exit the
    // table applied before its read was due is not read at all.
    let table_delta = |k: &str| {
        let path = format!("pipeline.processes.{k}");
        at(&last.health, &path).unwrap_or(0.0) - at(&first.health, &path).unwrap_or(0.0)
    };
    let (reads, failed) = (table_delta("maps_reads"), table_delta("maps_read_failures"));
    row(
        "process table: maps reads, failed, not made (already exited)",
        "reported".into(),
        format!(
            "{reads:.0} reads, {failed:.0} failed ({:.1} %), {:.0} not made; {:.0} execs, {:.0} exits",
            100.0 * failed / reads.max(1.0),
            table_delta("maps_reads_skipped"),
            table_delta("execs"),
            table_delta("exits"),
        ),
        None,
    );
    writeln!(
        out,
        "\n## Acceptance\n\n{}",
        table(&["figure", "target", "measured", "verdict"], &rows)
    )?;
    out += &by_minute(s);
    out += &heavy(s);
    out += &coverage(s);
    out += &counters(&deltas);
    Ok(out)
}

fn fmt(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.1}"))
}

/// How the run was made.
fn setup(s: &Soak, retention: f64) -> Result<String> {
    let (date, kernel, load) = common::system()?;
    let cpus = std::thread::available_parallelism()?.get();
    let mut out = String::from("# Soak\n\n");
    if s.minutes < FULL_MINUTES {
        writeln!(
            out,
            "**Shortened run: {} min instead of {FULL_MINUTES}** (`WS_SOAK_MINUTES`); the \
             steady-RSS figure needs {:.0} min, the history one more than 10, and the \
             others are not final figures.\n",
            s.minutes,
            (retention + STEADY_WINDOW_S) / 60.0
        )?;
    }
    let busy = s.host_cpu.0 as f64 / s.host_cpu.1.max(1) as f64 * 100.0;
    let (spawned, failed) = s.spawned;
    let loads: Vec<f64> = s.samples.iter().map(|x| x.load[0]).collect();
    let attacks: Vec<String> = ATTACKS
        .iter()
        .map(|(n, a)| format!("`{n} {}`", a.join(" ")))
        .collect();
    writeln!(
        out,
        "- date: {date}\n- kernel: {kernel}\n- CPUs: {cpus}\n\
         - duration: {:.1} min (`WS_SOAK_MINUTES={}`), daemon `wallscope serve` (release) \
         with its defaults (retention {retention:.0} s), started after the load\n\
         - load: `soak_threads {THREADS}` (pid {}: {THREADS} threads on 64 KiB stacks, each \
         sleeping 200–300 ms then ~1 µs of work); `soak_spawner {SPAWN_RATE}` ({spawned} \
         `/bin/true` spawned, {:.1} a second, {failed} failed); `java {}` `SoakJvm` (pid {}: \
         16 workers, 200 tasks a second); `perf {}` back to back ({} runs, {} failed); \
         `cargo clean` + `cargo build -j 2` of a crate depending on regex and serde_json \
         in a loop ({} builds, {} failed); as `nobody`: {}\n\
         - host load while it ran: 1-min load average p50 {} / max {} (at the end: {load}); \
         CPU {busy:.0} % busy, {:.0} forks a second (all processes)\n\
         - sampling: RSS, CPU time, load average and `/healthz` every 10 s; `/healthz` \
         polled every 50 ms for its latency; every minute `/threads?pid=…&seconds=600`'s \
         `x-wallscope-recorded-seconds`; every {HEAVY_EVERY_S:.0} s the heavy queries {}",
        s.secs / 60.0,
        s.minutes,
        s.threads_pid,
        spawned as f64 / s.secs,
        JVM_FLAGS.join(" "),
        s.jvm_pid,
        MESSAGING.join(" "),
        s.messaging.0,
        s.messaging.1,
        s.cargo.0,
        s.cargo.1,
        attacks.join(", "),
        fmt(percentile(loads.iter().copied(), 50.0)),
        fmt(percentile(loads.iter().copied(), 100.0)),
        s.host_forks as f64 / s.secs,
        HEAVY_QUERIES.map(|q| format!("`{q}`")).join(" then "),
    )?;
    Ok(out)
}

/// Holders of `/healthz` `memory.holders` (the shared contract), in MB,
/// `n/a` while the daemon does not report them.
fn holders(health: &Value) -> String {
    let Some(list) = health["memory"]["holders"].as_array() else {
        return "n/a".into();
    };
    let one = |h: &Value| {
        let name = h["name"].as_str().unwrap_or("?");
        let mb = h["bytes"]
            .as_f64()
            .map_or("n/a".into(), |b| format!("{:.1}", b / 1e6));
        format!("{name} {mb}")
    };
    let mut parts: Vec<String> = list.iter().map(one).collect();
    if let Some(u) = health["memory"]["unaccounted_bytes"].as_f64() {
        parts.push(format!("unaccounted {:.1}", u / 1e6));
    }
    parts.join(", ")
}

/// The sample closest to each minute, with the daemon's CPU and the
/// `/healthz` latency over the minute before it.
fn by_minute(s: &Soak) -> String {
    let mut rows = Vec::new();
    let mut previous: Option<&Sample> = None;
    let base = s.samples.first().map_or(0, |x| rows_lost(&x.health));
    for minute in 0..=(s.secs / 60.0).round() as u64 {
        let target = minute as f64 * 60.0;
        let near = s
            .samples
            .iter()
            .min_by(|a, b| (a.at - target).abs().total_cmp(&(b.at - target).abs()));
        let Some(x) = near.filter(|x| (x.at - target).abs() < 6.0) else {
            continue;
        };
        let h = &x.health;
        let ms = |path: &str| at(h, path).map_or("n/a".into(), |u| format!("{:.1}", u / 1e3));
        let cpu = previous.map_or("".into(), |a| format!("{:.1}", cpu_pct(a, x)));
        let lat: Vec<f64> = s
            .polls
            .polls
            .iter()
            .filter(|p| p.at > target - 60.0 && p.at <= target)
            .map(|p| p.latency_ms)
            .collect();
        let recorded = s
            .recorded
            .iter()
            .filter(|(at, _)| (at - target).abs() < 10.0)
            .map(|(_, r)| r.as_ref().map_or("error".into(), |n| n.to_string()))
            .next()
            .unwrap_or_default();
        rows.push(vec![
            minute.to_string(),
            format!("{:.1}", mb(x.rss_kib)),
            holders(h),
            at(h, "store.history_s").map_or("n/a".into(), |v| v.to_string()),
            recorded,
            format!(
                "{} / {} / {}",
                ms("pipeline.drain_us_p50"),
                ms("pipeline.drain_us_p99"),
                ms("pipeline.max_drain_us")
            ),
            format!(
                "{} / {}",
                fmt(percentile(lat.iter().copied(), 50.0)),
                fmt(percentile(lat.iter().copied(), 99.0))
            ),
            cpu,
            format!("{:.2}", x.load[0]),
            if h.is_null() {
                "n/a".into()
            } else {
                (rows_lost(h).saturating_sub(base)).to_string()
            },
        ]);
        previous = Some(x);
    }
    let header = [
        "minute",
        "RSS MB",
        "by holder MB (`memory.holders`)",
        "history s",
        "600 s window: recorded s",
        "drain p50 / p99 / max ms",
        "`/healthz` p50 / p99 ms (last min)",
        "CPU % (last min)",
        "load 1 min",
        "rows dropped (total)",
    ];
    format!("\n## Daemon by minute\n\n{}", table(&header, &rows))
}

fn heavy(s: &Soak) -> String {
    let mut rows = Vec::new();
    for h in &s.heavy {
        let during = || {
            s.polls
                .polls
                .iter()
                .filter(|p| p.at >= h.started && p.at <= h.started + h.secs)
        };
        let ms = || during().map(|p| p.latency_ms);
        let counts: Vec<u64> = during().filter_map(|p| p.drains).collect();
        let drains = counts.last().zip(counts.first()).map_or(0, |(b, a)| b - a);
        let outcomes: Vec<String> = h
            .outcomes
            .iter()
            .map(|(secs, o)| match o {
                Ok((status, bytes)) => {
                    format!("{status}, {:.1} MB in {secs:.2} s", *bytes as f64 / 1e6)
                }
                Err(e) => format!("{e} after {secs:.2} s"),
            })
            .collect();
        rows.push(vec![
            format!("{:.0}", h.started),
            format!("{:.2}", h.secs),
            outcomes.join("; "),
            h.lines.to_string(),
            during().count().to_string(),
            format!(
                "{} / {} / {}",
                fmt(percentile(ms(), 50.0)),
                fmt(percentile(ms(), 99.0)),
                fmt(percentile(ms(), 100.0))
            ),
            drains.to_string(),
        ]);
    }
    let header = [
        "started at s",
        "took s",
        "answers (folded; flame graph)",
        "folded lines",
        "`/healthz` requests",
        "`/healthz` p50 / p99 / max ms",
        "drains",
    ];
    format!(
        "\n## Heavy queries {}\n\n{}",
        HEAVY_QUERIES.map(|q| format!("`{q}`")).join(", "),
        table(&header, &rows)
    )
}

fn coverage(s: &Soak) -> String {
    let rows: Vec<Vec<String>> = s
        .coverage
        .iter()
        .map(|c| match c {
            Ok(c) => vec![
                format!("{:.0}", c.at),
                c.threads.to_string(),
                format!("{:.1}", c.threads_wall_us as f64 / 1e6),
                format!("{:.1}", c.folded_us as f64 / 1e6),
                format!("{:.4}", c.ratio()),
            ],
            Err(e) => vec!["error".into(), e.clone(), "".into(), "".into(), "".into()],
        })
        .collect();
    let header = [
        "at s",
        "threads",
        "thread wall s (`/threads`)",
        "profile s (`/folded`)",
        "ratio",
    ];
    format!(
        "\n## The {THREADS}-thread process, last {COVERAGE_SECONDS} s, every minute\n\n\
         `/threads` sums BPF's per-thread totals; the `kind=wall` profile is built from the \
         stack rows, so rows dropped (a full counts map) lower the ratio. Expected wall \
         time: threads × {COVERAGE_SECONDS} s.\n\n{}",
        table(&header, &rows)
    )
}

/// `(start, end, delta)` of every loss or merge counter, by path.
fn counter_deltas(first: &Sample, last: &Sample) -> BTreeMap<String, (u64, u64, u64)> {
    let start: BTreeMap<String, u64> = loss_counters(&first.health).into_iter().collect();
    let end = loss_counters(&last.health);
    let delta = |(k, v): (String, u64)| {
        let s = start.get(&k).copied().unwrap_or(0);
        (k, (s, v, v.saturating_sub(s)))
    };
    end.into_iter().map(delta).collect()
}

fn counters(deltas: &BTreeMap<String, (u64, u64, u64)>) -> String {
    let rows: Vec<Vec<String>> = deltas
        .iter()
        .map(|(k, (a, b, d))| {
            vec![
                format!("`{k}`"),
                a.to_string(),
                b.to_string(),
                d.to_string(),
            ]
        })
        .collect();
    format!(
        "\n## Loss, drop, merge and eviction counters (`/healthz`, host-wide)\n\n\
         From the first sample (daemon just started) to the last.\n\n{}",
        table(&["counter", "first", "last", "change"], &rows)
    )
}
