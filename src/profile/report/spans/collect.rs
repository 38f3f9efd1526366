//! One pass over a window of the spans' store: each span of a process
//! with its time by state and thread, its seen times and its stacks.

use std::{collections::BTreeMap, sync::Arc, time::SystemTime};

use rustc_hash::FxHashMap;

use super::select::SpanMatch;
use crate::profile::model::{
    spans::{SpanId, SpanRecord},
    spans_store::SpanView,
    state::State,
    window::Window,
    Stack,
};

/// One thread's time under a span.
#[derive(Debug, Clone)]
pub struct ThreadTime {
    pub ns: [u64; State::COUNT],
    pub first: SystemTime,
    pub last: SystemTime,
}

/// What the window holds of one span.
#[derive(Debug, Clone)]
pub struct SpanSeen {
    pub span: SpanId,
    pub record: Option<Arc<SpanRecord>>,
    pub ns: [u64; State::COUNT],
    pub threads: BTreeMap<u32, ThreadTime>,
    pub first: SystemTime,
    pub last: SystemTime,
    /// Time by state and stack.
    pub stacks: FxHashMap<(State, Stack), u64>,
}

impl SpanSeen {
    pub fn wall_ns(&self) -> u64 {
        self.ns.iter().sum()
    }
}

fn add(into: &mut [u64; State::COUNT], ns: &[u64; State::COUNT]) {
    for (sum, ns) in into.iter_mut().zip(ns) {
        *sum += ns;
    }
}

/// The spans of `pid` in `window` that `asked` keeps, by id.
pub fn spans_of(
    view: &SpanView,
    pid: u32,
    window: Window,
    asked: &SpanMatch,
) -> FxHashMap<SpanId, SpanSeen> {
    let mut seen: FxHashMap<SpanId, SpanSeen> = FxHashMap::default();
    for bucket in view.within(window) {
        let record = |span: SpanId| bucket.records.get(&(pid, span));
        for t in bucket.times.iter().filter(|t| t.pid == pid) {
            let record = record(t.span);
            if !asked.keeps(t.span, record.map(|r| &**r)) {
                continue;
            }
            let (first, last) = (bucket.unix_of(t.first_ns), bucket.unix_of(t.last_ns));
            let s = seen.entry(t.span).or_insert_with(|| SpanSeen {
                span: t.span,
                record: record.cloned(),
                ns: [0; State::COUNT],
                threads: BTreeMap::new(),
                first,
                last,
                stacks: FxHashMap::default(),
            });
            if s.record.is_none() {
                s.record = record.cloned();
            }
            add(&mut s.ns, &t.ns);
            s.first = s.first.min(first);
            s.last = s.last.max(last);
            let thread = s.threads.entry(t.tid).or_insert(ThreadTime {
                ns: [0; State::COUNT],
                first,
                last,
            });
            add(&mut thread.ns, &t.ns);
            thread.first = thread.first.min(first);
            thread.last = thread.last.max(last);
        }
        for row in bucket.samples.iter().filter(|r| r.pid == pid) {
            // Stacks of the spans kept by their times only.
            if let Some(s) = seen.get_mut(&row.span) {
                *s.stacks.entry((row.state, row.stack.clone())).or_default() += row.ns;
            }
        }
    }
    seen
}
