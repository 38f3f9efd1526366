//! Short-lived threads of one pool folded into one `/threads` row: a JVM
//! that starts a thread per request lists thousands of threads that each
//! lived a fraction of the window. Threads whose names differ only by
//! their final number (one [`pool_name`]) and that lived a short part of
//! the window (see [`short_lived`]) become one row with their count,
//! summed time and lifetimes; threads that lived through it keep their
//! rows.

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::{
    durations,
    threads::{Breakdown, ThreadReport, ThreadRow},
};
use crate::profile::model::{kind::pool_name, state::is_merged_tid, store::merge::is_pool_tid};

/// Tids listed per folded row, at most (the lowest: the first started).
pub const LISTED_TIDS: usize = 5;

/// Short-lived threads of a pool fold when there are at least this many.
const FOLD_FROM: usize = 2;

/// The short-lived threads of one pool.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FoldedThreads {
    /// `pool-1-thread-*`.
    pub pool: String,
    /// How many threads it folds.
    pub threads: usize,
    /// The lowest of their tids (at most [`LISTED_TIDS`]).
    pub tids: Vec<u32>,
    /// Their time and events, summed.
    #[serde(flatten)]
    pub time: Breakdown,
    /// How long they lived within the window (their wall time: exact).
    pub lifetime_ms: Lifetime,
    /// Of them, those started within the window, per second of the span
    /// the process was seen in.
    pub births_per_s: f64,
    /// Of their futex time, what they spent waiting for a Python GIL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gil_us: Option<u64>,
}

/// Shortest, median (the lower one of an even count) and longest, in ms:
/// exact, from each thread's own time.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Lifetime {
    pub min: f64,
    pub p50: f64,
    pub max: f64,
}

/// Whether `t` is a thread, not a row the store or the collector merged
/// already.
fn is_thread(t: &ThreadRow) -> bool {
    !is_pool_tid(t.tid) && !is_merged_tid(t.tid)
}

/// Whether thread `t` is short-lived: it lived (its wall time: every
/// moment of a thread is in one state) less than half as long as the
/// longest-lived thread of its process in the window, `longest_us`. A
/// fixed pool started with the process is not, whenever the window
/// begins; a thread per request is.
fn short_lived(t: &ThreadRow, longest_us: u64) -> bool {
    is_thread(t) && t.time.wall_us.saturating_mul(2) < longest_us
}

/// Folds `report`'s short-lived threads, pool by pool, into
/// [`ThreadReport::folded`] (heaviest first); pools with fewer than two of
/// them keep their rows.
pub fn fold(report: &mut ThreadReport) {
    let longest_us = report
        .threads
        .iter()
        .filter(|t| is_thread(t))
        .map(|t| t.time.wall_us)
        .max()
        .unwrap_or(0);
    let mut pools: BTreeMap<String, Vec<ThreadRow>> = BTreeMap::new();
    let mut kept = Vec::with_capacity(report.threads.len());
    for t in report.threads.drain(..) {
        match short_lived(&t, longest_us) {
            true => pools.entry(pool_name(&t.name)).or_default().push(t),
            false => kept.push(t),
        }
    }
    for (pool, members) in pools {
        if members.len() < FOLD_FROM {
            kept.extend(members);
            continue;
        }
        report.folded.push(folded(pool, &members, report.seen_us));
    }
    kept.sort_by(|a, b| b.time.wall_us.cmp(&a.time.wall_us).then(a.tid.cmp(&b.tid)));
    report.threads = kept;
    report.folded.sort_by(|a, b| {
        b.time
            .wall_us
            .cmp(&a.time.wall_us)
            .then_with(|| a.pool.cmp(&b.pool))
    });
}

fn folded(pool: String, members: &[ThreadRow], seen_us: u64) -> FoldedThreads {
    let mut time = Breakdown::default();
    for t in members {
        add(&mut time, &t.time);
    }
    let mut tids: Vec<u32> = members.iter().map(|t| t.tid).collect();
    tids.sort_unstable();
    tids.truncate(LISTED_TIDS);
    let mut lives: Vec<u64> = members.iter().map(|t| t.time.wall_us).collect();
    lives.sort_unstable();
    let ms = |us: u64| us as f64 / 1000.0;
    let born = members.iter().filter(|t| t.life.born).count();
    let births_per_s = match seen_us {
        0 => 0.0,
        us => (born as f64 / (us as f64 / 1e6) * 100.0).round() / 100.0,
    };
    let gil: Vec<u64> = members.iter().filter_map(|t| t.gil_us).collect();
    FoldedThreads {
        pool,
        threads: members.len(),
        tids,
        time,
        lifetime_ms: Lifetime {
            min: ms(lives[0]),
            p50: ms(lives[(lives.len() - 1) / 2]),
            max: ms(lives[lives.len() - 1]),
        },
        births_per_s,
        gil_us: (!gil.is_empty()).then(|| gil.iter().sum()),
    }
}

fn add(into: &mut Breakdown, t: &Breakdown) {
    into.cpu_us += t.cpu_us;
    into.runqueue_us += t.runqueue_us;
    into.futex_us += t.futex_us;
    into.io_us += t.io_us;
    into.sleep_us += t.sleep_us;
    into.throttled_us += t.throttled_us;
    into.wall_us += t.wall_us;
    into.switches += t.switches;
    into.switches_involuntary += t.switches_involuntary;
    into.wakeups_sent += t.wakeups_sent;
    into.wakeups_received += t.wakeups_received;
}

/// The folded pools' lifetimes and births, under a header; nothing when
/// none was folded.
pub fn render_lifetimes(out: &mut String, r: &ThreadReport) {
    if r.folded.is_empty() {
        return;
    }
    let threads: usize = r.folded.iter().map(|f| f.threads).sum();
    let _ = writeln!(
        out,
        "\nshort-lived threads ({threads}, folded by pool; fold=off lists each):\n{:>8}  {:<28} {:>10} {:>10} {:>10} {:>9}  FIRST TIDS",
        "THREADS", "POOL", "lived min", "median", "max", "births/s"
    );
    for f in &r.folded {
        let ms = |v: f64| durations::micros((v * 1000.0).round() as u64);
        let tids: Vec<String> = f.tids.iter().map(u32::to_string).collect();
        let more = if f.threads > f.tids.len() { ",…" } else { "" };
        let _ = writeln!(
            out,
            "{:>8}  {:<28} {:>10} {:>10} {:>10} {:>9.2}  {}{more}",
            f.threads,
            super::threads::truncate(&f.pool, 28),
            ms(f.lifetime_ms.min),
            ms(f.lifetime_ms.p50),
            ms(f.lifetime_ms.max),
            f.births_per_s,
            tids.join(","),
        );
    }
}

#[cfg(test)]
#[path = "thread_fold_tests.rs"]
mod tests;
