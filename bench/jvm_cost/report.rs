//! The markdown report of the cost bench: per side (`--jvm-frames
//! perf-map`, before; `full`, after) the symbolization time per drain and
//! the BPF run time per on-CPU sample and per off-CPU event, then each
//! window, each BPF program, what the daemon showed of the JVM, and how the
//! run was made.

use crate::common::{self, median};
use crate::profile::{JAVA_SUFFIXES, UNNAMED};
use crate::workload::{CodeList, LOOPS, METHODS, PARK_EVERY, PARK_NS, PER_DISPATCHER, THREADS};
use crate::{Frames, Setup, Window, C2_SHARE, COMPILE_TIMEOUT, COUNTERS, SETTLE};
use anyhow::Result;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The on-CPU sampling program.
const ON_CPU: &str = "on_cpu_sample";
/// Prefix of the off-CPU programs: the switch-out (`on_switch`) and the
/// switch-in, where a drawn interval's stack is walked (`on_switched_in`).
const OFF_CPU: &str = "on_switch";

/// A side's windows added up.
struct Totals {
    secs: f64,
    progs: BTreeMap<String, (u64, u64)>,
    counters: BTreeMap<&'static str, u64>,
    symbolize_us: Vec<u64>,
    daemon_cpu_s: f64,
}

impl Totals {
    fn of<'a>(windows: impl IntoIterator<Item = &'a Window>) -> Totals {
        let mut t = Totals {
            secs: 0.0,
            progs: BTreeMap::new(),
            counters: BTreeMap::new(),
            symbolize_us: Vec::new(),
            daemon_cpu_s: 0.0,
        };
        for w in windows {
            t.secs += w.secs;
            t.daemon_cpu_s += w.daemon_cpu_s;
            t.symbolize_us.extend(&w.symbolize_us);
            for (name, (cnt, ns)) in &w.progs {
                let sum = t.progs.entry(name.clone()).or_default();
                sum.0 += cnt;
                sum.1 += ns;
            }
            for (name, v) in &w.counters {
                *t.counters.entry(name).or_default() += v;
            }
        }
        t
    }

    fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// Mean symbolization time per drain, µs.
    fn per_drain_us(&self) -> f64 {
        self.counter(COUNTERS[0]) as f64 / self.counter(COUNTERS[1]) as f64
    }

    /// Runs and ns per run of the programs named `prefix*`; the runs are
    /// those of `events` (the program that fires once per event).
    fn ns_per_event(&self, prefix: &str, events: &str) -> (u64, f64) {
        let runs = self.progs.get(events).map_or(0, |p| p.0);
        let ns: u64 = self
            .progs
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, p)| p.1)
            .sum();
        (runs, ns as f64 / runs as f64)
    }

    /// The figures of the summary and window tables, after a label.
    fn cells(&self) -> Vec<String> {
        let sampled = self.symbolize_us.iter().map(|v| *v as f64);
        let max = self.symbolize_us.iter().max().copied().unwrap_or(0);
        let (samples, per_sample) = self.ns_per_event(ON_CPU, ON_CPU);
        let (switches, per_switch) = self.ns_per_event(OFF_CPU, OFF_CPU);
        vec![
            self.counter(COUNTERS[1]).to_string(),
            format!("{:.0}", self.per_drain_us()),
            median(sampled).map_or("-".into(), |m| format!("{m:.0}")),
            max.to_string(),
            samples.to_string(),
            format!("{per_sample:.0}"),
            switches.to_string(),
            format!("{per_switch:.0}"),
            self.counter(COUNTERS[4]).to_string(),
            format!("{:.1} %", self.daemon_cpu_s / self.secs * 100.0),
        ]
    }
}

const FIGURES: [&str; 10] = [
    "drains",
    "symbolize µs/drain (mean)",
    "last_symbolize_us p50",
    "max",
    "on-CPU samples",
    "BPF ns/sample",
    "context switches",
    "off-CPU BPF ns/switch",
    "off-CPU stack walks",
    "daemon CPU",
];

fn sides(windows: &[Window]) -> Vec<Frames> {
    let mut sides: Vec<Frames> = Vec::new();
    for w in windows {
        if !sides.contains(&w.frames) {
            sides.push(w.frames);
        }
    }
    sides.sort_by_key(|f| *f == Frames::Full);
    sides
}

pub fn render(setup: &Setup, windows: &[Window]) -> Result<String> {
    let (date, kernel, load) = common::system()?;
    let java_version = common::java::java_version(&setup.java)?;
    let cpus = std::thread::available_parallelism()?.get();
    let c = &setup.compiled;
    let mut s = format!(
        "# Java frames: BPF and symbolization cost, before and after\n\n\
         - date: {date}\n- kernel: {kernel}\n- CPUs: {cpus}\n- JVM: {java_version}\n\
         - workload: generated class `Many`, {METHODS} distinct small methods called at \
         random by {THREADS} threads (see How); when measured: {}\n\
         - wallscope: release daemon at its defaults (99 Hz), `--jvm-frames perf-map` \
         (before) and `full` (after), one daemon at a time against the same JVM; \
         {rounds} round(s), the order alternated; each window {window} s\n\
         - `kernel.bpf_stats_enabled` before / after the run: {stats}\n\
         - load average after the run: {load}\n\n",
        code_list(c, Some(setup.compile_s)),
        rounds = setup.rounds,
        window = setup.window_s,
        stats = setup.stats,
    );
    if !setup.has_option {
        s += "**Only the before side was measured**: this daemon has no `--jvm-frames` \
              option (issue #12 is not merged yet), so it names Java frames from the perf \
              map only, as `--jvm-frames perf-map` will. Rerun `cargo bench --bench \
              jvm_cost` on a daemon with the option for the after side.\n\n";
    }

    s += "## Summary\n\n";
    let mut header = vec!["side".to_string()];
    header.extend(FIGURES.iter().map(|f| f.to_string()));
    let sides = sides(windows);
    let totals: Vec<(Frames, Totals)> = sides
        .iter()
        .map(|f| (*f, Totals::of(windows.iter().filter(|w| w.frames == *f))))
        .collect();
    let rows: Vec<Vec<String>> = totals
        .iter()
        .map(|(f, t)| {
            let mut row = vec![format!("{} (`{}`)", f.side(), f.arg())];
            row.extend(t.cells());
            row
        })
        .collect();
    s += &common::table(&header, &rows);
    if let [(_, before), (_, after)] = &totals[..] {
        let ratio = |a: f64, b: f64| format!("{:.2}", a / b);
        let (_, b_sample) = before.ns_per_event(ON_CPU, ON_CPU);
        let (_, a_sample) = after.ns_per_event(ON_CPU, ON_CPU);
        let (_, b_switch) = before.ns_per_event(OFF_CPU, OFF_CPU);
        let (_, a_switch) = after.ns_per_event(OFF_CPU, OFF_CPU);
        let _ = writeln!(
            s,
            "\nAfter / before: symbolization per drain ×{}, BPF per on-CPU sample ×{}, \
             BPF per off-CPU switch ×{}.",
            ratio(after.per_drain_us(), before.per_drain_us()),
            ratio(a_sample, b_sample),
            ratio(a_switch, b_switch),
        );
    }

    s += "\n## Each window\n\n";
    let mut header = vec!["side".to_string(), "round".to_string(), "s".to_string()];
    header.extend(FIGURES.iter().map(|f| f.to_string()));
    header.push("JVM frames named after".into());
    header.push("code cache at the end".into());
    let rows: Vec<Vec<String>> = windows
        .iter()
        .map(|w| {
            let mut row = vec![w.frames.side().into(), w.round.to_string()];
            row.push(format!("{:.1}", w.secs));
            row.extend(Totals::of([w]).cells());
            row.push(format!("{:.1} s", w.named_after_s));
            row.push(code_list(&w.code, None));
            row
        })
        .collect();
    s += &common::table(&header, &rows);

    s += "\n## BPF programs\n\nEvents (`run_cnt`) and `run_time_ns / run_cnt` per program \
          over each side's windows, from `bpftool prog show`.\n\n";
    let mut rows = Vec::new();
    for (f, t) in &totals {
        for (name, (cnt, ns)) in &t.progs {
            let per = if *cnt == 0 {
                "-".to_string()
            } else {
                format!("{:.0}", *ns as f64 / *cnt as f64)
            };
            rows.push(vec![
                f.side().to_string(),
                name.clone(),
                cnt.to_string(),
                per,
            ]);
        }
    }
    s += &common::table(&["side", "program", "events", "ns/event"], &rows);

    s += &jvm_view(windows, &sides);
    s += &how(setup);
    Ok(s)
}

/// `N nmethods in use; M of the methods compiled, K by C2`.
fn code_list(c: &CodeList, after_s: Option<f64>) -> String {
    let took = after_s.map_or(String::new(), |s| format!(" ({s:.0} s after the start)"));
    format!(
        "{} nmethods in use; {} of the {METHODS} methods compiled, {} by C2{took}",
        c.nmethods, c.compiled, c.c2
    )
}

/// What the daemon showed of the JVM in each side's windows: its rows and
/// the kinds of their innermost Java frames.
fn jvm_view(windows: &[Window], sides: &[Frames]) -> String {
    let mut header: Vec<String> = ["side", "rows", "JVM CPU", "of all on-CPU samples"]
        .map(String::from)
        .to_vec();
    header.extend(JAVA_SUFFIXES.iter().map(|k| format!("innermost `{k}`")));
    header.extend(["innermost unnamed".into(), "no Java frame".into()]);
    let mut rows = Vec::new();
    for f in sides {
        let ws: Vec<&Window> = windows.iter().filter(|w| w.frames == *f).collect();
        let total: f64 = ws.iter().map(|w| w.profile.total).sum();
        let java: f64 = ws.iter().map(|w| w.profile.java).sum();
        let kind = |k: &str| -> f64 {
            let w: f64 = ws.iter().filter_map(|w| w.profile.kinds.get(k)).sum();
            // `+ 0.0`: an empty sum is -0.0.
            w / total * 100.0 + 0.0
        };
        // One on-CPU sample is 1/99 s of CPU: the rows' µs in samples.
        let samples: u64 = ws.iter().map(|w| w.counters[COUNTERS[2]]).sum();
        let jvm_samples = total / (1e6 / 99.0);
        let mut row = vec![
            f.side().to_string(),
            ws.iter().map(|w| w.profile.rows).sum::<usize>().to_string(),
            format!("{:.1} CPU-s", total / 1e6),
            format!("{:.0} %", jvm_samples / samples as f64 * 100.0),
        ];
        row.extend(JAVA_SUFFIXES.iter().map(|k| format!("{:.1} %", kind(k))));
        row.push(format!("{:.1} %", kind(UNNAMED)));
        row.push(format!("{:.1} %", (total - java) / total * 100.0));
        rows.push(row);
    }
    format!(
        "\n## The JVM as the daemon showed it\n\n`GET /folded?pid=PID&kind=cpu&seconds=WINDOW` \
         after each window: rows, CPU time, and the share of the JVM's CPU time by the kind \
         of the innermost Java frame (unnamed: `Interpreter` or `[jvm code not in perf \
         map]`).\n\n{}",
        common::table(&header, &rows)
    )
}

fn how(setup: &Setup) -> String {
    format!(
        "\n## How\n\n\
         - JVM (pid {pid}; temporary paths shortened): `{command}`. `Many` has {METHODS} \
         methods `m0`…`m{last}`, each a loop of {lo}–{hi} rounds over a shared helper `mix` \
         (inlined into it) with its own constant; {THREADS} threads call them at random \
         through dispatchers of {PER_DISPATCHER} cases, each too large for HotSpot to compile (over \
         `HugeMethodLimit`), so every call is a real call from an interpreted frame and \
         every method keeps its own compiled code; every {PARK_EVERY} calls a thread parks \
         {park_us} µs (off-CPU events with Java frames). The JIT's defaults otherwise. The \
         bench waits (at most {timeout} s) until `jcmd PID Compiler.codelist` lists \
         compiled code for every method and C2 code for {share:.0} % of them.\n\
         - Each daemon: `wallscope serve --listen 127.0.0.1:PORT --jvm-frames MODE`, \
         started after the previous one stopped; its window starts {settle} s after its \
         `/folded` first names a Java method of the JVM (it attached, had the JVM write \
         its perf map, and read it), and its first drains are left out.\n\
         - BPF cost: `kernel.bpf_stats_enabled=1` for the whole run; each program's \
         `run_cnt` and `run_time_ns` (`bpftool prog show`) at both ends of the window. \
         The programs run for every process on the host, not only the JVM's (the JVM's \
         share of the on-CPU samples is in the last table). BPF ns/sample: \
         `on_cpu_sample` per run. Off-CPU ns/switch: `on_switch` and `on_switched_in` \
         (the switch-out, and the switch-in where a drawn interval's stack is walked) \
         per `on_switch` run. Off-CPU stack walks: `/healthz` \
         `events.offcpu_stack_walks`.\n\
         - Symbolization per drain: `/healthz` `pipeline.symbolize_us_total` over \
         `pipeline.symbolized_batches`, both differenced over the window (a batch is one \
         drain, or several merged when the symbolizer fell behind; its time includes \
         pushing the slice into the store). p50 and max: `pipeline.last_symbolize_us` \
         read every second, kept when a new batch had come in. Daemon CPU: its \
         user + system time over the window.\n",
        pid = setup.pid,
        command = setup.command,
        last = METHODS - 1,
        park_us = PARK_NS / 1000,
        lo = LOOPS.0,
        hi = LOOPS.0 + LOOPS.1 - 1,
        timeout = COMPILE_TIMEOUT.as_secs(),
        share = C2_SHARE * 100.0,
        settle = SETTLE.as_secs(),
    )
}
