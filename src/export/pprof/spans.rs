//! The time of a profile's rows spent under OpenTelemetry spans, split
//! off into rows of their own that carry the span's labels (`trace_id`,
//! `span_id`, `attr.NAME`), as Pyroscope's span profiles and
//! trace-to-profile links read them. The span rows of the spans' store
//! are also in the main rows: what a span row takes is taken from the
//! main row of the same thread, state and stack (at most its time), so
//! nothing counts twice.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::profile::{
    model::{
        spans::{SpanId, SpanRecord},
        state::State,
        store::Snapshot,
        Stack,
    },
    report::{query::Filter, rows::Row},
};

/// The span a row's time was spent under.
#[derive(Debug, Clone)]
pub struct SpanTag {
    pub span: SpanId,
    pub record: Option<Arc<SpanRecord>>,
}

/// One thread's time under one span with one stack, not yet taken.
struct Part {
    tid: u32,
    tag: Arc<SpanTag>,
    ns: u64,
    count: u64,
}

type Parts = FxHashMap<(u32, State, Stack), Vec<Part>>;

/// The span rows of `filter`'s window and threads, by process, state and
/// stack.
fn parts(store: &Snapshot, filter: &Filter) -> Parts {
    let mut parts: Parts = FxHashMap::default();
    let mut tags: FxHashMap<(u32, SpanId), Arc<SpanTag>> = FxHashMap::default();
    for bucket in store.span_view().within(filter.window) {
        for s in &bucket.samples {
            if !filter.matches(s.pid, s.tid) || !filter.kind.includes(s.state) {
                continue;
            }
            let tag = tags.entry((s.pid, s.span)).or_insert_with(|| {
                Arc::new(SpanTag {
                    span: s.span,
                    record: bucket.records.get(&(s.pid, s.span)).cloned(),
                })
            });
            let list = parts.entry((s.pid, s.state, s.stack.clone())).or_default();
            match list
                .iter_mut()
                .find(|p| p.tid == s.tid && p.tag.span == s.span)
            {
                Some(p) => (p.ns, p.count) = (p.ns + s.ns, p.count + s.count),
                None => list.push(Part {
                    tid: s.tid,
                    tag: tag.clone(),
                    ns: s.ns,
                    count: s.count,
                }),
            }
        }
    }
    parts
}

/// `rows` with the time each spent under spans split off into rows of
/// its own, each with its span's tag; the others untagged.
pub fn split(
    store: &Snapshot,
    filter: &Filter,
    rows: Vec<Row>,
) -> Vec<(Row, Option<Arc<SpanTag>>)> {
    let mut parts = parts(store, filter);
    if parts.is_empty() {
        return rows.into_iter().map(|r| (r, None)).collect();
    }
    let mut out = Vec::with_capacity(rows.len());
    for mut row in rows {
        let key = row
            .state
            .filter(|_| row.leaf.is_none() && row.interrupt.is_none());
        let list = key.and_then(|state| parts.get_mut(&(row.pid, state, row.stack.clone())));
        for part in list.into_iter().flatten() {
            // A row merged per process (tid 0) takes every thread's part.
            if (row.tid != 0 && part.tid != row.tid) || part.ns == 0 || row.ns == 0 {
                continue;
            }
            let ns = part.ns.min(row.ns);
            let count = part.count.min(row.count);
            part.ns -= ns;
            part.count -= count;
            row.ns -= ns;
            row.count -= count;
            let tagged = Row {
                ns,
                count,
                ..row.clone()
            };
            out.push((tagged, Some(part.tag.clone())));
        }
        if row.ns > 0 || row.count > 0 {
            out.push((row, None));
        }
    }
    out
}
