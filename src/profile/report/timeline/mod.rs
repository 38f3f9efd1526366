//! Thread-state timeline (`/timeline`): for each thread (or pool) of a
//! process, its time by state in each stored slice of a window, so a page
//! can draw one row per thread with time across.
//!
//! Bounded for processes of any size: at most [`MAX_COLUMNS`] columns
//! (neighbouring slices merged when the window holds more) and `limit`
//! rows, the longest-lived first; the rest are counted, not sent.

use std::{
    collections::{HashMap, HashSet},
    time::SystemTime,
};

use serde::Serialize;

use crate::{
    profile::model::state::State,
    profile::model::{kind::pool_name, store::Snapshot, window::Window, Slice},
};

/// Most columns one answer has.
pub const MAX_COLUMNS: usize = 120;
/// Rows sent unless the query asks for another number.
pub const DEFAULT_ROWS: usize = 200;
/// Most rows one answer may have.
pub const MAX_ROWS: usize = 2_000;

/// One column: a stretch of time (one or more stored slices).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Column {
    /// Unix milliseconds.
    pub start_ms: u64,
    pub end_ms: u64,
}

/// One thread's (or pool's) row.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Row {
    /// The thread; absent for a pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    pub name: String,
    pub pool: String,
    /// Threads in the row (1 for a thread).
    pub threads: usize,
    pub wall_ms: u64,
    /// Per column, milliseconds in each state of [`Timeline::states`].
    pub cells: Vec<[u32; State::COUNT]>,
}

/// The `/timeline` answer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Timeline {
    pub pid: u32,
    pub comm: String,
    pub group: &'static str,
    pub seconds: u64,
    /// Seconds of the window the daemon has records of
    /// (`recorded_seconds`: less than `seconds` when the window reaches
    /// before them), their resolution, oldest first (`resolution`), and
    /// the exact span held (`covered`).
    #[serde(flatten)]
    pub recorded: crate::profile::model::store::Recorded,
    /// State names, in the order of each cell's figures.
    pub states: Vec<&'static str>,
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
    /// Rows not sent (past `limit`), with the time they hold.
    pub rows_left_out: usize,
    pub left_out_wall_ms: u64,
}

/// Whether rows are threads or pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    Thread,
    Pool,
}

impl Grouping {
    fn name(self) -> &'static str {
        match self {
            Grouping::Thread => "thread",
            Grouping::Pool => "pool",
        }
    }
}

struct Acc {
    tid: Option<u32>,
    name: String,
    pool: String,
    tids: HashSet<u32>,
    ns: Vec<[u64; State::COUNT]>,
}

/// Unix milliseconds, rounded up: a column's bounds given back as `from`
/// and `until` then select exactly its slices (a window holds the slices
/// that end in `(from, until]`). Rounded down, they selected the slice
/// before.
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos().div_ceil(1_000_000) as u64)
        .unwrap_or(0)
}

/// Columns over `slices` (oldest first), and each slice's column: runs of
/// consecutive slices spanning at most the window's length over
/// [`MAX_COLUMNS`] (widened by a quarter until there are at most that
/// many: drains are not exactly a second apart). Slices the
/// store merged (10 s, 60 s: see [`crate::profile::model::store::Store`]) are
/// columns of their own when wider.
fn columns(slices: &[&Slice], window: Window) -> (Vec<usize>, Vec<Column>) {
    let mut width_ms = window.length().as_millis() as u64 / MAX_COLUMNS as u64;
    loop {
        let mut of = Vec::with_capacity(slices.len());
        let mut columns: Vec<Column> = Vec::new();
        for s in slices {
            let (start_ms, end_ms) = (unix_ms(s.start), unix_ms(s.end));
            match columns.last_mut() {
                Some(c) if end_ms.saturating_sub(c.start_ms) <= width_ms => c.end_ms = end_ms,
                _ => columns.push(Column { start_ms, end_ms }),
            }
            of.push(columns.len() - 1);
        }
        if columns.len() <= MAX_COLUMNS {
            return (of, columns);
        }
        width_ms = (width_ms + width_ms / 4).max(1_000);
    }
}

/// The timeline of `pid` within `window`, rows by `group`, at most `limit`
/// of them; `None` when nothing was recorded for it.
pub fn timeline(
    store: &Snapshot,
    pid: u32,
    window: Window,
    group: Grouping,
    limit: usize,
) -> Option<Timeline> {
    let held: Vec<_> = store.within(window).collect();
    let slices: Vec<&Slice> = held.iter().map(|s| &**s).collect();
    let (column_of, columns) = columns(&slices, window);
    let mut names: HashMap<u32, String> = HashMap::new();
    let mut comm = None;
    for slice in &slices {
        for t in slice.thread_totals.iter().filter(|t| t.pid == pid) {
            let name = slice.threads.get(&t.tid).map(|i| i.name.to_string());
            names.insert(t.tid, name.unwrap_or_else(|| t.comm.clone()));
        }
        if let Some(name) = slice.processes.get(&pid) {
            comm = Some(name.to_string());
        }
    }
    if names.is_empty() {
        return None;
    }
    let mut rows: HashMap<String, Acc> = HashMap::new();
    for (i, slice) in slices.iter().enumerate() {
        let column = column_of[i];
        for t in slice.thread_totals.iter().filter(|t| t.pid == pid) {
            let name = &names[&t.tid];
            let pool = pool_name(name);
            let key = match group {
                Grouping::Thread => t.tid.to_string(),
                Grouping::Pool => pool.clone(),
            };
            let acc = rows.entry(key).or_insert_with(|| Acc {
                tid: (group == Grouping::Thread).then_some(t.tid),
                name: match group {
                    Grouping::Thread => name.clone(),
                    Grouping::Pool => pool.clone(),
                },
                pool,
                tids: HashSet::new(),
                ns: vec![[0; State::COUNT]; columns.len()],
            });
            acc.tids.insert(t.tid);
            for (sum, ns) in acc.ns[column].iter_mut().zip(t.counters.ns) {
                *sum += ns;
            }
        }
    }
    let mut rows: Vec<Row> = rows.into_values().map(finish).collect();
    rows.sort_by(|a, b| {
        b.wall_ms
            .cmp(&a.wall_ms)
            .then_with(|| a.name.cmp(&b.name))
            .then(a.tid.cmp(&b.tid))
    });
    let left: Vec<Row> = rows.split_off(rows.len().min(limit));
    Some(Timeline {
        comm: comm.unwrap_or_default(),
        recorded: Default::default(),
        columns,
        rows,
        rows_left_out: left.len(),
        left_out_wall_ms: left.iter().map(|r| r.wall_ms).sum(),
        ..Timeline::empty(pid, window, group)
    })
}

impl Timeline {
    /// The answer for a known process with nothing in `window`.
    pub fn empty(pid: u32, window: Window, group: Grouping) -> Timeline {
        Timeline {
            pid,
            comm: String::new(),
            group: group.name(),
            seconds: window.seconds(),
            recorded: Default::default(),
            states: State::ALL.iter().map(|s| s.name()).collect(),
            columns: Vec::new(),
            rows: Vec::new(),
            rows_left_out: 0,
            left_out_wall_ms: 0,
        }
    }
}

fn finish(acc: Acc) -> Row {
    let ms = |ns: u64| u32::try_from(ns / 1_000_000).unwrap_or(u32::MAX);
    let wall_ns: u64 = acc.ns.iter().flatten().sum();
    Row {
        tid: acc.tid,
        name: acc.name,
        pool: acc.pool,
        threads: acc.tids.len(),
        wall_ms: wall_ns / 1_000_000,
        cells: acc.ns.iter().map(|c| c.map(ms)).collect(),
    }
}

#[cfg(test)]
mod tests;
