//! `/host`: the host in one answer: how many CPUs, how busy they were,
//! how long threads waited for them, which cgroups ran out of quota, and
//! which processes waited most for a CPU with who kept it from them.

use std::{
    collections::HashMap,
    fmt::Write as _,
    time::{Duration, SystemTime},
};

use serde::Serialize;

use super::{
    culprits::{self, Culprit},
    disclosure::Sight,
    durations,
    host_facts::HostFacts,
    processes::{self, SortBy},
    query::ns_to_us,
    runqueue, stuck,
    throttling::{self, duration, Throttling},
};
use crate::{
    profile::model::state::State,
    profile::model::{live::LiveView, store::Snapshot, window::Window},
};

/// Processes listed as waiting most for a CPU.
pub const STARVED: usize = 5;
/// Culprits listed per such process (and a `[rest]`).
const CULPRITS: usize = 3;
/// How long a thread has been held up before the summary counts it.
pub const STUCK_MIN: Duration = Duration::from_secs(10);
/// Processes listed with held-up threads.
pub const STUCK_PROCESSES: usize = 10;
/// Processes whose kernel-thread flag one report reads, at most (each is a
/// read of `/proc`); past that, threads in I/O are counted as they are.
const KERNEL_CHECKS: usize = 256;

/// CPU time of every thread in a window, over the time it spans.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuUse {
    /// CPUs online.
    pub cpus: u32,
    /// CPU time of all threads (kernel threads included; interrupts not).
    pub busy_us: u64,
    /// The time the window's slices span.
    pub span_us: u64,
    /// `busy_us` over `cpus` x `span_us`, to three decimals.
    pub utilization: f64,
}

/// One process that waited for a CPU.
#[derive(Debug, Clone, Serialize)]
pub struct Starved {
    pub pid: u32,
    pub comm: String,
    /// Its time in a runqueue, all threads summed.
    pub runqueue_us: u64,
    /// Its time on a CPU.
    pub cpu_us: u64,
    /// Who ran meanwhile (see [`culprits`]).
    pub kept_off_cpu_by: Vec<Culprit>,
}

/// A process with threads held up now (see [`stuck_now`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StuckProcess {
    pub pid: u32,
    pub comm: String,
    /// Its threads held up for at least [`STUCK_MIN`].
    pub threads: usize,
    /// The longest of them, in seconds.
    pub longest_s: f64,
}

/// Threads held up at the last drain: blocked for at least [`STUCK_MIN`]
/// in I/O, or on a futex in a lock or a join ([`stuck::held_up`]); kernel
/// threads and threads waiting for work, a poll or a timer are not.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct StuckNow {
    pub min_s: u64,
    /// Every such thread of the host (of the processes the asker sees).
    pub threads: usize,
    /// Their processes, most such threads first, at most
    /// [`STUCK_PROCESSES`].
    pub processes: Vec<StuckProcess>,
}

/// What `/host` answers.
#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    /// The window in words (`last 30 s`, or its range).
    pub window: String,
    pub seconds: u64,
    pub recorded_seconds: u64,
    #[serde(flatten)]
    pub cpu: CpuUse,
    /// Runqueue waits of every thread: how many, and their p99.
    pub runqueue_waits: u64,
    pub runqueue_p99_us: f64,
    /// Time all threads spent waiting for a CPU.
    pub runqueue_us: u64,
    /// Cgroups that ran out of CPU quota in the window (and still
    /// exist), and each of them named: its path in the `cpu` controller's
    /// hierarchy, quota, members (at most [`throttling::LISTED_CGROUPS`];
    /// for a local user, those with a member of theirs).
    pub throttled_cgroups: u64,
    pub throttled: Vec<Throttling>,
    /// History the store holds, and the retention it aims at.
    pub history_s: u64,
    pub retention_s: u64,
    /// The processes that waited most for a CPU, most first (those the
    /// asker may see), at most [`STARVED`].
    pub starved: Vec<Starved>,
    /// Threads held up now.
    pub stuck: StuckNow,
}

/// CPUs online (1 if the kernel will not say).
pub fn online_cpus() -> u32 {
    // SAFETY: sysconf reads a system constant; no memory is passed.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(n).ok().filter(|n| *n > 0).unwrap_or(1)
}

/// The CPU time of every thread within `window` over what its slices span.
pub fn cpu_use(store: &Snapshot, window: Window, cpus: u32) -> CpuUse {
    let (mut busy_ns, mut span_ns) = (0u64, 0u64);
    for slice in store.within(window) {
        let span = slice.end.duration_since(slice.start).unwrap_or_default();
        span_ns += span.as_nanos() as u64;
        busy_ns += slice
            .thread_totals
            .iter()
            .map(|t| t.counters.ns[State::Cpu as usize])
            .sum::<u64>();
    }
    let capacity = span_ns as f64 * f64::from(cpus);
    let utilization = if capacity > 0.0 {
        (busy_ns as f64 / capacity * 1000.0).round() / 1000.0
    } else {
        0.0
    };
    CpuUse {
        cpus,
        busy_us: ns_to_us(busy_ns),
        span_us: ns_to_us(span_ns),
        utilization,
    }
}

/// The host report of `window`; `sight` says which processes the asker
/// may see named.
pub fn report(
    store: &Snapshot,
    host: &dyn HostFacts,
    window: Window,
    cpus: u32,
    recorded_seconds: u64,
    history_s: u64,
    sight: &Sight,
) -> HostReport {
    let runq = runqueue::host_report(store, window);
    let mut throttled = throttling::host_wide(store, host, window, sight);
    let throttled_cgroups = throttled.len() as u64;
    // A cgroup's path can name its owner (a user's slice, a container): a
    // reader who sees none of its members reads it as a count only.
    throttled.retain(|t| !sight.limited() || !t.members.is_empty());
    let mut rows = processes::processes(
        store,
        window,
        SortBy::State(State::Runqueue),
        (None, None),
        sight,
    );
    let now = SystemTime::now();
    rows.retain(|r| r.time.runqueue_us > 0 && sight.sees(r.pid, now));
    rows.truncate(STARVED);
    let pids: Vec<u32> = rows.iter().map(|r| r.pid).collect();
    let mut kept = culprits::by_process(store, window, &pids, CULPRITS, sight);
    let starved = rows
        .iter()
        .map(|r| Starved {
            pid: r.pid,
            comm: r.comm.clone(),
            runqueue_us: r.time.runqueue_us,
            cpu_us: r.time.cpu_us,
            kept_off_cpu_by: kept.remove(&r.pid).unwrap_or_default(),
        })
        .collect();
    HostReport {
        window: window.describe(),
        seconds: window.seconds(),
        recorded_seconds,
        cpu: cpu_use(store, window, cpus),
        runqueue_waits: runq.as_ref().map_or(0, |r| r.count),
        runqueue_p99_us: runq.as_ref().map_or(0.0, |r| r.p99_us),
        runqueue_us: runq.as_ref().map_or(0, |r| r.total_us),
        throttled_cgroups,
        throttled,
        history_s,
        retention_s: store.retention().as_secs(),
        starved,
        stuck: StuckNow::default(),
    }
}

/// The threads of `live` held up for at least [`STUCK_MIN`], of the
/// processes `sees` lets the asker see; `is_kernel` says whether a pid is
/// a kernel thread (asked only of threads in I/O: a kernel thread never
/// waits on a futex).
pub fn stuck_now(
    live: &LiveView,
    sees: impl Fn(u32) -> bool,
    mut is_kernel: impl FnMut(u32) -> bool,
) -> StuckNow {
    let mut kernel: HashMap<u32, bool> = HashMap::new();
    let mut by_pid: HashMap<u32, StuckProcess> = HashMap::new();
    let mut threads = 0;
    for t in live.threads.iter().filter(|t| t.in_state >= STUCK_MIN) {
        if !matches!(t.state, State::Io | State::Futex) || !sees(t.pid) {
            continue;
        }
        if t.state == State::Io {
            let room = kernel.len() < KERNEL_CHECKS;
            let is = match kernel.get(&t.pid) {
                Some(is) => *is,
                None if room => *kernel.entry(t.pid).or_insert_with(|| is_kernel(t.pid)),
                None => false,
            };
            if is {
                continue;
            }
        }
        let stack: Vec<String> = t.stack.iter().rev().map(|f| f.to_string()).collect();
        if !stuck::held_up(t.state, &stack) {
            continue;
        }
        threads += 1;
        let p = by_pid.entry(t.pid).or_insert_with(|| StuckProcess {
            pid: t.pid,
            comm: live
                .processes
                .get(&t.pid)
                .map(|n| n.to_string())
                .unwrap_or_default(),
            threads: 0,
            longest_s: 0.0,
        });
        p.threads += 1;
        p.longest_s = p.longest_s.max(t.in_state.as_secs_f64().round());
    }
    let mut processes: Vec<StuckProcess> = by_pid.into_values().collect();
    processes.sort_by(|a, b| {
        b.threads
            .cmp(&a.threads)
            .then(b.longest_s.total_cmp(&a.longest_s))
            .then(a.pid.cmp(&b.pid))
    });
    processes.truncate(STUCK_PROCESSES);
    StuckNow {
        min_s: STUCK_MIN.as_secs(),
        threads,
        processes,
    }
}

/// The report as text: the summary line, then the starved processes.
pub fn render_text(r: &HostReport) -> String {
    let mut out = format!(
        "host, {}: {} CPUs, {:.0}% busy, runqueue p99 ~{:.1} ms ({} waits, {} in all), {} cgroups throttled, {} threads held up > {} s, history {} of {} s\n",
        r.window,
        r.cpu.cpus,
        r.cpu.utilization * 100.0,
        r.runqueue_p99_us / 1e3,
        r.runqueue_waits,
        durations::micros(r.runqueue_us),
        r.throttled_cgroups,
        r.stuck.threads,
        r.stuck.min_s,
        r.history_s,
        r.retention_s,
    );
    for t in &r.throttled {
        let _ = writeln!(
            out,
            "throttled: {}, using {:.2} CPU; {} throttled, {:.0} % of periods; {} members",
            throttling::describe_cgroup(t),
            t.cpus_used,
            duration(t.throttled_us),
            t.share_of_periods_throttled * 100.0,
            t.member_count
        );
    }
    for p in &r.stuck.processes {
        let _ = writeln!(
            out,
            "held up now: {} (pid {}): {} threads, longest {}",
            p.comm,
            p.pid,
            p.threads,
            durations::seconds(p.longest_s)
        );
    }
    if r.starved.is_empty() {
        return out;
    }
    out.push_str("waited most for a CPU:\n");
    for s in &r.starved {
        let _ = write!(
            out,
            "  {} (pid {}): {} in the runqueue, {} on CPU; kept off by",
            s.comm,
            s.pid,
            durations::micros(s.runqueue_us),
            durations::micros(s.cpu_us)
        );
        for c in &s.kept_off_cpu_by {
            let _ = write!(out, " {} {:.0}%,", c.label(), c.share * 100.0);
        }
        out.pop();
        out.push('\n');
    }
    out
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
