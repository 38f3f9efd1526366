//! The history bench's report: how the run was made (on a shared host:
//! its load average), the issue #39 figures with PASS/FAIL against its
//! goals, each long-lived process's history check, the store's `/healthz`
//! figures, the daemon's CPU by thread name and the latency queries.

use crate::common::{self, median, percentile, table, verdict};
use crate::load::LONG_LIVED;
use crate::probe::{tolerance_s, Held, LATENCY_SECONDS};
use crate::{Run, FULL_SECONDS, TAIL_S, WINDOW_TWELFTHS};
use anyhow::Result;
use serde_json::Value;
use std::fmt::Write as _;

/// The `/healthz` paths each figure is read from, first present first:
/// the store's redesign (issue #39) adds and renames fields, so adjust
/// them here. An absent one prints `n/a`.
pub struct Field {
    pub name: &'static str,
    pub paths: &'static [&'static str],
}

pub const MEMORY_BYTES: Field = Field {
    name: "store bytes in memory",
    paths: &["store.bytes"],
};
pub const MEMORY_ROWS: Field = Field {
    name: "stack rows in memory",
    paths: &["store.stack_rows", "store.rows"],
};
pub const MEMORY_THREAD_S: Field = Field {
    name: "thread-seconds in memory",
    paths: &["store.thread_seconds"],
};
pub const HISTORY_S: Field = Field {
    name: "history held in memory, s",
    paths: &["store.history_s"],
};
pub const DISK_BYTES: Field = Field {
    name: "history bytes on disk",
    paths: &["history.bytes", "history.disk_bytes", "store.history.bytes"],
};
pub const DISK_SECONDS: Field = Field {
    name: "history held on disk, s",
    paths: &["history.seconds", "history.disk_s", "store.history.seconds"],
};
pub const DISK_ROWS: Field = Field {
    name: "stack rows on disk",
    paths: &["history.rows", "history.stack_rows", "store.history.rows"],
};
/// Counters that grow when history is shed, folded or evicted (and the
/// slices held with folded stack rows, 0 at the start): they must not in
/// the default variant.
pub const LOSSES: [Field; 5] = [
    Field {
        name: "slices held with folded stack rows",
        paths: &["store.folded_slices"],
    },
    Field {
        name: "rows shed (fair share)",
        paths: &["store.shed_rows"],
    },
    Field {
        name: "process parts folded into pools",
        paths: &["store.folded_parts"],
    },
    Field {
        name: "slices evicted",
        paths: &["store.evicted_slices"],
    },
    Field {
        name: "rows evicted",
        paths: &["store.evicted_rows"],
    },
];
/// Figures reported as they are (first, last, change).
pub const OTHERS: [Field; 4] = [
    Field {
        name: "slices merged (tiers)",
        paths: &["store.compacted_slices"],
    },
    Field {
        name: "names bytes",
        paths: &["store.name_bytes"],
    },
    Field {
        name: "disk write errors",
        paths: &["history.write_errors", "store.history.write_errors"],
    },
    Field {
        name: "torn blocks skipped",
        paths: &["history.torn_blocks", "store.history.torn_blocks"],
    },
];
/// Goals (issue #39).
const RSS_STEADY_MB: f64 = 100.0;
const RSS_PEAK_MB: f64 = 150.0;
const LATENCY_P99_MS: f64 = 500.0;
/// Processes of at least this many threads may be folded into pools.
pub const FOLDABLE_THREADS: usize = 1000;

impl Field {
    /// The first of the paths present in `health`, and its value.
    pub fn read(&self, health: &Value) -> Option<(&'static str, f64)> {
        self.paths.iter().find_map(|p| {
            let v = p.split('.').try_fold(health, |v, k| v.get(k))?;
            Some((*p, v.as_f64()?))
        })
    }
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// `a / b`, `None` unless both are known and `b` > 0.
fn per(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    a.zip(b.filter(|b| *b > 0.0)).map(|(a, b)| a / b)
}

pub fn render(r: &Run) -> Result<String> {
    let first = r.samples.first().map_or(&Value::Null, |s| &s.health);
    let last = r.samples.last().map_or(&Value::Null, |s| &s.health);
    let mut out = setup(r, last)?;
    let mut rows = Vec::new();
    let mut row = |figure: &str, goal: &str, measured: String, ok: Option<bool>| {
        println!("{:<4} {figure}: {measured} (goal {goal})", verdict(ok));
        let cells = [figure, goal, &measured, verdict(ok)];
        rows.push(cells.map(String::from).to_vec());
    };
    let window_s = r.window.1 - r.window.0;
    for (when, held) in [
        ("once it closed", &r.held_closed),
        ("at the end", &r.held_end),
    ] {
        let ok = held.iter().filter(|h| h.ok(window_s)).count();
        let bad: Vec<String> = held
            .iter()
            .filter(|h| !h.ok(window_s))
            .map(|h| format!("{} ({})", h.command.split(' ').next().unwrap_or(""), h.pid))
            .collect();
        row(
            &format!("whole window held per thread, {when}"),
            "every process < 1,000 threads",
            format!(
                "{ok} of {} processes{}",
                held.len(),
                if bad.is_empty() {
                    String::new()
                } else {
                    format!("; not: {}", bad.join(", "))
                }
            ),
            (!held.is_empty()).then_some(ok == held.len()),
        );
    }
    let lost: Vec<(String, Option<f64>)> = LOSSES
        .iter()
        .map(|f| {
            let d = f
                .read(last)
                .map(|(_, l)| l - f.read(first).map_or(0.0, |v| v.1));
            (f.name.to_string(), d)
        })
        .collect();
    let total: f64 = lost.iter().filter_map(|l| l.1).sum();
    let text: Vec<String> = lost
        .iter()
        .map(|(n, d)| format!("{n} +{}", fmt(*d, 0)))
        .collect();
    row(
        "history shed, folded or evicted during the run",
        "0",
        text.join(", "),
        // The variant's big process may be folded and shed.
        r.many.is_none().then_some(total == 0.0),
    );
    let tail_s = (TAIL_S * r.seconds / FULL_SECONDS) as f64;
    let steady = median(
        r.rss
            .iter()
            // From the last sample back: a short run's tail may hold no
            // sample before its end checks.
            .filter(|x| x.0 >= r.rss.last().map_or(0.0, |l| l.0) - tail_s)
            .map(|x| mb(x.1)),
    );
    row(
        &format!("RSS steady (median VmRSS of the last {tail_s:.0} s)"),
        "< 100 MB",
        format!("{} MB", fmt(steady, 1)),
        steady.map(|s| s < RSS_STEADY_MB),
    );
    let peak = mb(r.hwm_kib);
    row(
        "RSS peak (VmHWM)",
        "< 150 MB",
        format!("{peak:.1} MB"),
        Some(peak < RSS_PEAK_MB),
    );
    let ms: Vec<f64> = r
        .latency
        .iter()
        .filter_map(|l| l.1.as_ref().ok())
        .map(|a| a.0)
        .collect();
    let failed = r
        .latency
        .iter()
        .filter(|l| !matches!(l.1, Ok((_, 200))))
        .count();
    let p99 = percentile(ms.iter().copied(), 99.0);
    row(
        &format!("`/threads?pid=P&seconds={LATENCY_SECONDS}` latency"),
        "p99 < 500 ms",
        format!(
            "p50 {} / p99 {} / max {} ms ({} queries, {failed} failed)",
            fmt(percentile(ms.iter().copied(), 50.0), 1),
            fmt(p99, 1),
            fmt(percentile(ms.iter().copied(), 100.0), 1),
            r.latency.len()
        ),
        p99.map(|p| p < LATENCY_P99_MS && failed == 0),
    );
    let mem = MEMORY_BYTES.read(last).map(|v| v.1);
    let mem_ts = MEMORY_THREAD_S
        .read(last)
        .map(|v| v.1)
        .or(r.memory_thread_s);
    let mem_rows = MEMORY_ROWS.read(last).map(|v| v.1);
    row(
        "bytes per thread-second, in memory",
        "reported",
        format!(
            "{} ({} B / {} thread-s)",
            fmt(per(mem, mem_ts), 1),
            fmt(mem, 0),
            fmt(mem_ts, 0)
        ),
        None,
    );
    row(
        "bytes per stack row, in memory",
        "reported",
        format!("{} ({} rows)", fmt(per(mem, mem_rows), 1), fmt(mem_rows, 0)),
        None,
    );
    let disk = r
        .disk_bytes
        .map(|b| b as f64)
        .or(DISK_BYTES.read(last).map(|v| v.1));
    let disk_s = DISK_SECONDS.read(last).map(|v| v.1);
    // Thread-seconds recorded over the seconds the disk holds (the whole
    // run while it does not say).
    let since = disk_s.map_or(0.0, |d| r.secs - d);
    let disk_ts: f64 = r
        .samples
        .iter()
        .filter(|s| s.at > since)
        .filter_map(|s| s.thread_s)
        .sum();
    let disk_rows = DISK_ROWS.read(last).map(|v| v.1);
    row(
        "bytes per thread-second, on disk",
        "reported",
        format!(
            "{} ({} B / {disk_ts:.0} thread-s recorded over {})",
            fmt(per(disk, Some(disk_ts)), 1),
            fmt(disk, 0),
            disk_s.map_or("the run".into(), |d| format!("the {d:.0} s on disk")),
        ),
        None,
    );
    row(
        "bytes per stack row, on disk",
        "reported",
        format!(
            "{} ({} rows)",
            fmt(per(disk, disk_rows), 1),
            fmt(disk_rows, 0)
        ),
        None,
    );
    let cpu = |names: &[&str]| {
        let pct = |(n, s): &(String, f64)| {
            names
                .contains(&n.as_str())
                .then(|| format!("{n} {:.1} %", s / r.secs * 100.0))
        };
        let found: Vec<String> = r.cpu.iter().filter_map(pct).collect();
        if found.is_empty() {
            "n/a".into()
        } else {
            found.join(", ")
        }
    };
    row(
        "CPU of the store (pushed on ws-symbolize) and disk writer (ws-history)",
        "reported",
        format!("{} of one CPU", cpu(&["ws-symbolize", "ws-history"])),
        None,
    );
    writeln!(
        out,
        "\n## Acceptance (issue #39)\n\n{}",
        table(&["figure", "goal", "measured", "verdict"], &rows)
    )?;
    out += &held_tables(r);
    out += &store_fields(first, last);
    out += &cpu_table(r);
    out += &latency_table(r);
    out += &rss_by_minute(r);
    Ok(out)
}

/// How the run was made.
fn setup(r: &Run, last: &Value) -> Result<String> {
    let (date, kernel, _) = common::system()?;
    let cpus = std::thread::available_parallelism()?.get();
    let mut out = match r.many {
        None => "# History on a busy, churning host (issue #39)\n\n".to_string(),
        Some(n) => {
            format!("# History on a busy, churning host, with {n} sleeping threads (issue #39)\n\n")
        }
    };
    if r.seconds < FULL_SECONDS {
        writeln!(
            out,
            "**Shortened run: {} s instead of {FULL_SECONDS}** (`HISTORY_BENCH_SECONDS`): the \
             windows are scaled to it and the figures are not final.\n",
            r.seconds
        )?;
    }
    let load = |l: [f64; 3]| format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2]);
    let threads: usize = r.procs.iter().map(|p| p.threads).sum();
    let daemon = if r.daemon_args.is_empty() {
        "no `--history-dir` (this build's `serve --help` does not list it)".to_string()
    } else {
        format!(
            "`{}` (a fresh temporary directory)",
            r.daemon_args.join(" ")
        )
    };
    writeln!(
        out,
        "- date: {date}\n- kernel: {kernel}\n- CPUs: {cpus}\n\
         - **shared host**: other sessions' builds and tests ran on it meanwhile; load average \
         (1, 5, 15 min) at the start {}, at the end {}\n\
         - duration: {:.0} s (`HISTORY_BENCH_SECONDS={}`)\n\
         - daemon: `wallscope serve` (release) with its default flags (retention {} s), \
         {daemon}, started after the load\n\
         - load: {} long-lived processes, {threads} threads when the run started; \
         {} processes forked on the host over the run ({:.1} a second):",
        load(r.load_start),
        load(r.load_end),
        r.secs,
        r.seconds,
        last["retention_s"],
        r.procs.len(),
        r.host_forks,
        r.host_forks as f64 / r.secs.max(1.0),
    )?;
    for p in &r.procs {
        writeln!(
            out,
            "  - `{}` (pid {}, {} threads): {}",
            p.command, p.pid, p.threads, p.what
        )?;
    }
    let (a, b) = r.window_at;
    writeln!(
        out,
        "- checked window: from {a} s to {b} s after the start (`from={}&until={}`, {} s: \
         minutes {}-{} of the full run), checked {} s after it closed and at the end; a \
         thread's wall time must be within {:.0} s of the window (1 %, at least 2 s); \
         processes of {FOLDABLE_THREADS} threads or more are not checked (the issue lets \
         them be folded into pools)",
        r.window.0,
        r.window.1,
        r.window.1 - r.window.0,
        WINDOW_TWELFTHS.0,
        WINDOW_TWELFTHS.1,
        crate::CLOSE_DELAY_S,
        tolerance_s(r.window.1 - r.window.0),
    )?;
    debug_assert_eq!(LONG_LIVED.len() + r.many.map_or(0, |_| 1), r.procs.len());
    Ok(out)
}

/// Each long-lived process's check, once the window closed and at the end.
fn held_tables(r: &Run) -> String {
    let window_s = r.window.1 - r.window.0;
    let mut out = String::new();
    for (when, held) in [
        ("once it closed", &r.held_closed),
        ("at the end", &r.held_end),
    ] {
        let one = |h: &Held| {
            let off: Vec<String> = h
                .off
                .iter()
                .take(3)
                .map(|(t, s)| format!("{t}: {s:.1} s"))
                .collect();
            vec![
                format!("`{}` ({})", h.command, h.pid),
                format!("{} / {}", h.whole, h.expected),
                if off.is_empty() {
                    "-".into()
                } else {
                    format!("{} ({})", h.off.len(), off.join(", "))
                },
                h.missing.to_string(),
                format!("{} / {}", h.folded_threads, h.folded_lines),
                h.recorded.map_or("n/a".into(), |s| s.to_string()),
                h.resolution.clone().unwrap_or_else(|| "n/a".into()),
                h.error
                    .clone()
                    .unwrap_or_else(|| verdict(Some(h.ok(window_s))).into()),
            ]
        };
        let rows: Vec<Vec<String>> = held.iter().map(one).collect();
        let header = [
            "process",
            "threads whole",
            "wall off",
            "missing",
            "`(folded)` threads / lines",
            "recorded s",
            "`x-wallscope-resolution`",
            "verdict",
        ];
        let _ = write!(
            out,
            "\n## The window per process, {when}\n\n{}",
            table(&header, &rows)
        );
    }
    out
}

/// Every [`Field`], at the first and last sample and its change.
fn store_fields(first: &Value, last: &Value) -> String {
    let fields = [&MEMORY_BYTES, &MEMORY_ROWS, &MEMORY_THREAD_S, &HISTORY_S]
        .into_iter()
        .chain([&DISK_BYTES, &DISK_SECONDS, &DISK_ROWS])
        .chain(LOSSES.iter())
        .chain(OTHERS.iter());
    let rows: Vec<Vec<String>> = fields
        .map(|f| {
            let (a, b) = (f.read(first), f.read(last));
            vec![
                f.name.to_string(),
                b.or(a)
                    .map_or(f.paths.join(" / "), |v| format!("`{}`", v.0)),
                fmt(a.map(|v| v.1), 0),
                fmt(b.map(|v| v.1), 0),
                fmt(b.map(|v| v.1 - a.map_or(0.0, |a| a.1)), 0),
            ]
        })
        .collect();
    format!(
        "\n## Store figures (`/healthz`, first and last sample)\n\n{}",
        table(&["figure", "field", "first", "last", "change"], &rows)
    )
}

fn cpu_table(r: &Run) -> String {
    let rows: Vec<Vec<String>> = r
        .cpu
        .iter()
        .map(|(name, s)| {
            vec![
                format!("`{name}`"),
                format!("{s:.1}"),
                format!("{:.2}", s / r.secs * 100.0),
            ]
        })
        .collect();
    let total: f64 = r.cpu.iter().map(|c| c.1).sum();
    format!(
        "\n## Daemon CPU by thread name (`/proc/PID/task/*/stat`, utime + stime over the run)\n\n\
         Total {total:.1} s, {:.1} % of one CPU.\n\n{}",
        total / r.secs * 100.0,
        table(&["thread", "CPU s", "% of one CPU"], &rows)
    )
}

fn latency_table(r: &Run) -> String {
    let rows: Vec<Vec<String>> = r
        .latency
        .iter()
        .map(|(at, a)| match a {
            Ok((ms, status)) => vec![format!("{at:.0}"), format!("{ms:.1}"), status.to_string()],
            Err(e) => vec![format!("{at:.0}"), "n/a".into(), e.clone()],
        })
        .collect();
    format!(
        "\n## `/threads?pid={}&seconds={LATENCY_SECONDS}` (`{}`, the most threads under 1,000)\n\n{}",
        r.latency_pid.0,
        r.latency_pid.1,
        table(&["at s", "ms", "status"], &rows)
    )
}

fn rss_by_minute(r: &Run) -> String {
    let rows: Vec<Vec<String>> = r
        .samples
        .iter()
        .filter(|s| s.at as u64 % 60 < 10 || s.at >= r.secs - 1.0)
        .map(|s| {
            let rss = r
                .rss
                .iter()
                .rev()
                .find(|x| x.0 <= s.at + 1.0)
                .map(|x| mb(x.1));
            let mem = MEMORY_BYTES.read(&s.health).map(|v| v.1 / 1e6);
            let held = HISTORY_S.read(&s.health).map(|v| v.1);
            let lost: f64 = LOSSES
                .iter()
                .filter_map(|f| f.read(&s.health))
                .map(|v| v.1)
                .sum();
            vec![
                format!("{:.0}", s.at),
                fmt(rss, 1),
                fmt(mem, 1),
                fmt(held, 0),
                format!("{lost:.0}"),
            ]
        })
        .collect();
    format!(
        "\n## By minute\n\n{}",
        table(
            &[
                "at s",
                "VmRSS MB",
                "store MB",
                "history s",
                "shed + folded + evicted"
            ],
            &rows
        )
    )
}
