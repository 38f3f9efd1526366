//! The cost bench's report: the scenarios side by side against issue #40's
//! goals (PASS/FAIL for the busy host with the hostile mix), the daemon's
//! CPU by thread in each, and the side-by-side part's section.

use crate::common::{percentile, system, table, verdict};
use crate::measure::Window;
use crate::Scenario;
use anyhow::Result;
use std::collections::BTreeMap;

/// Issue #40's goals with the hostile mix running (no merged drain at
/// all).
pub const MAX_CPU_PCT: f64 = 2.0;
pub const MAX_RSS_MB: f64 = 100.0;
pub const MAX_SYMBOLIZE_P99_MS: f64 = 200.0;

/// The run's facts for the header.
pub struct Setup {
    pub seconds: u64,
    pub warmup_s: u64,
    pub daemon: String,
}

/// The host scenarios' section: header, goals table, CPU by thread.
pub fn render(setup: &Setup, scenarios: &[Scenario]) -> Result<String> {
    let (date, kernel, load) = system()?;
    let cpus = std::thread::available_parallelism()?.get();
    let mut out = format!(
        "# Cost on a quiet, a busy and a hostile host (`cargo bench --bench cost`)\n\n\
         - date: {date}\n- kernel: {kernel}\n- CPUs: {cpus}\n- load average at the end: {load}\n\
         - daemon: `{}` with its default flags (99 Hz, off-CPU on), started anew for each \
         scenario; measured for {} s per scenario (`COST_BENCH_SECONDS`, the issue's run is 300) \
         after 3 drains and {} s more\n\
         - CPU: utime + stime of `/proc/PID/stat` over the window (by thread from \
         `/proc/PID/task/*/stat` every 5 s); RSS: VmRSS every 5 s (median), VmHWM at the end; \
         `/healthz` read once a second (its cost is in the daemon's figures)\n\
         - symbolize: each batch's `last_symbolize_us` when `/healthz` shows \
         `symbolized_batches` moved on by one (exact), else the mean of the batches it missed \
         (from `symbolize_us_total`)\n",
        setup.daemon, setup.seconds, setup.warmup_s
    );
    if setup.seconds < 300 {
        out += &format!(
            "- **A short run ({} s per scenario, not the issue's 300 s)**\n",
            setup.seconds
        );
    }
    for s in scenarios {
        out += &format!("- {}: {}\n", s.name, s.load.join("; "));
    }
    out += "\nThe host is shared with other work that the bench does not control (the \
            host's busy CPUs are in the table): figures of one run are noisy.\n\n";
    out += &goals(scenarios);
    out += &by_thread(scenarios);
    Ok(out)
}

/// A figure of each scenario, the goal and the hostile scenario's verdict.
fn goals(scenarios: &[Scenario]) -> String {
    let mut header = vec!["figure".to_string()];
    header.extend(scenarios.iter().map(|s| s.name.clone()));
    header.extend(["goal (hostile)".into(), "verdict".into()]);
    let hostile = scenarios.last().map(|s| &s.window);
    let p99 = |w: &Window| {
        let h = w.health.as_ref()?;
        percentile(h.symbolize_ms.iter().copied(), 99.0)
    };
    type Figure<'a> = (
        &'a str,
        Box<dyn Fn(&Window) -> String>,
        String,
        Option<bool>,
    );
    let figures: Vec<Figure> = vec![
        (
            "daemon CPU, % of one CPU",
            Box::new(|w: &Window| format!("{:.2}", w.cpu_pct())),
            format!("≤ {MAX_CPU_PCT}"),
            hostile.map(|w| w.cpu_pct() <= MAX_CPU_PCT),
        ),
        (
            "RSS, MB (median VmRSS)",
            Box::new(|w: &Window| format!("{:.1}", w.rss_mb())),
            format!("≤ {MAX_RSS_MB}"),
            hostile.map(|w| w.rss_mb() <= MAX_RSS_MB),
        ),
        (
            "RSS at the end / VmHWM, MB",
            Box::new(|w: &Window| {
                let end = w.rss_kib.last().copied().unwrap_or(0) as f64 / 1024.0;
                format!("{end:.1} / {:.1}", w.hwm_mb())
            }),
            String::new(),
            None,
        ),
        (
            "drains (merged, dropped)",
            Box::new(|w: &Window| match &w.health {
                Some(h) => format!("{} ({}, {})", h.drains, h.merged, h.dropped),
                None => "n/a".into(),
            }),
            "0 merged".to_string(),
            hostile.and_then(|w| Some(w.health.as_ref()?.merged == 0)),
        ),
        (
            "symbolize p50 / p99 / max, ms",
            Box::new(move |w: &Window| {
                let Some(h) = &w.health else {
                    return "n/a".into();
                };
                let v = |p: f64| percentile(h.symbolize_ms.iter().copied(), p).unwrap_or(f64::NAN);
                format!("{:.1} / {:.1} / {:.1}", v(50.0), v(99.0), v(100.0))
            }),
            format!("p99 ≤ {MAX_SYMBOLIZE_P99_MS}"),
            hostile.and_then(|w| Some(p99(w)? <= MAX_SYMBOLIZE_P99_MS)),
        ),
        (
            "symbolized batches (exact)",
            Box::new(|w: &Window| match &w.health {
                Some(h) => format!("{} ({})", h.symbolize_ms.len(), h.exact),
                None => "n/a".into(),
            }),
            String::new(),
            None,
        ),
        (
            "host CPUs busy (all processes)",
            Box::new(|w: &Window| format!("{:.2}", w.host_busy)),
            String::new(),
            None,
        ),
        (
            "load average (1 min) at the end",
            Box::new(|w: &Window| format!("{:.1}", w.load_end[0])),
            String::new(),
            None,
        ),
    ];
    let rows: Vec<Vec<String>> = figures
        .iter()
        .map(|(name, value, goal, ok)| {
            let mut row = vec![name.to_string()];
            row.extend(scenarios.iter().map(|s| value(&s.window)));
            let ok = if goal.is_empty() {
                "".into()
            } else {
                verdict(*ok).to_string()
            };
            row.extend([goal.clone(), ok]);
            row
        })
        .collect();
    format!("## Figures and goals\n\n{}", table(&header, &rows))
}

/// The daemon's CPU by thread name in each scenario, % of one CPU.
fn by_thread(scenarios: &[Scenario]) -> String {
    let mut names: BTreeMap<&str, f64> = BTreeMap::new();
    for s in scenarios {
        for (name, cpu) in &s.window.by_thread {
            *names.entry(name.as_str()).or_default() += cpu;
        }
    }
    let mut order: Vec<(&str, f64)> = names.into_iter().collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let pct = |w: &Window, cpu: f64| format!("{:.2}", cpu / w.secs * 100.0);
    let mut rows: Vec<Vec<String>> = order
        .iter()
        .filter(|(_, cpu)| *cpu > 0.0)
        .map(|(name, _)| {
            let mut row = vec![format!("`{name}`")];
            row.extend(scenarios.iter().map(|s| {
                let cpu = s.window.by_thread.iter().find(|(n, _)| n.as_str() == *name);
                pct(&s.window, cpu.map_or(0.0, |c| c.1))
            }));
            row
        })
        .collect();
    let mut exited = vec!["threads that exited between samples".to_string()];
    exited.extend(scenarios.iter().map(|s| {
        let seen: f64 = s.window.by_thread.iter().map(|c| c.1).sum();
        pct(&s.window, (s.window.cpu_s - seen).max(0.0))
    }));
    rows.push(exited);
    let mut header = vec!["thread".to_string()];
    header.extend(scenarios.iter().map(|s| s.name.clone()));
    format!(
        "\n## Daemon CPU by thread name, % of one CPU\n\n{}",
        table(&header, &rows)
    )
}
