//! Per-thread time breakdowns (`/threads`): exact time by state, switches
//! and wakeups, per thread, per pool and for the process.

use crate::profile::model::{
    counters::ThreadCounters, kind::pool_name, store::Snapshot, window::Window,
};
use std::{
    collections::HashMap,
    fmt::Write as _,
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};

use serde::Serialize;

use super::query::ns_to_us;
use crate::{jvm::JvmReport, process::container::Container, profile::model::state::State};

/// Time and events of one thread, pool or process.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Breakdown {
    pub cpu_us: u64,
    pub runqueue_us: u64,
    pub futex_us: u64,
    pub io_us: u64,
    pub sleep_us: u64,
    /// Runnable but held back because its cgroup's CPU quota was spent.
    pub throttled_us: u64,
    pub wall_us: u64,
    pub switches: u64,
    pub switches_involuntary: u64,
    pub wakeups_sent: u64,
    pub wakeups_received: u64,
}

/// One thread's row.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ThreadRow {
    pub tid: u32,
    pub name: String,
    pub pool: String,
    #[serde(flatten)]
    pub time: Breakdown,
    /// Who ran on its CPU while it waited in a runqueue, most first (see
    /// [`super::culprits`]; filled in by the API).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_off_cpu_by: Vec<super::culprits::Culprit>,
    /// Its blocked intervals and who ended them (see [`super::sleeps`];
    /// filled in by the API).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sleeps: Option<super::sleeps::SleepSummary>,
    /// Of its futex time, what it spent waiting for a Python GIL (see
    /// [`super::gil`]; filled in by the API).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gil_us: Option<u64>,
    /// Whether it lived only part of the window (see
    /// [`super::thread_fold`]).
    #[serde(skip)]
    pub life: Life,
}

/// The first and last drain of a window a thread was seen in (their
/// index), each with whether it lived only part of it.
struct Seen {
    first: (usize, bool),
    last: (usize, bool),
}

/// The share of its process's longest time in a drain a thread's must
/// reach for it to have lived through that drain as long as the process.
const WHOLE_DRAIN: f64 = 0.9;

/// What part of the window a thread lived, as the drains saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Life {
    /// Absent from the first drain of the window in which its process was
    /// seen, or alive for less of it than the process's longest-lived
    /// thread: it started within the window, after the process.
    pub born: bool,
    /// Likewise at the end: it ended within the window.
    pub ended: bool,
}

/// One pool's row.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PoolRow {
    pub pool: String,
    pub threads: usize,
    #[serde(flatten)]
    pub time: Breakdown,
}

/// The `/threads` answer for one process.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ThreadReport {
    pub pid: u32,
    pub comm: String,
    pub seconds: u64,
    /// The window in words: `last 30 s`, or its range.
    pub window: String,
    /// Seconds of the window the daemon has records of
    /// (`recorded_seconds`: less than `seconds` when the window reaches
    /// before them), their resolution, oldest first (`resolution`), and
    /// the exact span held (`covered`).
    #[serde(flatten)]
    pub recorded: crate::profile::model::store::Recorded,
    pub process: Breakdown,
    pub pools: Vec<PoolRow>,
    pub threads: Vec<ThreadRow>,
    /// Short-lived threads of one pool, one row per pool (see
    /// [`super::thread_fold`]); their threads are not in `threads`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub folded: Vec<super::thread_fold::FoldedThreads>,
    /// Microseconds from the first drain of the window in which the
    /// process was seen to the end of its last.
    #[serde(skip)]
    pub seen_us: u64,
    /// What wallscope knows of the process as a JVM, when it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jvm: Option<JvmReport>,
    /// Its container and pod, when it runs in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<Arc<Container>>,
    /// Its command line, executable, program and cgroups (`cmdline`,
    /// `executable`, `main`, `cgroups`; filled in by the answer).
    #[serde(flatten)]
    pub identity: Option<super::identity::Shown>,
    /// Why every figure is zero, when nothing was recorded in the window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl ThreadCounters {
    /// The counters as a report row shows them (microseconds).
    pub fn breakdown(&self) -> Breakdown {
        let us = |s: State| ns_to_us(self.ns_in(s));
        Breakdown {
            cpu_us: us(State::Cpu),
            runqueue_us: us(State::Runqueue),
            futex_us: us(State::Futex),
            io_us: us(State::Io),
            sleep_us: us(State::Sleep),
            throttled_us: us(State::Throttled),
            wall_us: ns_to_us(self.wall()),
            switches: self.switches(),
            switches_involuntary: self.switches_involuntary,
            wakeups_sent: self.wakeups_sent,
            wakeups_received: self.wakeups_received,
        }
    }
}

/// Per-thread breakdown of `pid` within `window`; `None` when nothing was
/// recorded for it.
pub fn report(store: &Snapshot, pid: u32, window: Window) -> Option<ThreadReport> {
    let mut sums: HashMap<u32, ThreadCounters> = HashMap::new();
    let mut names: HashMap<u32, String> = HashMap::new();
    let mut comm = None;
    let mut container = None;
    // Per tid, and for the process: the first and last drain seen in.
    let mut seen: HashMap<u32, Seen> = HashMap::new();
    let mut process_seen: Option<(usize, usize, SystemTime, SystemTime)> = None;
    for (i, slice) in store.within(window).enumerate() {
        let mine = || slice.thread_totals.iter().filter(|t| t.pid == pid);
        // A thread's time in a drain is how long it lived in it (time is
        // accounted as it passes, blocked or not): the longest is the
        // process's.
        let longest = mine().map(|t| t.counters.wall()).max().unwrap_or(0);
        for t in mine() {
            *sums.entry(t.tid).or_default() += &t.counters;
            let part = (t.counters.wall() as f64) < longest as f64 * WHOLE_DRAIN;
            let s = seen.entry(t.tid).or_insert(Seen {
                first: (i, part),
                last: (i, part),
            });
            s.last = (i, part);
            let p = process_seen.get_or_insert((i, i, slice.start, slice.end));
            (p.1, p.3) = (i, slice.end);
            // The symbolizer's name (e.g. a full Java thread name) over
            // the kernel's 15 characters.
            let name = slice.threads.get(&t.tid).map(|i| i.name.to_string());
            names.insert(t.tid, name.unwrap_or_else(|| t.comm.clone()));
        }
        if let Some(name) = slice.processes.get(&pid) {
            comm = Some(name.to_string());
        }
        if let Some(c) = slice.containers.get(&pid) {
            container = Some(c.clone());
        }
    }
    if sums.is_empty() {
        return None;
    }
    let (first, last, from, to) = process_seen.unwrap_or((0, 0, UNIX_EPOCH, UNIX_EPOCH));
    let seen_us = to.duration_since(from).unwrap_or_default().as_micros() as u64;
    let mut process = ThreadCounters::default();
    let mut pools: HashMap<String, (usize, ThreadCounters)> = HashMap::new();
    let mut threads = Vec::with_capacity(sums.len());
    for (tid, sum) in &sums {
        let name = names.get(tid).cloned().unwrap_or_default();
        let pool = pool_name(&name);
        process += sum;
        let entry = pools.entry(pool.clone()).or_default();
        entry.0 += 1;
        entry.1 += sum;
        threads.push(ThreadRow {
            tid: *tid,
            name,
            pool,
            time: sum.breakdown(),
            kept_off_cpu_by: Vec::new(),
            sleeps: None,
            gil_us: None,
            life: seen.get(tid).map_or_else(Life::default, |s| Life {
                born: s.first.0 > first || s.first.1,
                ended: s.last.0 < last || s.last.1,
            }),
        });
    }
    threads.sort_by(|a, b| b.time.wall_us.cmp(&a.time.wall_us).then(a.tid.cmp(&b.tid)));
    let mut pools: Vec<PoolRow> = pools
        .into_iter()
        .map(|(pool, (threads, sum))| PoolRow {
            pool,
            threads,
            time: sum.breakdown(),
        })
        .collect();
    pools.sort_by(|a, b| {
        b.time
            .wall_us
            .cmp(&a.time.wall_us)
            .then(a.pool.cmp(&b.pool))
    });
    Some(ThreadReport {
        pid,
        comm: comm.unwrap_or_default(),
        seconds: window.seconds(),
        window: window.describe(),
        recorded: Default::default(),
        process: process.breakdown(),
        pools,
        threads,
        folded: Vec::new(),
        seen_us,
        jvm: None,
        container,
        identity: None,
        note: None,
    })
}

/// A process as the host shows it now: its name and its threads' tids
/// and names (by tid), for a report of a process that recorded nothing.
#[derive(Debug, Clone, Default)]
pub struct LiveProcess {
    pub comm: String,
    pub threads: Vec<(u32, String)>,
}

/// The report of a known process that recorded nothing in `window`: its
/// threads as the host lists them now (none if it is gone), all zero, and
/// `note`.
pub fn empty_report(pid: u32, now: LiveProcess, window: Window, note: String) -> ThreadReport {
    let mut threads: Vec<ThreadRow> = now
        .threads
        .into_iter()
        .map(|(tid, name)| ThreadRow {
            tid,
            pool: pool_name(&name),
            name,
            time: Breakdown::default(),
            kept_off_cpu_by: Vec::new(),
            sleeps: None,
            gil_us: None,
            life: Life::default(),
        })
        .collect();
    threads.sort_by_key(|t| t.tid);
    ThreadReport {
        pid,
        comm: now.comm,
        seconds: window.seconds(),
        window: window.describe(),
        recorded: Default::default(),
        process: Breakdown::default(),
        pools: Vec::new(),
        threads,
        folded: Vec::new(),
        seen_us: 0,
        jvm: None,
        container: None,
        identity: None,
        note: Some(note),
    }
}

/// An aligned table for a terminal, threads sorted by wall time, with the
/// share of wall time in each state.
pub fn render_text(r: &ThreadReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pid {} ({}), {}{}: wall time by state",
        r.pid,
        r.comm,
        r.window,
        recorded_note(r.seconds, r.recorded.seconds)
    );
    for line in r.identity.iter().flat_map(|i| i.describe()) {
        let _ = writeln!(out, "{line}");
    }
    if let Some(note) = &r.note {
        let _ = writeln!(out, "note: {note}");
    }
    if let Some(jvm) = &r.jvm {
        let _ = writeln!(out, "{}", jvm.describe());
    }
    let header = format!(
        "{:>8}  {:<28} {:>10} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>9} {:>16}",
        "TID",
        "NAME",
        "WALL ms",
        "cpu%",
        "runq%",
        "futex%",
        "io%",
        "sleep%",
        "thrtl%",
        "switches",
        "wakeups_received"
    );
    let row = |id: &str, name: &str, t: &Breakdown| {
        let pct = |v: u64| {
            if t.wall_us == 0 {
                0.0
            } else {
                100.0 * v as f64 / t.wall_us as f64
            }
        };
        format!(
            "{:>8}  {:<28} {:>10.1} {:>6.1} {:>6.1} {:>6.1} {:>6.1} {:>6.1} {:>6.1} {:>9} {:>16}",
            id,
            truncate(name, 28),
            t.wall_us as f64 / 1000.0,
            pct(t.cpu_us),
            pct(t.runqueue_us),
            pct(t.futex_us),
            pct(t.io_us),
            pct(t.sleep_us),
            pct(t.throttled_us),
            t.switches,
            t.wakeups_received,
        )
    };
    let _ = writeln!(out, "{header}");
    // Threads and folded pools together, by wall time.
    let mut rows: Vec<(u64, String)> = r
        .threads
        .iter()
        .map(|t| (t.time.wall_us, row(&t.tid.to_string(), &t.name, &t.time)))
        .collect();
    rows.extend(r.folded.iter().map(|f| {
        // The count is kept whole when the name is cut.
        let count = format!(" ×{}", f.threads);
        let pool = truncate(
            &f.pool,
            28usize.saturating_sub(count.chars().count()).max(2),
        );
        let name = format!("{pool}{count}");
        (f.time.wall_us, row("folded", &name, &f.time))
    }));
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    for (_, line) in rows {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(out, "\n{:>8}  {:<28}", "THREADS", "POOL");
    for p in &r.pools {
        let _ = writeln!(out, "{}", row(&p.threads.to_string(), &p.pool, &p.time));
    }
    let _ = writeln!(out, "{}", row("all", "(process)", &r.process));
    sleeps_text(&mut out, r);
    super::thread_fold::render_lifetimes(&mut out, r);
    out
}

/// The threads' blocked intervals, for those that had any.
fn sleeps_text(out: &mut String, r: &ThreadReport) {
    let with: Vec<&ThreadRow> = r.threads.iter().filter(|t| t.sleeps.is_some()).collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nblocked intervals (switch-out to wakeup): ~ marks an estimate within log2 buckets\n{:>8}  {:<28} {:>9} {:>10} {:>10}  WOKEN BY (share of blocked time)",
        "TID", "NAME", "intervals", "median", "p90"
    );
    let approx = |us: f64, approx: bool| {
        let text = super::durations::micros(us.round() as u64);
        if approx {
            format!("~{text}")
        } else {
            text
        }
    };
    for t in with {
        let s = t.sleeps.as_ref().expect("filtered");
        let woken: Vec<String> = s
            .woken_by
            .iter()
            .map(|w| format!("{} {:.0}%", w.by, w.share * 100.0))
            .collect();
        let _ = writeln!(
            out,
            "{:>8}  {:<28} {:>9} {:>10} {:>10}  {}",
            t.tid,
            truncate(&t.name, 28),
            s.intervals,
            approx(s.median_us, s.approx),
            approx(s.p90_us, s.approx),
            woken.join(", ")
        );
    }
}

pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        s.chars().take(max - 1).chain(['…']).collect()
    }
}

/// ` (only N s recorded)` when the window reaches before the records.
pub fn recorded_note(seconds: u64, recorded: u64) -> String {
    if recorded < seconds {
        format!(" (only {recorded} s recorded)")
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use std::{collections::HashMap as Map, sync::Arc, time::Duration};

    use super::*;
    use crate::profile::model::counters::{RawThread, ThreadCounters};
    use crate::profile::model::{store::Store, Slice};

    fn thread(
        tid: u32,
        name: &str,
        ns: [u64; crate::profile::model::state::State::COUNT],
    ) -> RawThread {
        RawThread {
            tid,
            pid: 7,
            comm: name.into(),
            counters: ThreadCounters {
                ns,
                switches_voluntary: 3,
                switches_involuntary: 1,
                wakeups_sent: 2,
                wakeups_received: 5,
            },
        }
    }

    #[test]
    fn sums_threads_pools_and_process() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let mut store = Store::new(Duration::from_secs(600));
        for i in 0..2u64 {
            store.push(Slice {
                start: end - Duration::from_secs(2 - i),
                end: end - Duration::from_secs(1 - i),
                samples: vec![],
                wakeups: vec![],
                threads: Map::new(),
                thread_totals: vec![
                    thread(8, "worker-1", [100_000, 0, 900_000, 0, 0, 0]),
                    thread(9, "worker-2", [500_000, 500_000, 0, 0, 0, 0]),
                    thread(10, "main", [0, 0, 0, 0, 1_000_000, 0]),
                    thread(11, "capped", [250_000, 0, 0, 0, 0, 750_000]),
                ],
                runq_hists: vec![],
                processes: Map::from([(7, Arc::from("app"))]),
                containers: Default::default(),
                origins: Default::default(),
                kept_off: Default::default(),
                sleeps: Default::default(),
                stats: [0; crate::profile::model::state::STAT_COUNTERS],
                spans: Default::default(),
            });
        }
        let r = report(&store.snapshot(), 7, Window::last(30, end)).unwrap();
        assert_eq!(r.comm, "app");
        assert_eq!(r.threads.len(), 4);
        let w1 = r.threads.iter().find(|t| t.tid == 8).unwrap();
        assert_eq!(
            (w1.time.cpu_us, w1.time.futex_us, w1.time.wall_us),
            (200, 1800, 2000)
        );
        assert_eq!(w1.pool, "worker-*");
        assert_eq!(w1.time.switches, 8);
        let pool = r.pools.iter().find(|p| p.pool == "worker-*").unwrap();
        assert_eq!((pool.threads, pool.time.wall_us), (2, 4000));
        assert_eq!(r.process.wall_us, 8000);
        let capped = r.threads.iter().find(|t| t.tid == 11).unwrap();
        assert_eq!(
            (capped.time.throttled_us, capped.time.wall_us),
            (1500, 2000)
        );
        assert_eq!(r.process.throttled_us, 1500);
        assert!(report(&store.snapshot(), 8, Window::last(30, end)).is_none());
        let text = render_text(&r);
        assert!(text.contains("worker-1") && text.contains("90.0"), "{text}");
        assert!(text.lines().next().is_some_and(|l| !l.is_empty()));
        let header = text.lines().nth(1).unwrap();
        assert!(header.contains("sleep% thrtl%"), "{header}");
        let row = text.lines().find(|l| l.contains("capped")).unwrap();
        assert!(
            row.contains("  25.0    0.0    0.0    0.0    0.0   75.0"),
            "{row}"
        );
        let json = serde_json::to_value(capped).unwrap();
        assert_eq!(json["throttled_us"], 1500);
    }

    #[test]
    fn interval_quantiles_read_as_estimates() {
        let mut r = empty_report(
            7,
            LiveProcess {
                comm: "app".into(),
                threads: vec![(8, "worker-1".into())],
            },
            Window::last(30, SystemTime::UNIX_EPOCH),
            "none".into(),
        );
        r.threads[0].sleeps = Some(super::super::sleeps::SleepSummary {
            intervals: 40,
            median_us: 1536.0,
            p90_us: 250_000.0,
            approx: true,
            woken_by: Vec::new(),
        });
        let text = render_text(&r);
        let row = text.lines().last().unwrap();
        assert!(row.contains("~1.5 ms") && row.contains("~250 ms"), "{text}");
        let json = serde_json::to_value(&r.threads[0]).unwrap();
        assert_eq!(json["sleeps"]["approx"], true);
    }
}
