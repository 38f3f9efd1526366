//! `/spans`: where the time of each OpenTelemetry span of a process went
//! (its threads' wall time by state, its stacks), from the spans' store
//! ([`crate::profile::model::spans_store`]); one span's detail by id; and
//! the aggregates the store folded older spans into.

mod collect;
pub mod select;
#[cfg(test)]
mod tests;
pub mod text;

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::Serialize;

pub use collect::{spans_of, SpanSeen};
use select::SpanMatch;

use super::{
    answer::{unknown_pid, Answer, Refusal},
    disclosure::Sight,
    host_facts::HostFacts,
    query::ns_to_us,
};
use crate::profile::model::{
    spans::SpanId, spans_store::SpanStats, state::State, store::Snapshot, window::Window,
};

/// Stacks each span of a list shows.
pub const TOP_STACKS: usize = 3;

/// How a list is sorted: most wall time, or most time in one state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    Wall,
    State(State),
}

impl SortBy {
    pub const NAMES: [&'static str; 7] = [
        "wall",
        "cpu",
        "runqueue",
        "throttled",
        "futex",
        "io",
        "sleep",
    ];

    /// From one of [`Self::NAMES`].
    pub fn parse(name: &str) -> Option<SortBy> {
        if name == "wall" {
            return Some(SortBy::Wall);
        }
        State::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .map(SortBy::State)
    }

    fn key(self, s: &SpanSeen) -> u64 {
        match self {
            SortBy::Wall => s.wall_ns(),
            SortBy::State(state) => s.ns[state as usize],
        }
    }
}

/// What a `/spans` query asks.
#[derive(Debug, Clone)]
pub struct Asked {
    pub pid: u32,
    pub window: Window,
    pub sort: SortBy,
    pub limit: Option<usize>,
    pub spans: SpanMatch,
}

/// Time by state, in microseconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct StatesUs {
    pub cpu: u64,
    pub runqueue: u64,
    pub throttled: u64,
    pub futex: u64,
    pub io: u64,
    pub sleep: u64,
}

impl StatesUs {
    pub fn of(ns: &[u64; State::COUNT]) -> StatesUs {
        let us = |s: State| ns_to_us(ns[s as usize]);
        StatesUs {
            cpu: us(State::Cpu),
            runqueue: us(State::Runqueue),
            throttled: us(State::Throttled),
            futex: us(State::Futex),
            io: us(State::Io),
            sleep: us(State::Sleep),
        }
    }
}

/// A stack's time in one state under a span.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StackUs {
    pub state: &'static str,
    /// Frames outermost first, `;`-separated.
    pub stack: String,
    pub us: u64,
}

/// One span as a list shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SpanRow {
    pub span_id: String,
    /// Empty when the span's record was not read.
    pub trace_id: String,
    pub flags: u8,
    pub attrs: BTreeMap<String, String>,
    /// The record had more attribute bytes than were kept.
    pub attrs_cut: bool,
    /// Sum over its threads of their time in every state.
    pub wall_us: u64,
    pub states_us: StatesUs,
    pub threads: Vec<u32>,
    /// Unix seconds.
    pub first_seen: f64,
    pub last_seen: f64,
    pub top_stacks: Vec<StackUs>,
}

/// Older spans, folded by the store per attribute set.
#[derive(Debug, Clone, Serialize)]
pub struct AggregateRow {
    pub attrs: BTreeMap<String, String>,
    /// Spans whose last time was folded here.
    pub spans: u64,
    pub wall_us: u64,
    pub states_us: StatesUs,
    /// Unix seconds of the newest time folded here.
    pub last_seen: f64,
}

/// `/spans`: a process's spans in a window.
#[derive(Debug, Clone, Serialize)]
pub struct SpansReport {
    pub pid: u32,
    pub process: Option<String>,
    pub window: WindowSecs,
    pub seconds: f64,
    pub sort: &'static str,
    pub spans: Vec<SpanRow>,
    /// Spans the query kept, before `limit`.
    pub spans_total: usize,
    pub rows_omitted: usize,
    pub aggregated: Vec<AggregateRow>,
    /// What the spans' store holds and dropped (the whole store's).
    pub dropped: SpanStats,
}

/// A window in unix seconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct WindowSecs {
    pub from: f64,
    pub until: f64,
}

/// One thread's time under a span.
#[derive(Debug, Clone, Serialize)]
pub struct SpanThread {
    pub tid: u32,
    pub wall_us: u64,
    pub states_us: StatesUs,
    pub first_seen: f64,
    pub last_seen: f64,
}

/// `/spans?span_id=`: one span in full.
#[derive(Debug, Clone, Serialize)]
pub struct SpanDetail {
    pub pid: u32,
    pub process: Option<String>,
    #[serde(flatten)]
    pub span: SpanRow,
    pub by_thread: Vec<SpanThread>,
    /// Every stack, most time first.
    pub stacks: Vec<StackUs>,
    /// The state timeline of the process over the span's time.
    pub timeline: String,
}

pub fn unix_secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn stacks_of(s: &SpanSeen, limit: usize) -> Vec<StackUs> {
    let mut stacks: Vec<_> = s.stacks.iter().collect();
    stacks.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    (stacks.into_iter().take(limit))
        .map(|((state, stack), ns)| StackUs {
            state: state.name(),
            stack: stack.join(";"),
            us: ns_to_us(*ns),
        })
        .collect()
}

fn row_of(s: &SpanSeen, stacks: usize) -> SpanRow {
    let record = s.record.as_deref();
    SpanRow {
        span_id: s.span.hex(),
        trace_id: record.map(|r| r.trace.hex()).unwrap_or_default(),
        flags: record.map_or(0, |r| r.flags),
        attrs: (record.iter().flat_map(|r| &r.attrs))
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        attrs_cut: record.is_some_and(|r| r.attrs_cut),
        wall_us: ns_to_us(s.wall_ns()),
        states_us: StatesUs::of(&s.ns),
        threads: s.threads.keys().copied().collect(),
        first_seen: unix_secs(s.first),
        last_seen: unix_secs(s.last),
        top_stacks: stacks_of(s, stacks),
    }
}

/// The name of `pid` in the newest slices of `window`.
fn process_name(store: &Snapshot, pid: u32, window: Window) -> Option<String> {
    let from = window.until.checked_sub(Duration::from_secs(2))?;
    let newest = Window::between(from.max(window.from), window.until);
    let slices: Vec<_> = store.within(newest).collect();
    (slices.iter().rev()).find_map(|s| s.processes.get(&pid).map(|n| n.to_string()))
}

/// Refuses a pid the reader may not see, or never seen, as not found.
fn check_pid(
    store: &Snapshot,
    host: &dyn HostFacts,
    pid: u32,
    window: Window,
    sight: &Sight,
) -> Result<(), Refusal> {
    let unknown = unknown_pid(store, host, pid);
    match unknown {
        Some(why) => Err(Refusal::NotFound(why)),
        None if !sight.sees(pid, window.until) => Err(Refusal::NotFound(format!(
            "unknown pid {pid}: no such process of yours"
        ))),
        None => Ok(()),
    }
}

/// The spans of `asked.pid` in its window, sorted and cut to its limit,
/// with the aggregates of its older spans.
pub fn list(
    store: &Snapshot,
    host: &dyn HostFacts,
    asked: &Asked,
    sight: &Sight,
) -> Result<Answer<SpansReport>, Refusal> {
    let (pid, window) = (asked.pid, asked.window);
    check_pid(store, host, pid, window, sight)?;
    let view = store.span_view();
    let mut seen: Vec<SpanSeen> = spans_of(view, pid, window, &asked.spans)
        .into_values()
        .collect();
    seen.sort_by(|a, b| {
        (asked.sort.key(b).cmp(&asked.sort.key(a))).then_with(|| a.span.cmp(&b.span))
    });
    let total = seen.len();
    let kept = asked.limit.unwrap_or(total).min(total);
    let spans = seen[..kept].iter().map(|s| row_of(s, TOP_STACKS)).collect();
    let mut aggregated: Vec<AggregateRow> = (view.aggregates.rows.iter())
        .filter(|((p, _), row)| *p == pid && row.last_end >= window.from)
        .filter(|((_, attrs), _)| {
            (asked.spans.attrs.iter())
                .all(|(n, v)| attrs.iter().any(|(a, b)| **a == **n && **b == **v))
        })
        .filter(|_| asked.spans.span.is_none() && asked.spans.trace.is_none())
        .map(|((_, attrs), row)| AggregateRow {
            attrs: (attrs.iter())
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            spans: row.spans,
            wall_us: ns_to_us(row.ns.iter().sum()),
            states_us: StatesUs::of(&row.ns),
            last_seen: unix_secs(row.last_end),
        })
        .collect();
    aggregated.sort_by(|a, b| {
        b.wall_us
            .cmp(&a.wall_us)
            .then_with(|| a.attrs.cmp(&b.attrs))
    });
    let sort = match asked.sort {
        SortBy::Wall => "wall",
        SortBy::State(s) => s.name(),
    };
    let body = SpansReport {
        pid,
        process: process_name(store, pid, window),
        window: WindowSecs {
            from: unix_secs(window.from),
            until: unix_secs(window.until),
        },
        seconds: window
            .until
            .duration_since(window.from)
            .unwrap_or_default()
            .as_secs_f64(),
        sort,
        spans,
        spans_total: total,
        rows_omitted: total - kept,
        aggregated,
        dropped: view.stats,
    };
    Ok(Answer::over_process(
        store,
        (window, Some(pid)),
        None,
        |_| body,
    ))
}

/// Span `span` of `pid` in `window`, in full; not found when the window
/// holds nothing of it.
pub fn detail(
    store: &Snapshot,
    host: &dyn HostFacts,
    (pid, span): (u32, SpanId),
    window: Window,
    sight: &Sight,
) -> Result<Answer<SpanDetail>, Refusal> {
    check_pid(store, host, pid, window, sight)?;
    let asked = SpanMatch {
        span: Some(span),
        ..SpanMatch::default()
    };
    let seen = spans_of(store.span_view(), pid, window, &asked);
    let Some(s) = seen.get(&span) else {
        return Err(Refusal::NotFound(format!(
            "span {} of pid {pid} not seen in the {} (older spans are kept only as aggregates)",
            span.hex(),
            window.describe()
        )));
    };
    let by_thread = (s.threads.iter())
        .map(|(tid, t)| SpanThread {
            tid: *tid,
            wall_us: ns_to_us(t.ns.iter().sum()),
            states_us: StatesUs::of(&t.ns),
            first_seen: unix_secs(t.first),
            last_seen: unix_secs(t.last),
        })
        .collect();
    // Whole seconds around the span: the timeline's resolution.
    let from = unix_secs(s.first).floor() as u64;
    let until = (unix_secs(s.last).ceil() as u64).max(from + 1);
    let body = SpanDetail {
        pid,
        process: process_name(store, pid, window),
        span: row_of(s, TOP_STACKS),
        by_thread,
        stacks: stacks_of(s, usize::MAX),
        timeline: format!("/timeline?pid={pid}&from={from}&until={until}"),
    };
    Ok(Answer::over_process(
        store,
        (window, Some(pid)),
        None,
        |_| body,
    ))
}
