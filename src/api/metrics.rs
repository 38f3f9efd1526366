//! `/metrics`: Prometheus text exposition, format 0.0.4.
//!
//! Cardinality is bounded: per-process series exist only for the [`TOP`]
//! processes with the most wall time in the last [`TOP_WINDOW_S`] seconds,
//! and their only labels are `pid`, `comm` and one of `state` (5 values),
//! `kind` (2) or `le` (33). So at most 20 × 5 state series, 20 × 2 switch
//! series, 20 wakeup series and 20 × 35 latency histogram series (buckets,
//! `_sum`, `_count`). Daemon series are a fixed set.

use std::{collections::HashMap, fmt::Display, fmt::Write as _, time::SystemTime};

use crate::{
    bpf::abi::{Stat, State, HIST_SLOTS},
    collect::HistOwner,
    pipeline::Shared,
    profile::{
        runqueue::{self, slot_bounds_us, Slots},
        store::Store,
    },
};

/// Content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";
/// Processes that get per-process series.
pub const TOP: usize = 20;
/// Window in which processes are ranked by wall time.
pub const TOP_WINDOW_S: u64 = 60;

/// One process's totals over the whole retention.
#[derive(Default)]
struct Process {
    pid: u32,
    comm: Option<String>,
    main_thread_comm: Option<String>,
    ns: [u64; 5],
    wakeups: u64,
    switches_voluntary: u64,
    switches_involuntary: u64,
    runq: Slots,
}

/// The exposition of the daemon's state at `now`.
pub fn render(shared: &Shared, now: SystemTime) -> String {
    let (procs, totals, stacks) = {
        let store = shared.store.read().unwrap_or_else(|e| e.into_inner());
        (
            top_processes(&store, now),
            *store.totals(),
            store.stack_count(),
        )
    };
    let health = shared
        .health
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut out = Out::default();
    let comm = |p: &Process| {
        p.comm
            .clone()
            .or_else(|| p.main_thread_comm.clone())
            .unwrap_or_else(|| "[unknown]".into())
    };
    let procs: Vec<(String, String, &Process)> = procs
        .iter()
        .map(|p| (p.pid.to_string(), comm(p), p))
        .collect();
    let rows = || {
        procs
            .iter()
            .map(|(pid, comm, p)| (pid.as_str(), comm.as_str(), *p))
    };

    out.family(
        "wallscope_process_state_seconds_total",
        "counter",
        "Thread time by state, summed over the process's threads and over the retained history \
         (not monotonic: it drops as old slices expire)",
    );
    for (pid, comm, p) in rows() {
        for state in State::ALL {
            let labels = [("pid", pid), ("comm", comm), ("state", state.name())];
            out.sample(
                "wallscope_process_state_seconds_total",
                &labels,
                p.ns[state as usize] as f64 / 1e9,
            );
        }
    }

    let hist = "wallscope_process_runqueue_latency_seconds";
    out.family(
        hist,
        "histogram",
        "Time from wakeup to running, over the retained history; _sum from bucket midpoints",
    );
    for (pid, comm, p) in rows() {
        let (mut count, mut sum_us) = (0, 0.0);
        for slot in 0..HIST_SLOTS {
            let (from, to) = slot_bounds_us(slot);
            count += p.runq[slot];
            sum_us += p.runq[slot] as f64 * (from + to) as f64 / 2.0;
            let le = (to as f64 / 1e6).to_string();
            out.sample(
                &format!("{hist}_bucket"),
                &[("pid", pid), ("comm", comm), ("le", &le)],
                count,
            );
        }
        out.sample(
            &format!("{hist}_bucket"),
            &[("pid", pid), ("comm", comm), ("le", "+Inf")],
            count,
        );
        out.sample(
            &format!("{hist}_sum"),
            &[("pid", pid), ("comm", comm)],
            sum_us / 1e6,
        );
        out.sample(
            &format!("{hist}_count"),
            &[("pid", pid), ("comm", comm)],
            count,
        );
    }

    let wakeups = "wallscope_process_wakeups_total";
    out.family(
        wakeups,
        "counter",
        "Wakeups received by the process's threads, over the retained history",
    );
    for (pid, comm, p) in rows() {
        out.sample(wakeups, &[("pid", pid), ("comm", comm)], p.wakeups);
    }
    let switches = "wallscope_process_switches_total";
    out.family(
        switches,
        "counter",
        "Context switches of the process's threads, over the retained history",
    );
    for (pid, comm, p) in rows() {
        for (kind, n) in [
            ("voluntary", p.switches_voluntary),
            ("involuntary", p.switches_involuntary),
        ] {
            out.sample(switches, &[("pid", pid), ("comm", comm), ("kind", kind)], n);
        }
    }

    out.family(
        "wallscope_bpf_events_total",
        "counter",
        "BPF-side event and loss counters since start",
    );
    for stat in Stat::ALL {
        out.sample(
            "wallscope_bpf_events_total",
            &[("counter", stat.name())],
            totals[stat as usize],
        );
    }
    out.single(
        "wallscope_drains_total",
        "counter",
        "Drains of the BPF maps",
        health.drains,
    );
    out.single(
        "wallscope_drain_errors_total",
        "counter",
        "Failed drains of the BPF maps",
        health.drain_errors,
    );
    let last_drain = health.last_drain_us as f64 / 1e6;
    out.single(
        "wallscope_last_drain_seconds",
        "gauge",
        "Duration of the last drain",
        last_drain,
    );
    let last_symbolize = health.last_symbolize_us as f64 / 1e6;
    out.single(
        "wallscope_last_symbolize_seconds",
        "gauge",
        "Duration of the last symbolization",
        last_symbolize,
    );
    out.single(
        "wallscope_stacks",
        "gauge",
        "Distinct stacks held in the store",
        stacks,
    );
    if let Some(cpu) = self_cpu_seconds() {
        out.single(
            "wallscope_process_cpu_seconds_total",
            "counter",
            "CPU time of the wallscope daemon itself",
            cpu,
        );
    }
    if let Some(rss) = self_resident_bytes() {
        out.single(
            "wallscope_resident_memory_bytes",
            "gauge",
            "Resident memory of the wallscope daemon",
            rss,
        );
    }
    out.0
}

/// The [`TOP`] processes by wall time in the last [`TOP_WINDOW_S`] s, with
/// their totals over every retained slice, busiest first.
fn top_processes(store: &Store, now: SystemTime) -> Vec<Process> {
    let mut wall: HashMap<u32, u64> = HashMap::new();
    for slice in store.window(TOP_WINDOW_S, now) {
        for t in &slice.thread_totals {
            *wall.entry(t.pid).or_default() += t.ns.iter().sum::<u64>();
        }
    }
    let mut ranked: Vec<(u32, u64)> = wall.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(TOP);
    let index: HashMap<u32, usize> = ranked
        .iter()
        .enumerate()
        .map(|(i, (pid, _))| (*pid, i))
        .collect();
    let mut procs: Vec<Process> = ranked
        .iter()
        .map(|&(pid, _)| Process {
            pid,
            ..Default::default()
        })
        .collect();
    for slice in store.all() {
        for t in &slice.thread_totals {
            let Some(p) = index.get(&t.pid).map(|&i| &mut procs[i]) else {
                continue;
            };
            for (a, b) in p.ns.iter_mut().zip(t.ns) {
                *a += b;
            }
            p.wakeups += t.wakeups_received;
            p.switches_voluntary += t.switches_voluntary;
            p.switches_involuntary += t.switches_involuntary;
            if t.tid == t.pid {
                p.main_thread_comm = Some(t.comm.clone());
            }
        }
        for (owner, hist) in &slice.runq_hists {
            if let HistOwner::Process(pid) = owner {
                if let Some(&i) = index.get(pid) {
                    runqueue::add(&mut procs[i].runq, hist);
                }
            }
        }
        for p in &mut procs {
            if let Some(name) = slice.processes.get(&p.pid) {
                p.comm = Some(name.to_string());
            }
        }
    }
    procs
}

/// The exposition being written.
#[derive(Default)]
struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', r"\\").replace('\n', r"\n");
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.0.push_str(name);
        for (i, (k, v)) in labels.iter().enumerate() {
            let sep = if i == 0 { '{' } else { ',' };
            let _ = write!(self.0, "{sep}{k}=\"{}\"", escape_label(v));
        }
        let close = if labels.is_empty() { "" } else { "}" };
        let _ = writeln!(self.0, "{close} {value}");
    }

    fn single(&mut self, name: &str, kind: &str, help: &str, value: impl Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// A label value as the text format wants it: `\`, `"` and newline escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// CPU time of this process (`utime + stime`).
fn self_cpu_seconds() -> Option<f64> {
    let ticks = cpu_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 / per_second as f64)
}

/// `utime + stime` from a `/proc/PID/stat` line; the name may hold spaces
/// and parentheses, so fields are counted after the last `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    // Field 3 (state) is at index 0: utime is field 14, stime field 15.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Resident set size of this process, from `/proc/self/statm`.
fn self_resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().map(|page| pages * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("x\ny"), r"x\ny");
        let mut out = Out::default();
        out.sample("m", &[("comm", "we\"ird"), ("pid", "1")], 2);
        out.sample("n", &[], 0.5);
        assert_eq!(out.0, "m{comm=\"we\\\"ird\",pid=\"1\"} 2\nn 0.5\n");
    }

    #[test]
    fn cpu_ticks_skip_odd_names() {
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 1 2 3";
        assert_eq!(cpu_ticks(stat), Some(12));
        assert_eq!(cpu_ticks("42 (x) S 1"), None);
        assert!(self_cpu_seconds().is_some() && self_resident_bytes().is_some_and(|b| b > 0));
    }
}
