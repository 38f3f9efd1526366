//! The soak's markdown report: how the run was made, the acceptance
//! figures with their verdicts, the daemon's RSS and CPU by minute, drain
//! times, the heavy queries, the many-threads process's completeness
//! checks, and every loss or merge counter's change over the run.

use crate::common::{self, table};
use crate::load::{JVM_FLAGS, MESSAGING, SPAWN_RATE, THREADS};
use crate::probe::{loss_counters, Heavy, COVERAGE_SECONDS, HEAVY_QUERY};
use crate::{Sample, Soak, FULL_MINUTES, HEAVY_AT};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;

const RSS_LIMIT_MB: f64 = 100.0;
/// RSS spread allowed over the last [`FLAT_WINDOW_S`], %.
const FLAT_PCT: f64 = 10.0;
const FLAT_WINDOW_S: f64 = 600.0;
const DRAIN_P99_MS: f64 = 50.0;
const HEALTHZ_MS: f64 = 50.0;
/// Drains during a heavy query, per second of it, for "keeps pace" (the
/// daemon drains once a second); one drain of slack for the query's edges.
const PACE: f64 = 0.9;
/// Share of the per-thread wall time the profile must hold.
const MIN_COVERAGE: f64 = 0.99;
/// BPF counters whose increase means rows lost.
const ROW_LOSSES: [&str; 2] = ["lost.counts_map_full", "lost.threads_map_full"];

/// Nearest-rank percentile `p` (0–100) of `values`.
fn percentile(values: impl IntoIterator<Item = f64>, p: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0 * v.len() as f64).ceil() as usize).max(1);
    v.get(rank - 1).copied()
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "n/a",
    }
}

fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Daemon CPU between two samples, % of one CPU.
fn cpu_pct(a: &Sample, b: &Sample) -> f64 {
    (b.cpu_s - a.cpu_s) / (b.at - a.at).max(1e-9) * 100.0
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
        rows.push(vec![figure.into(), target, measured, verdict(ok).into()]);
    };

    let max_rss = s.samples.iter().map(|x| x.rss_kib).max().unwrap_or(0);
    row(
        "daemon RSS (RssAnon + RssFile), max",
        format!("< {RSS_LIMIT_MB} MB"),
        format!("{:.1} MB (first {:.1} MB)", mb(max_rss), mb(first.rss_kib)),
        Some(mb(max_rss) < RSS_LIMIT_MB),
    );
    let from = retention.max(s.secs - FLAT_WINDOW_S);
    let window: Vec<f64> = s
        .samples
        .iter()
        .filter(|x| x.at >= from)
        .map(|x| mb(x.rss_kib))
        .collect();
    let (lo, hi) = window
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(l, h), v| (l.min(*v), h.max(*v)));
    let spread = (hi - lo) / lo * 100.0;
    let long_enough = s.secs >= retention + FLAT_WINDOW_S;
    row(
        "RSS flat: last 10 min after the first retention period, (max − min) / min",
        format!("≤ {FLAT_PCT} %"),
        if window.is_empty() {
            "no sample after the first retention period".into()
        } else {
            format!(
                "{spread:.1} % ({lo:.1}–{hi:.1} MB, {} samples from {from:.0} s)",
                window.len()
            )
        },
        (long_enough && !window.is_empty()).then_some(spread <= FLAT_PCT),
    );
    let drains: Vec<f64> = s.polls.drains.iter().map(|d| d.1 as f64 / 1e3).collect();
    let p99 = percentile(drains.iter().copied(), 99.0);
    let max_drain = last.health["pipeline"]["max_drain_us"]
        .as_f64()
        .map(|u| u / 1e3);
    row(
        "drain p99",
        format!("< {DRAIN_P99_MS} ms"),
        format!(
            "{} ms (p50 {} ms, {} drains timed, {} between polls untimed, max ever {} ms)",
            fmt(p99),
            fmt(percentile(drains.iter().copied(), 50.0)),
            drains.len(),
            s.polls.drains_unseen,
            fmt(max_drain),
        ),
        p99.map(|p| p < DRAIN_P99_MS),
    );
    let heavy_polls: Vec<_> = s.polls.polls.iter().filter(|p| p.heavy).collect();
    let failed = heavy_polls.iter().filter(|p| p.drains.is_none()).count();
    let lat = || heavy_polls.iter().map(|p| p.latency_ms);
    let max_lat = lat().fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    row(
        "`/healthz` during the heavy query, max",
        format!("< {HEALTHZ_MS} ms"),
        format!(
            "{} ms (p99 {} ms, {} requests, {failed} unanswered)",
            fmt(max_lat),
            fmt(percentile(lat(), 99.0)),
            heavy_polls.len()
        ),
        max_lat.map(|m| m < HEALTHZ_MS && failed == 0),
    );
    let paces: Vec<(u64, f64)> = s.heavy.iter().map(|h| drains_during(s, h)).collect();
    let pace_ok = paces.iter().all(|(n, secs)| *n as f64 + 1.0 >= PACE * secs);
    row(
        "drains during the heavy query",
        format!("≥ {PACE} per second"),
        paces
            .iter()
            .map(|(n, secs)| format!("{n} in {secs:.1} s"))
            .collect::<Vec<_>>()
            .join(", "),
        (!paces.is_empty()).then_some(pace_ok),
    );
    let deltas = counter_deltas(first, last);
    let lost: u64 = ROW_LOSSES
        .iter()
        .filter_map(|k| deltas.get(*k))
        .map(|d| d.2)
        .sum();
    let ok_cov: Vec<_> = s.coverage.iter().filter_map(|c| c.as_ref().ok()).collect();
    let min_ratio = ok_cov.iter().map(|c| c.ratio()).reduce(f64::min);
    let min_threads = ok_cov.iter().map(|c| c.threads).min().unwrap_or(0);
    let merged: Vec<String> = deltas
        .iter()
        .filter(|(k, _)| k.contains("merge"))
        .map(|(k, d)| format!("{k} +{}", d.2))
        .collect();
    row(
        "no rows dropped for the 10,000-thread process",
        format!(
            "{} +0; profile ≥ {MIN_COVERAGE} of thread wall time",
            ROW_LOSSES.join(", ")
        ),
        format!(
            "rows lost +{lost}; profile / thread wall time min {} over {} checks \
             ({} failed), ≥ {min_threads} threads seen; merged: {}",
            min_ratio.map_or("n/a".into(), |r| format!("{r:.4}")),
            ok_cov.len(),
            s.coverage.len() - ok_cov.len(),
            if merged.is_empty() {
                "no merge counter in /healthz".into()
            } else {
                merged.join(", ")
            },
        ),
        // Counters are host-wide: rows lost anywhere may be this process's.
        // A failed check (a 404: nothing recorded for the process) fails too.
        (lost > 0 || !s.coverage.is_empty()).then(|| {
            lost == 0
                && ok_cov.len() == s.coverage.len()
                && min_ratio.is_some_and(|r| r >= MIN_COVERAGE)
        }),
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
            "{:.1} % of one CPU ({:.3} CPU-s per second; per 10 s: p50 {} %, max {} %)",
            cpu_pct(first, last),
            cpu_pct(first, last) / 100.0,
            fmt(percentile(steps.iter().copied(), 50.0)),
            fmt(percentile(steps.iter().copied(), 100.0)),
        ),
        None,
    );
    writeln!(
        out,
        "\n## Acceptance\n\n{}",
        table(&["figure", "target", "measured", "verdict"], &rows)
    )?;
    out += &by_minute(s);
    out += &heavy(s, &paces);
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
             flatness figure needs {:.0} min and the others are not final figures.\n",
            s.minutes,
            (retention + FLAT_WINDOW_S) / 60.0
        )?;
    }
    let busy = s.host_cpu.0 as f64 / s.host_cpu.1.max(1) as f64 * 100.0;
    let (spawned, failed) = s.spawned;
    writeln!(
        out,
        "- date: {date}\n- kernel: {kernel}\n- CPUs: {cpus}\n\
         - duration: {:.1} min (`WS_SOAK_MINUTES={}`), daemon `wallscope serve` (release) \
         with its default retention ({retention:.0} s), started after the load\n\
         - load: `soak_threads {THREADS}` (pid {}: {THREADS} threads on 64 KiB stacks, each \
         sleeping 200–300 ms then ~1 µs of work); `soak_spawner {SPAWN_RATE}` ({spawned} \
         `/bin/true` spawned, {:.1} a second, {failed} failed); `java {}` `SoakJvm` (pid {}: \
         16 workers, 200 tasks a second); `perf {}` back to back ({} runs, {} failed)\n\
         - host over the soak: CPU {busy:.0} % busy, {:.0} forks a second (all processes); \
         load average at the end: {load}\n\
         - sampling: RSS, CPU time and `/healthz` every 10 s; `/healthz` polled every \
         250 ms for drain times (each drain's `last_drain_us`, when one drain happened \
         between two polls), every 50 ms during the heavy query \
         (`{HEAVY_QUERY}` at {:?} of the run)",
        s.secs / 60.0,
        s.minutes,
        s.threads_pid,
        spawned as f64 / s.secs,
        JVM_FLAGS.join(" "),
        s.jvm_pid,
        MESSAGING.join(" "),
        s.messaging.0,
        s.messaging.1,
        s.host_forks as f64 / s.secs,
        HEAVY_AT,
    )?;
    Ok(out)
}

/// Drains counted by the poller during `h`, and the query's seconds.
fn drains_during(s: &Soak, h: &Heavy) -> (u64, f64) {
    let during = s
        .polls
        .polls
        .iter()
        .filter(|p| p.at >= h.started && p.at <= h.started + h.secs);
    let counts: Vec<u64> = during.filter_map(|p| p.drains).collect();
    let n = counts.last().zip(counts.first()).map_or(0, |(b, a)| b - a);
    (n, h.secs)
}

/// The sample closest to each minute, with the daemon's CPU over the
/// minute before it.
fn by_minute(s: &Soak) -> String {
    let mut rows = Vec::new();
    let mut previous: Option<&Sample> = None;
    for minute in 0..=(s.secs / 60.0).round() as u64 {
        let target = minute as f64 * 60.0;
        let near = s
            .samples
            .iter()
            .min_by(|a, b| (a.at - target).abs().total_cmp(&(b.at - target).abs()));
        let Some(x) = near.filter(|x| (x.at - target).abs() < 6.0) else {
            continue;
        };
        let p = &x.health["pipeline"];
        let num = |v: &serde_json::Value| v.as_u64().map_or("n/a".into(), |n| n.to_string());
        let cpu = previous.map_or("".into(), |a| format!("{:.1}", cpu_pct(a, x)));
        rows.push(vec![
            format!("{:.0}", x.at / 60.0),
            format!("{:.1}", mb(x.rss_kib)),
            cpu,
            num(&p["drains"]),
            p["last_drain_us"]
                .as_f64()
                .map_or("n/a".into(), |u| format!("{:.1}", u / 1e3)),
            num(&x.health["stacks"]),
            num(&x.health["slices"]),
            num(&p["processes"]["processes"]),
            num(&p["processes"]["images"]),
            p["frame_name_bytes"]
                .as_f64()
                .map_or("n/a".into(), |b| format!("{:.1}", b / 1e6)),
        ]);
        previous = Some(x);
    }
    let header = [
        "minute",
        "RSS MB",
        "CPU % (last min)",
        "drains",
        "last drain ms",
        "stacks",
        "slices",
        "processes",
        "images",
        "frame names MB",
    ];
    format!("\n## Daemon by minute\n\n{}", table(&header, &rows))
}

fn heavy(s: &Soak, paces: &[(u64, f64)]) -> String {
    let mut rows = Vec::new();
    for (h, (drains, _)) in s.heavy.iter().zip(paces) {
        let lat = || {
            s.polls
                .polls
                .iter()
                .filter(|p| p.at >= h.started && p.at <= h.started + h.secs)
        };
        let ms = || lat().map(|p| p.latency_ms);
        let (status, bytes) = match &h.outcome {
            Ok((status, bytes)) => (status.to_string(), format!("{:.1}", *bytes as f64 / 1e6)),
            Err(e) => (e.clone(), "".into()),
        };
        rows.push(vec![
            format!("{:.0}", h.started),
            format!("{:.2}", h.secs),
            status,
            bytes,
            h.lines.to_string(),
            lat().count().to_string(),
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
        "status",
        "MB",
        "lines",
        "`/healthz` requests",
        "`/healthz` p50 / p99 / max ms",
        "drains",
    ];
    format!(
        "\n## Heavy query `{HEAVY_QUERY}`\n\n{}",
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
