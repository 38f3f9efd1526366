//! `/metrics`: Prometheus text exposition, format 0.0.4.
//!
//! Cardinality is bounded: per-process series exist only for [`TOP`]
//! processes, ranked by time on or waiting for a CPU, then wall time, in
//! the last [`TOP_WINDOW_S`] seconds, each user getting a fair share of the
//! slots (see [`crate::profile::report::fair`]), and their only labels are `pid`, `comm` and one of `state` (6 values:
//! cpu, runqueue, futex, io, sleep, throttled), `kind` (2) or `le` (33).
//! So at most 20 × 6 state series, 20 × 2 switch
//! series, 20 wakeup series and 20 × 35 latency histogram series (buckets,
//! `_sum`, `_count`). Runqueue waits by victim and culprit cgroup are at
//! most [`MAX_PAIRS`] + 1 series. Daemon series are a fixed set.

use std::{
    collections::HashMap,
    fmt::{Display, Write as _},
    time::SystemTime,
};

mod daemon;

use super::limit::QueryStats;
use crate::profile::model::window::Window;
use crate::state::push::PushReport;
use crate::{
    profile::model::state::State,
    profile::{
        model::store::kept_off_totals::MAX_PAIRS,
        model::store::ProcessTotals,
        report::{fair, hist::slot_bounds_us, query},
    },
    state::Shared,
};
use daemon::{
    engine_series, history_series, holder_series, http_series, memory_series, push_series,
    query_series, spans_series,
};

/// Content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";
/// Processes that get per-process series.
pub const TOP: usize = 20;
/// Window in which processes are ranked.
pub const TOP_WINDOW_S: u64 = 60;

/// One process's series.
struct Process {
    /// `pid="..",comm=".."`, escaped.
    labels: String,
    totals: ProcessTotals,
}

const RETAINED: &str = "since wallscope first saw the process";

/// The exposition of the daemon's state at `now`. The store is locked
/// twice, briefly: for a snapshot and its counters, then for the running
/// totals of the [`TOP`] processes ranked from the snapshot without it.
pub fn render(shared: &Shared, queries: &QueryStats, now: SystemTime) -> String {
    let (snapshot, totals, store, history) = {
        let store = shared.store.read().unwrap_or_else(|e| e.into_inner());
        let history = store.history();
        (store.snapshot(), *store.totals(), store.stats(), history)
    };
    let ranked = query::busiest(
        &snapshot,
        Window::last(TOP_WINDOW_S, now),
        fair::MAX_LOOKED_AT,
    );
    let spans = snapshot.span_view().stats;
    drop(snapshot);
    let ranked = fair::top(&ranked, TOP, |pid| shared.processes.user_of(pid));
    let (procs, mut kept_off) = {
        let store = shared.store.read().unwrap_or_else(|e| e.into_inner());
        let kept_off: Vec<(String, String, u64)> = store
            .cgroup_kept_off()
            .pairs()
            .map(|(v, b, ns)| (v.to_string(), b.to_string(), ns))
            .collect();
        (with_totals(ranked, store.process_totals()), kept_off)
    };
    kept_off.sort();
    let stacks = store.stacks;
    let health = shared.health().clone();
    let mut out = Out::default();

    process_series(&mut out, &procs);
    kept_off_series(&mut out, &kept_off);
    engine_series(&mut out, &totals, &health, stacks);
    memory_series(&mut out, &store, &health);
    history_series(&mut out, &history);
    let sinks: Vec<PushReport> = [&shared.push, &shared.otlp]
        .into_iter()
        .filter_map(|s| s.get().map(|p| p.report()))
        .collect();
    holder_series(&mut out, (&store, &spans), queries, &sinks);
    spans_series(&mut out, &spans);
    query_series(&mut out, queries);
    http_series(&mut out);
    for sink in &sinks {
        push_series(&mut out, sink);
    }
    out.0
}

/// The [`TOP`] processes' series: time by state, runqueue latency,
/// wakeups and switches.
fn process_series(out: &mut Out, procs: &[Process]) {
    let name = "wallscope_process_state_seconds_total";
    let help = format!("Thread time by state, {RETAINED}");
    out.family(name, "counter", &help);
    for p in procs {
        for s in State::ALL {
            let labels = format!("{},{}", p.labels, label("state", s.name()));
            out.sample(name, &labels, p.totals.counters.ns_in(s) as f64 / 1e9);
        }
    }
    let name = "wallscope_process_runqueue_latency_seconds";
    let help = format!("Time from wakeup to running, {RETAINED}; _sum from bucket midpoints");
    out.family(name, "histogram", &help);
    for p in procs {
        let (mut n, mut sum_us) = (0, 0.0);
        for (slot, c) in p.totals.runq.iter().enumerate() {
            let (from, to) = slot_bounds_us(slot);
            n += c;
            sum_us += *c as f64 * (from + to) as f64 / 2.0;
            let le = label("le", &(to as f64 / 1e6).to_string());
            out.sample(&format!("{name}_bucket"), &format!("{},{le}", p.labels), n);
        }
        out.sample(
            &format!("{name}_bucket"),
            &format!("{},le=\"+Inf\"", p.labels),
            n,
        );
        out.sample(&format!("{name}_sum"), &p.labels, sum_us / 1e6);
        out.sample(&format!("{name}_count"), &p.labels, n);
    }
    let name = "wallscope_process_wakeups_total";
    let help = format!("Wakeups received by the threads, {RETAINED}");
    out.family(name, "counter", &help);
    for p in procs {
        out.sample(name, &p.labels, p.totals.counters.wakeups_received);
    }
    let name = "wallscope_process_switches_total";
    let help = format!("Context switches of the threads, {RETAINED}");
    out.family(name, "counter", &help);
    for p in procs {
        let switches = [
            p.totals.counters.switches_voluntary,
            p.totals.counters.switches_involuntary,
        ];
        for (kind, n) in ["voluntary", "involuntary"].into_iter().zip(switches) {
            out.sample(name, &format!("{},{}", p.labels, label("kind", kind)), n);
        }
    }
}

/// Runqueue wait by victim and culprit cgroup.
fn kept_off_series(out: &mut Out, kept_off: &[(String, String, u64)]) {
    let name = "wallscope_cgroup_kept_off_cpu_seconds_total";
    let help = format!("Runqueue wait of a cgroup's threads by the cgroup of what ran on that CPU meanwhile ([idle]: the CPU idled, [other CPU]: waited on another CPU's queue, [others]: past a thread's first culprits), since start; pairs past the first {MAX_PAIRS} under [other]");
    out.family(name, "counter", &help);
    for (victim, by, ns) in kept_off {
        let labels = format!("{},{}", label("cgroup", victim), label("by_cgroup", by));
        out.sample(name, &labels, *ns as f64 / 1e9);
    }
}

/// The processes in `pids` with their running totals.
fn with_totals(pids: Vec<u32>, all: &HashMap<u32, ProcessTotals>) -> Vec<Process> {
    pids.into_iter()
        .filter_map(|pid| {
            let totals = all.get(&pid)?.clone();
            let mut labels = format!(
                "{},{}",
                label("pid", &pid.to_string()),
                label("comm", &totals.comm)
            );
            // At most one container per process: no more series.
            for (key, value) in totals.container.iter().flat_map(|c| c.labels()) {
                labels.push(',');
                labels.push_str(&label(key, &value));
            }
            Some(Process { labels, totals })
        })
        .collect()
}

/// The exposition being written.
#[derive(Default)]
struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', r"\\").replace('\n', r"\n");
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// `name{labels} value`; `labels` as made by [`label`], comma-separated.
    fn sample(&mut self, name: &str, labels: &str, value: impl Display) {
        let _ = match labels {
            "" => writeln!(self.0, "{name} {value}"),
            _ => writeln!(self.0, "{name}{{{labels}}} {value}"),
        };
    }
}

/// `key="value"`, the value escaped.
fn label(key: &str, value: &str) -> String {
    format!("{key}=\"{}\"", escape_label(value))
}

/// A label value as the text format wants it: `\`, `"` and newline escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("x\ny"), r"x\ny");
        let mut out = Out::default();
        out.sample(
            "m",
            &format!("{},{}", label("comm", "we\"ird"), label("pid", "1")),
            2,
        );
        out.sample("n", "", 0.5);
        assert_eq!(out.0, "m{comm=\"we\\\"ird\",pid=\"1\"} 2\nn 0.5\n");
    }
}
