//! The unwind bench's report: folded rows and their depth statistics
//! (`Folded`), and the markdown tables (`render_cost`, `render_jvm`).

use crate::common::{self, median, ROOT};
use crate::{Counters, Jvm, Progs, Run, JVM_ARGS, MODES, PIPE, SETTLE, STEADY_AFTER};
use crate::{WAIT_S, WARM_DRAINS, WINDOW_S};
use anyhow::Result;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::process::Command;

/// Depth buckets, by their lowest depth; the last is open.
const DEPTHS: [usize; 7] = [0, 1, 2, 3, 6, 11, 21];

/// Folded rows: (frames below the process, µs).
pub struct Folded(Vec<(Vec<String>, u64)>);

/// Folded rows without the process frame and the trailing kernel frames
/// (`_[k]`, `[syscall ...]`): the user stack, root first.
pub fn parse(body: &str) -> Folded {
    let kernel = |f: &String| f.ends_with("_[k]") || f.starts_with("[syscall ");
    let row = |line: &str| {
        let (stack, value) = line.rsplit_once(' ')?;
        let mut frames: Vec<String> = stack.split(';').skip(1).map(str::to_string).collect();
        while frames.last().is_some_and(kernel) {
            frames.pop();
        }
        Some((frames, value.parse().ok()?))
    };
    Folded(body.lines().filter_map(row).collect())
}

impl Folded {
    fn total(&self) -> u64 {
        self.0.iter().map(|r| r.1).sum()
    }

    /// Share (%) of the weight whose stack matches `f`.
    fn share(&self, f: impl Fn(&[String]) -> bool) -> f64 {
        let hit: u64 = self.0.iter().filter(|r| f(&r.0)).map(|r| r.1).sum();
        hit as f64 * 100.0 / self.total() as f64
    }

    /// Weighted quantile `q` of the depth.
    fn depth_quantile(&self, q: f64) -> usize {
        let mut rows: Vec<(usize, u64)> = self.0.iter().map(|r| (r.0.len(), r.1)).collect();
        rows.sort();
        let (target, mut acc) = (q * self.total() as f64, 0);
        let mut above = rows.into_iter().skip_while(|(_, w)| {
            acc += w;
            (acc as f64) < target
        });
        above.next().map_or(0, |r| r.0)
    }

    /// Total, rows, median and p90 depth, shares reaching a Java frame and
    /// `start_thread`.
    fn summary(&self) -> [String; 6] {
        let pct = |v: f64| format!("{v:.1} %");
        let has = |f: fn(&String) -> bool| move |s: &[String]| s.iter().any(f);
        [
            format!("{:.1} s", self.total() as f64 / 1e6),
            self.0.len().to_string(),
            self.depth_quantile(0.5).to_string(),
            self.depth_quantile(0.9).to_string(),
            pct(self.share(has(|f| f.ends_with("_[j]")))),
            pct(self.share(has(|f| f == "start_thread"))),
        ]
    }

    /// The heaviest stack, `frames weight`.
    fn heaviest(&self) -> String {
        let top = self.0.iter().max_by_key(|r| r.1);
        top.map_or(String::new(), |(f, w)| format!("{} {w}", f.join(";")))
    }

    /// With thread grouping: the ForkJoinPool workers' rows, without the
    /// thread frame.
    fn workers(&self) -> Folded {
        let workers = self
            .0
            .iter()
            .filter(|r| r.0.first().is_some_and(|t| t.starts_with("ForkJoinPool-")));
        Folded(workers.map(|(f, w)| (f[1..].to_vec(), *w)).collect())
    }

    /// With thread grouping: µs at depth 1 by thread, heaviest first.
    fn shallow_threads(&self) -> Vec<(String, u64)> {
        let mut by: BTreeMap<&str, u64> = BTreeMap::new();
        for (frames, w) in self.0.iter().filter(|r| r.0.len() == 2) {
            *by.entry(&frames[0]).or_default() += w;
        }
        let mut v: Vec<(String, u64)> = by.into_iter().map(|(t, w)| (t.into(), w)).collect();
        v.sort_by_key(|r| std::cmp::Reverse(r.1));
        v
    }
}

fn secs(runs: &[Run]) -> f64 {
    per_run(runs, |r| r.secs)
}

/// Median over `runs` of `f`.
fn per_run(runs: &[Run], f: impl Fn(&Run) -> f64) -> f64 {
    median(runs.iter().map(f)).unwrap_or(f64::NAN)
}

pub fn walks(unwind: &Counters) -> u64 {
    unwind.get("unwind_walks").copied().unwrap_or(0)
}

/// Non-zero `lost.unwind_*` counters, as `name N, ...`, or `none`.
fn losses(unwind: &Counters) -> String {
    let lost = unwind
        .iter()
        .filter(|(k, v)| *k != "unwind_walks" && **v > 0);
    or_none(lost.map(|(k, v)| format!("`{k}` {v}")).collect())
}

/// `items` joined with commas, or `none`.
fn or_none(items: Vec<String>) -> String {
    match items.is_empty() {
        true => "none".into(),
        false => items.join(", "),
    }
}

/// A table row from `|`-separated cells.
fn cells(row: String) -> Vec<String> {
    row.split('|').map(str::to_string).collect()
}

/// The commit the daemon was built from, and whether `src/` or `bpf/` had
/// uncommitted changes.
fn revision() -> String {
    let git = |args: &[&str]| {
        let out = Command::new("git").current_dir(ROOT).args(args).output();
        out.map_or(String::new(), |o| {
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        })
    };
    let dirty = !git(&["status", "--porcelain", "--", "src", "bpf"]).is_empty();
    let commit = git(&["rev-parse", "--short", "HEAD"]);
    let note = ["", " with uncommitted changes in `src/` or `bpf/`"][dirty as usize];
    format!("release build of commit {commit}{note}")
}

pub fn render_cost(
    load_start: &str,
    stats: &str,
    runs: &[Vec<Run>],
    costs: &[(Run, Progs)],
) -> Result<String> {
    let (date, kernel, load) = common::system()?;
    let cpus = std::thread::available_parallelism()?.get();
    let (base, bm) = (&runs[0], secs(&runs[0]));
    let base_switches = per_run(base, |r| r.switches as f64);
    let (lo, hi) = common::spread(base.iter().map(|r| r.secs), bm);
    let mut s = format!(
        "# Table-driven stack unwinding: cost and stack depth\n\n\
         - date: {date}\n- kernel: {kernel}\n- CPUs: {cpus}\n- wallscope: {}\n\
         - load average before / after: {load_start} / {load}\n\n\
         **Before** is `wallscope serve --unwind fp`: user stacks are walked by the \
         kernel's `bpf_get_stack` through frame pointers only, so a walk ends at the \
         first function built without them (Debian's glibc: a thread parked in \
         `pthread_cond_wait` shows one frame, `__futex_abstimed_wait_common`). \
         **After** is `--unwind tables` (the default): where a file has no frame \
         pointers the BPF programs step with unwind tables built from its `.eh_frame`, \
         elsewhere along the frame-pointer chain. Other options are the defaults; \
         each daemon is measured after {WARM_DRAINS} drains (tables loaded) plus \
         {SETTLE:?}.\n\n## Context-switch cost\n\n\
         `{PIPE}` (glibc, so with tables its stacks go through the table path), \
         {} rounds round-robin (start rotated each round), a fresh daemon per run, \
         each run started once no other BPF program was loaded (or after \
         `WS_BENCH_QUIET_S`). Baseline {bm:.3} s and {base_switches:.0} context \
         switches per run, min / max vs median {lo:+.2} % / {hi:+.2} %. \
         `kernel.bpf_stats_enabled` before / after the timed rounds: {stats}.\n\n",
        revision(),
        base.len(),
    );
    let header = cells(
        "configuration|median s|slowdown (min–max)|extra ns/switch|\
        unwind walks/run|walks/switch|runs with other BPF loaded"
            .into(),
    );
    let mut rows = Vec::new();
    let mut lost = Vec::new();
    for ((name, mode), r) in MODES.iter().zip(runs) {
        let m = secs(r);
        let (lo, hi) = common::spread(r.iter().map(|r| r.secs), bm);
        let w = per_run(r, |r| walks(&r.unwind) as f64);
        let (walks, per_switch) = match mode {
            Some(_) => (
                format!("{w:.0}"),
                format!("{:.2}", w / per_run(r, |r| r.switches as f64)),
            ),
            None => ("–".into(), "–".into()),
        };
        let (slow, lo, hi) = (m / bm, 1.0 + lo / 100.0, 1.0 + hi / 100.0);
        let extra = (m - bm) * 1e9 / base_switches;
        let disturbed = r.iter().filter(|r| r.disturbed).count();
        rows.push(cells(format!(
            "{name}|{m:.3}|{slow:.3} ({lo:.2}–{hi:.2})|{extra:.0}|{walks}|{per_switch}|\
             {disturbed} of {}",
            r.len()
        )));
        let mut sum = Counters::new();
        for (k, v) in r.iter().flat_map(|r| &r.unwind) {
            *sum.entry(k.clone()).or_default() += v;
        }
        if mode.is_some() {
            lost.push(format!("{name} {}", losses(&sum)));
        }
    }
    s += &common::table(&header, &rows);
    let _ = write!(
        s,
        "\nslowdown: median / baseline median. extra ns/switch: (median − baseline \
         median) / baseline context switches. unwind walks: growth of `/healthz` \
         `events.unwind_walks` during a run (median). Walks ended early (`lost.unwind_*`), \
         summed over the rounds: {}.\n\n### BPF run time per event\n\n\
         One more run per mode with `kernel.bpf_stats_enabled=1`, counted from \
         {STEADY_AFTER:?} into the run and, with tables, once table walks had begun (a \
         new process gets its tables at a drain after it appears, 1–2 s, and is walked \
         with frame pointers until then; the timed runs above include that start): \
         `run_cnt` and `run_time_ns / run_cnt` per program (`bpftool prog show`); the \
         last row is all programs' run time per context switch (`/proc/stat` ctxt, \
         all CPUs).\n\n",
        lost.join("; ")
    );
    let header =
        cells("program|fp events|fp ns/event|tables events|tables ns/event|tables / fp".into());
    let names: BTreeSet<&String> = costs.iter().flat_map(|c| c.1.keys()).collect();
    let per_event = |c: &(Run, Progs), n: &str| {
        let (cnt, ns) = c.1.get(n).copied().unwrap_or_default();
        (cnt, ns as f64 / cnt as f64)
    };
    let per_switch = |c: &(Run, Progs)| {
        let ns: u64 = c.1.values().map(|p| p.1).sum();
        (c.0.switches, ns as f64 / c.0.switches as f64)
    };
    let mut rows = Vec::new();
    let lines = names
        .iter()
        .map(|n| (n.as_str(), per_event(&costs[0], n), per_event(&costs[1], n)));
    let total = (
        "all, per context switch",
        per_switch(&costs[0]),
        per_switch(&costs[1]),
    );
    for (name, (fc, fns), (tc, tns)) in lines.chain([total]) {
        let ratio = tns / fns;
        rows.push(cells(format!(
            "{name}|{fc}|{fns:.0}|{tc}|{tns:.0}|{ratio:.2}×"
        )));
    }
    s += &common::table(&header, &rows);
    let (fp, tables) = (&costs[0].0, &costs[1].0);
    let _ = write!(
        s,
        "\nRun times with stats on: fp {:.3} s, tables {:.3} s{}. Unwind walks over \
         the whole tables run: {}; walks ended early: {}.\n\n",
        fp.secs,
        tables.secs,
        ["", " (other BPF programs were loaded)"][(fp.disturbed || tables.disturbed) as usize],
        walks(&tables.unwind),
        losses(&tables.unwind),
    );
    Ok(s)
}

pub fn render_jvm(jvm: &[Jvm]) -> String {
    let mut s = format!(
        "## Stack depth on a parked JVM\n\n\
         `java -XX:+PreserveFramePointer -cp DIR Churn {}` (`tests/workloads/java/\
         Churn.java`: bursts of tiny tasks on a 4-worker ForkJoinPool, so workers \
         keep parking), started once the daemon is warm; {WAIT_S} s after it is \
         ready, `GET /folded?pid=PID&kind=futex|cpu&seconds={WINDOW_S}`. Depth: frames \
         per row below the process frame, without the trailing kernel frames (`_[k]`, \
         `[syscall ...]`); shares are of the futex time (all threads, or only the \
         `ForkJoinPool-1-worker-*` threads, from `group=thread`) or of the CPU time \
         (samples × period).\n\n",
        JVM_ARGS.join(" ")
    );
    let header = cells(
        "depth|fp futex|tables futex|fp workers' futex|tables workers' futex|fp cpu|tables cpu"
            .into(),
    );
    let workers = [jvm[0].threads.workers(), jvm[1].threads.workers()];
    let cols = [&jvm[0].futex, &jvm[1].futex, &workers[0], &workers[1]];
    let cols = [cols.as_slice(), &[&jvm[0].cpu, &jvm[1].cpu]].concat();
    let mut rows = Vec::new();
    for (i, &lo) in DEPTHS.iter().enumerate() {
        let hi = DEPTHS.get(i + 1).map_or(usize::MAX, |next| next - 1);
        let label = match hi {
            usize::MAX => format!("{lo}+"),
            hi if hi == lo => lo.to_string(),
            hi => format!("{lo}–{hi}"),
        };
        let mut row = vec![label];
        let share = |c: &&Folded| format!("{:.1} %", c.share(|f| (lo..=hi).contains(&f.len())));
        row.extend(cols.iter().map(share));
        rows.push(row);
    }
    let labels = cells(
        "total|rows|median depth|p90 depth|reaches a Java frame (`_[j]`)|\
        reaches `start_thread`"
            .into(),
    );
    let summaries: Vec<[String; 6]> = cols.iter().map(|c| c.summary()).collect();
    for (i, label) in labels.iter().enumerate() {
        let mut row = vec![label.to_string()];
        row.extend(summaries.iter().map(|c| c[i].clone()));
        rows.push(row);
    }
    s += &common::table(&header, &rows);
    s += "\n";
    for ((mode, j), workers) in ["fp", "tables"].iter().zip(jvm).zip(&workers) {
        let shallow = j.threads.shallow_threads();
        let shallow = shallow.iter().take(5).map(|(t, w)| format!("{t} {w}"));
        let _ = write!(
            s,
            "With {mode}, the heaviest futex stack of a worker (root first, µs):\n\n```\n{}\n```\n\n\
             Futex time at depth 1 by thread (µs, top 5): {}. Walks ended early during \
             the run: {}.\n\n",
            workers.heaviest(),
            or_none(shallow.collect()),
            losses(&j.unwind),
        );
    }
    let _ = writeln!(
        s,
        "`pipeline.unwind` at the end of the tables JVM run: `{}`",
        jvm[1].tables
    );
    s
}
