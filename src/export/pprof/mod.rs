//! pprof profiles (`profile.proto`, gzipped) from the store, built from
//! the same rows as folded text ([`crate::profile::report::rows`]), so both add up
//! to the same total.
//!
//! Sample types (documented in docs/exports.md, "pprof"):
//! - `kind=cpu`: `samples/count`, `cpu/nanoseconds`, period
//!   `cpu/nanoseconds`, as Go's CPU profiles;
//! - every other state kind, `offcpu` and `wall`: `samples/count`,
//!   `wall/nanoseconds`, each sample labelled with its `state`;
//! - `kind=wakeup`: `wakeups/count`, `wakee_wait/nanoseconds`.
//!
//! Samples carry their process's container labels
//! ([`crate::process::container::Container::labels`]), and (`Threads`
//! detail) the time spent under an OpenTelemetry span its `trace_id`,
//! `span_id` and `attr.NAME` labels ([`spans`]).

mod admit;
pub mod proto;
mod spans;
mod tables;

use std::{collections::HashMap, io::Write as _, sync::Arc};

use flate2::{write::GzEncoder, Compression};
use prost::Message as _;

use crate::{
    profile::model::state::State,
    profile::{
        model::{
            kind::{pool_name, Group, Kind},
            store::Snapshot,
            window::unix_nanos,
        },
        report::{
            query::Filter,
            rows::{self, Names, Row},
        },
    },
    untrusted::refusals::{self, Reason, What},
};
pub use admit::MAX_TABLE_BYTES;
use proto::{Label, Profile, Sample, ValueType};
use spans::SpanTag;
pub use tables::FrameKind;
use tables::Tables;

/// Which labels samples carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// `pid`, `comm`, and by the filter's group `thread_id`, `thread_name`
    /// and `pool` (thread) or `pool` (pool); `state`.
    Threads,
    /// `state` only: for series stores that turn every distinct label set
    /// into a series of its own (Pyroscope).
    Series,
}

/// The sample types of a kind: `(type, unit)` for the count, then for the
/// time, which is the default.
pub fn sample_types(kind: Kind) -> [(&'static str, &'static str); 2] {
    match kind {
        Kind::State(State::Cpu) => [("samples", "count"), ("cpu", "nanoseconds")],
        Kind::Wakeup => [("wakeups", "count"), ("wakee_wait", "nanoseconds")],
        _ => [("samples", "count"), ("wall", "nanoseconds")],
    }
}

/// Rows a profile left out to stay within [`MAX_TABLE_BYTES`], merged
/// into one `[truncated]` sample per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cut {
    pub rows: usize,
    pub ns: u64,
}

/// The profile of what `filter` selects in `store`, within
/// [`MAX_TABLE_BYTES`].
pub fn build(store: &Snapshot, filter: &Filter, detail: Detail) -> Profile {
    build_within(store, filter, detail, MAX_TABLE_BYTES).0
}

/// The profile of what `filter` selects in `store`: the heaviest rows
/// whose tables fit `bytes`, the others merged (the cut, counted as a
/// query's budget spent).
pub fn build_within(
    store: &Snapshot,
    filter: &Filter,
    detail: Detail,
    bytes: usize,
) -> (Profile, Option<Cut>) {
    let per_thread = detail == Detail::Threads && filter.group != Group::Process;
    let (rows, names) = rows::select(store, filter, per_thread);
    let mut rows = match detail {
        Detail::Threads => spans::split(store, filter, rows),
        Detail::Series => rows.into_iter().map(|r| (r, None)).collect(),
    };
    // Rows come in hash order: sorted, equal windows give equal bytes.
    rows.sort_by(|(a, ta), (b, tb)| {
        let key = |r: &Row| {
            (
                r.pid,
                r.tid,
                r.state.map(|s| s as u8),
                r.interrupt.is_some(),
            )
        };
        key(a)
            .cmp(&key(b))
            .then_with(|| admit::stack_order(&a.stack, &b.stack))
            .then_with(|| a.leaf.cmp(&b.leaf))
            .then_with(|| {
                ta.as_ref()
                    .map(|t| t.span)
                    .cmp(&tb.as_ref().map(|t| t.span))
            })
    });
    let (rows, tags): (Vec<Row>, Vec<Option<Arc<SpanTag>>>) = rows.into_iter().unzip();
    let (kept, budget) = admit::admit(&rows, &names, bytes);
    let mut t = Tables::default();
    let mut profile = Profile::default();
    let types = sample_types(filter.kind);
    for (ty, unit) in types {
        let vt = ValueType {
            r#type: t.string(ty),
            unit: t.string(unit),
        };
        profile.sample_type.push(vt);
    }
    profile.default_sample_type = t.string(types[1].0);
    profile.period_type = Some(profile.sample_type[1]);
    profile.period = period(filter.kind, &rows);
    profile.time_nanos = unix_nanos(filter.window.from) as i64;
    profile.duration_nanos = filter.window.length().as_nanos() as i64;
    let comment = format!(
        "wallscope kind={} group={} {}",
        filter.kind.name(),
        filter.group.name(),
        filter.window.describe()
    );
    profile.comment.push(t.string(&comment));
    // Rows that differ only in what the labels leave out (two threads of a
    // pool, an off-CPU stack in two states under `Series`...) are one
    // sample.
    let mut samples: HashMap<(Vec<u64>, Vec<Label>), usize> = HashMap::new();
    let mut cut: Vec<(Option<State>, u64, u64)> = Vec::new();
    for ((row, tag), _) in rows.iter().zip(&tags).zip(&kept).filter(|(_, k)| **k) {
        let locations = locations(&mut t, row);
        let mut labels = labels(&mut t, &names, row, filter.group, detail);
        if let Some(tag) = tag {
            span_labels(&mut t, tag, &mut labels);
        }
        add(
            &mut profile,
            &mut samples,
            (locations, labels),
            (row.count, row.ns),
        );
    }
    let mut left_out = Cut::default();
    for (row, _) in rows.iter().zip(&kept).filter(|(_, k)| !**k) {
        left_out.rows += 1;
        left_out.ns += row.ns;
        match cut.iter_mut().find(|c| c.0 == row.state) {
            Some(c) => (c.1, c.2) = (c.1 + row.count, c.2 + row.ns),
            None => cut.push((row.state, row.count, row.ns)),
        }
    }
    for (state, count, ns) in cut {
        let locations = vec![t.location(TRUNCATED)];
        let labels = state
            .map(|s| vec![t.label("state", s.name())])
            .unwrap_or_default();
        add(&mut profile, &mut samples, (locations, labels), (count, ns));
    }
    if budget.exhausted() {
        refusals::count(What::Query, Reason::Budget);
        let note = format!(
            "wallscope truncated: {} rows ({} ns) past the profile's {bytes} bytes, merged into {TRUNCATED}",
            left_out.rows, left_out.ns
        );
        profile.comment.push(t.string(&note));
    }
    t.fill(&mut profile);
    (profile, (left_out.rows > 0).then_some(left_out))
}

/// The frame that carries the time of the rows a profile left out.
pub const TRUNCATED: &str = "[truncated]";

/// Adds a count and a time to the sample of `locations` and `labels`.
fn add(
    profile: &mut Profile,
    samples: &mut HashMap<(Vec<u64>, Vec<Label>), usize>,
    (locations, labels): (Vec<u64>, Vec<Label>),
    (count, ns): (u64, u64),
) {
    let at = *samples
        .entry((locations.clone(), labels.clone()))
        .or_insert_with(|| {
            profile.sample.push(Sample {
                location_id: locations,
                value: vec![0, 0],
                label: labels,
            });
            profile.sample.len() - 1
        });
    let value = &mut profile.sample[at].value;
    value[0] += count as i64;
    value[1] += ns as i64;
}

/// The sampling period: the time one on-CPU sample stands for, which every
/// CPU row holds a whole number of. Off-CPU time is exact or sampled by
/// interval length, with no period.
fn period(kind: Kind, rows: &[Row]) -> i64 {
    if kind != Kind::State(State::Cpu) {
        return 0;
    }
    rows.iter()
        .find(|r| r.count > 0)
        .map_or(0, |r| (r.ns / r.count) as i64)
}

/// The row's frames, leaf first as pprof wants them.
fn locations(t: &mut Tables, row: &Row) -> Vec<u64> {
    let mut ids = Vec::with_capacity(row.stack.len() + 2);
    if let Some(leaf) = &row.leaf {
        ids.push(t.location(leaf));
    }
    for frame in row.stack.iter().rev() {
        ids.push(t.location(frame));
    }
    if let Some(irq) = row.interrupt {
        ids.push(t.location(irq.frame()));
    }
    ids
}

fn labels(t: &mut Tables, names: &Names, row: &Row, group: Group, detail: Detail) -> Vec<Label> {
    let mut labels = Vec::new();
    if let Some(state) = row.state {
        labels.push(t.label("state", state.name()));
    }
    if detail == Detail::Series || row.interrupt.is_some() {
        return labels;
    }
    labels.push(t.number("pid", u64::from(row.pid)));
    labels.push(t.label("comm", names.process_of(row)));
    for (key, value) in names
        .container(row.pid)
        .map(|c| c.labels())
        .unwrap_or_default()
    {
        labels.push(t.label(key, &value));
    }
    if row.tid != 0 {
        let thread = names.thread(row.tid);
        if group == Group::Thread {
            labels.push(t.number("thread_id", u64::from(row.tid)));
            labels.push(t.label("thread_name", thread));
        }
        labels.push(t.label("pool", &pool_name(thread)));
    }
    labels
}

/// The labels of the span a sample's time was spent under: `span_id`,
/// and from its record `trace_id` and `attr.NAME` (W3C lowercase hex).
fn span_labels(t: &mut Tables, tag: &SpanTag, labels: &mut Vec<Label>) {
    labels.push(t.label("span_id", &tag.span.hex()));
    if let Some(record) = &tag.record {
        labels.push(t.label("trace_id", &record.trace.hex()));
        for (name, value) in &record.attrs {
            labels.push(t.label(&format!("attr.{name}"), value));
        }
    }
}

/// The profile, encoded and gzipped, as `go tool pprof` and Pyroscope read
/// it.
pub fn encode_gzip(profile: &Profile) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(&profile.encode_to_vec());
    gz.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests;
