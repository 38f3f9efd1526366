//! Older spans, aggregated: per process and attribute set, their time by
//! state and how many spans ended there; ids, threads and stacks dropped.

use std::{mem::size_of, sync::Arc, time::SystemTime};

use rustc_hash::FxHashMap;

use super::{Bucket, SpanKey};
use crate::profile::model::{size::ARC_HEADER, spans::SpanRecord, state::State};

/// An attribute set: names and values, sorted by name.
pub type Attrs = Arc<[(Arc<str>, Arc<str>)]>;

/// The attribute set spans are counted under once the aggregates are full.
pub const OTHERS: &str = "(others)";

/// One process's spans of one attribute set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate {
    pub ns: [u64; State::COUNT],
    /// Spans whose last bucket was folded here.
    pub spans: u64,
    /// End of the newest bucket folded here.
    pub last_end: SystemTime,
}

/// What folding one bucket did.
#[derive(Debug, Default)]
pub struct Folded {
    /// Rows counted under `(others)` for want of room.
    pub others: usize,
}

/// The aggregates, bounded by the bytes their caller gives.
#[derive(Debug, Clone, Default)]
pub struct Aggregates {
    pub rows: FxHashMap<(u32, Attrs), Aggregate>,
    bytes: usize,
}

fn attrs_of(record: Option<&SpanRecord>) -> Attrs {
    let mut attrs: Vec<_> = record.map(|r| r.attrs.clone()).unwrap_or_default();
    attrs.sort();
    attrs.into()
}

fn others() -> Attrs {
    let name: Arc<str> = "*".into();
    Arc::from([(name, Arc::from(OTHERS))])
}

fn row_bytes(attrs: &Attrs) -> usize {
    let strings: usize = attrs
        .iter()
        .map(|(n, v)| 2 * ARC_HEADER + n.len() + v.len())
        .sum();
    // The table's entry, the attribute array and its strings.
    (size_of::<((u32, Attrs), Aggregate)>() + 1) * 8 / 7
        + ARC_HEADER
        + attrs.len() * size_of::<(Arc<str>, Arc<str>)>()
        + strings
}

impl Aggregates {
    /// Estimated bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The row of `pid` and `attrs`, made if there is room within `bound`
    /// (else the process's `(others)` row, counted in `folded`).
    fn row(
        &mut self,
        pid: u32,
        attrs: Attrs,
        end: SystemTime,
        bound: usize,
        folded: &mut Folded,
    ) -> &mut Aggregate {
        let mut key = (pid, attrs);
        if !self.rows.contains_key(&key) {
            let cost = row_bytes(&key.1);
            if self.bytes + cost > bound {
                folded.others += 1;
                key.1 = others();
            }
            if !self.rows.contains_key(&key) {
                self.bytes += row_bytes(&key.1);
            }
        }
        let row = self.rows.entry(key).or_insert(Aggregate {
            ns: [0; State::COUNT],
            spans: 0,
            last_end: end,
        });
        row.last_end = row.last_end.max(end);
        row
    }

    /// Adds the time of `bucket`'s spans, by the attributes `record_of`
    /// knows for them.
    pub fn add(
        &mut self,
        bucket: &Bucket,
        record_of: impl Fn(&SpanKey) -> Option<Arc<SpanRecord>>,
        bound: usize,
    ) -> Folded {
        let mut folded = Folded::default();
        for t in &bucket.times {
            let key = (t.pid, t.span);
            let record = bucket
                .records
                .get(&key)
                .cloned()
                .or_else(|| record_of(&key));
            let attrs = attrs_of(record.as_deref());
            let row = self.row(t.pid, attrs, bucket.end, bound, &mut folded);
            for (sum, ns) in row.ns.iter_mut().zip(t.ns) {
                *sum += ns;
            }
        }
        folded
    }

    /// Counts one span that ended (its last bucket folded).
    pub fn count_span(&mut self, record: &SpanRecord, end: SystemTime, bound: usize) {
        let attrs = attrs_of(Some(record));
        self.row(record.pid, attrs, end, bound, &mut Folded::default())
            .spans += 1;
    }

    /// Forgets the rows nothing newer than `horizon` was folded into.
    pub fn forget_before(&mut self, horizon: SystemTime) {
        let mut freed = 0;
        self.rows.retain(|(_, attrs), row| {
            let keep = row.last_end >= horizon;
            if !keep {
                freed += row_bytes(attrs);
            }
            keep
        });
        self.bytes -= freed;
    }
}
