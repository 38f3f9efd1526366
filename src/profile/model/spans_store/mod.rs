//! The spans' store: what the slices hold of OpenTelemetry spans
//! ([`super::spans::SpanSlice`]), kept beside the stack store with its own
//! byte bound (the budget's `spans` part), because a service can open a
//! million spans a minute and they must never crowd out the stacks.
//!
//! Each push becomes one [`Bucket`]: its span times and stack rows, with
//! the records of the spans it mentions (shared with the other buckets).
//! The newest buckets are kept whole; past the bound or the retention, the
//! oldest bucket is folded into [`aggregate::Aggregates`] (time by state and
//! a count per process and attribute set; ids and stacks dropped), and
//! every drop is counted in [`SpanStats`]. A query reads a [`SpanView`]:
//! the list of buckets (one reference count each) and the aggregates.

pub mod aggregate;
pub mod size;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
    time::{Duration, SystemTime},
};

use rustc_hash::FxHashMap;
use serde::Serialize;

use super::{
    spans::{SpanId, SpanRecord, SpanSample, SpanSlice, SpanTime},
    window::{Overlap, Window},
};
use aggregate::Aggregates;

/// Default bound when none is set (unit tests, `record`).
pub const DEFAULT_MAX_BYTES: usize = 8 << 20;
/// Past its bound, the store folds buckets until it is under this share
/// of it, so that folding happens once per tenth of the bound.
const FOLD_TO_PERCENT: usize = 90;
/// At most this share of the bound goes to aggregates: past it, new
/// attribute sets are counted under one `(others)` row per process.
const AGGREGATES_PERCENT: usize = 25;

/// A span of a process.
pub type SpanKey = (u32, SpanId);

/// What one push brought of spans.
#[derive(Debug)]
pub struct Bucket {
    pub start: SystemTime,
    pub end: SystemTime,
    /// The latest `last_ns` of its times: the BPF clock near `end`, to
    /// place a span's first and last ns in unix time.
    pub clock_end_ns: u64,
    pub times: Vec<SpanTime>,
    pub samples: Vec<SpanSample>,
    /// The records of the spans its times and rows name, when known.
    pub records: FxHashMap<SpanKey, Arc<SpanRecord>>,
    seq: u64,
    bytes: usize,
    /// The bytes of its rows, by process.
    by_pid: BTreeMap<u32, usize>,
}

impl Bucket {
    /// Whether it holds rows of process `pid`.
    fn names(&self, pid: u32) -> bool {
        self.by_pid.contains_key(&pid)
    }

    /// Sets its sizes from its rows.
    fn measure(&mut self) {
        self.bytes = size::bucket_bytes(self);
        self.by_pid = size::pid_bytes_in(self);
    }

    /// Its rows of `pid`, and the others, as two buckets of its time.
    fn split_off(&self, pid: u32) -> (Bucket, Bucket) {
        let part = |mine: bool| {
            let mut b = Bucket {
                start: self.start,
                end: self.end,
                clock_end_ns: self.clock_end_ns,
                times: (self.times.iter())
                    .filter(|t| (t.pid == pid) == mine)
                    .cloned()
                    .collect(),
                samples: (self.samples.iter())
                    .filter(|s| (s.pid == pid) == mine)
                    .cloned()
                    .collect(),
                records: (self.records.iter())
                    .filter(|(k, _)| (k.0 == pid) == mine)
                    .map(|(k, r)| (*k, r.clone()))
                    .collect(),
                seq: self.seq,
                bytes: 0,
                by_pid: BTreeMap::new(),
            };
            b.measure();
            b
        };
        (part(true), part(false))
    }

    /// The unix time of `ns` (the BPF clock), placed from the bucket's
    /// end and clamped into it.
    pub fn unix_of(&self, ns: u64) -> SystemTime {
        let before = Duration::from_nanos(self.clock_end_ns.saturating_sub(ns));
        self.end
            .checked_sub(before)
            .unwrap_or(self.start)
            .clamp(self.start, self.end)
    }
}

/// What the spans' store holds and what its bound dropped, for `/healthz`,
/// `/metrics` and the `/spans` answer.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct SpanStats {
    /// Estimated bytes held (buckets, records, aggregates).
    pub bytes: usize,
    pub max_bytes: usize,
    pub buckets: usize,
    /// Spans known by id (with a record).
    pub spans: usize,
    /// Spans folded into aggregates (their ids and stacks dropped), by
    /// the bound or the retention.
    pub aggregated_spans: u64,
    /// Span times and stack rows dropped with them.
    pub aggregated_rows: u64,
    /// Rows of a push refused because the push alone was over the bound.
    pub refused_rows: u64,
    /// Attribute sets counted under `(others)` because the aggregates
    /// were full.
    pub others_rows: u64,
}

/// The spans' store. See the module's doc.
pub struct SpanStore {
    buckets: VecDeque<Arc<Bucket>>,
    /// Every span a bucket names, with the newest bucket that names it.
    records: FxHashMap<SpanKey, (Arc<SpanRecord>, u64)>,
    aggregates: Arc<Aggregates>,
    retention: Duration,
    max_bytes: usize,
    bucket_bytes: usize,
    /// The bytes of the buckets' rows, by process.
    held: FxHashMap<u32, usize>,
    record_bytes: usize,
    seq: u64,
    stats: SpanStats,
}

/// The spans' store as of one instant, readable without its lock.
#[derive(Debug, Clone, Default)]
pub struct SpanView {
    pub buckets: Vec<Arc<Bucket>>,
    pub aggregates: Arc<Aggregates>,
    pub stats: SpanStats,
}

impl SpanView {
    /// The buckets `window` overlaps, oldest first.
    pub fn within(&self, window: Window) -> impl Iterator<Item = &Bucket> + '_ {
        (self.buckets.iter())
            .filter(move |b| window.overlap(b.start, b.end) != Overlap::None)
            .map(|b| &**b)
    }
}

impl SpanStore {
    pub fn new(retention: Duration, max_bytes: usize) -> SpanStore {
        SpanStore {
            buckets: VecDeque::new(),
            records: FxHashMap::default(),
            aggregates: Arc::default(),
            retention,
            max_bytes,
            bucket_bytes: 0,
            held: FxHashMap::default(),
            record_bytes: 0,
            seq: 0,
            stats: SpanStats {
                max_bytes,
                ..SpanStats::default()
            },
        }
    }

    /// Estimated bytes held.
    pub fn bytes(&self) -> usize {
        self.bucket_bytes + self.record_bytes + self.aggregates.bytes()
    }

    pub fn stats(&self) -> SpanStats {
        SpanStats {
            bytes: self.bytes(),
            buckets: self.buckets.len(),
            spans: self.records.len(),
            ..self.stats
        }
    }

    pub fn view(&self) -> SpanView {
        SpanView {
            buckets: self.buckets.iter().cloned().collect(),
            aggregates: self.aggregates.clone(),
            stats: self.stats(),
        }
    }

    /// Keeps what `spans` holds of `start..end`, folding the oldest
    /// buckets past the retention or the bound. A push larger than the
    /// bound on its own is cut first (stack rows, then times), counted.
    pub fn push(&mut self, start: SystemTime, end: SystemTime, mut spans: SpanSlice) {
        if spans.is_empty() {
            self.fold_expired(end);
            return;
        }
        let room = self.max_bytes / 100 * FOLD_TO_PERCENT;
        // A push on its own leaves room for the aggregates' share.
        let alone = self.max_bytes / 100 * (FOLD_TO_PERCENT - AGGREGATES_PERCENT);
        self.stats.refused_rows += size::cut_fair(&mut spans, alone) as u64;
        self.seq += 1;
        let seq = self.seq;
        for r in spans.records {
            let key = (r.pid, r.span);
            if let Some((_, last)) = self.records.get_mut(&key) {
                // The first record of a span stays: ids are not reused.
                *last = seq;
                continue;
            }
            self.record_bytes += size::record_bytes(&r);
            self.records.insert(key, (Arc::new(r), seq));
        }
        let named = (spans.times.iter().map(|t| (t.pid, t.span)))
            .chain(spans.samples.iter().map(|s| (s.pid, s.span)));
        let mut records = FxHashMap::default();
        for key in named {
            if let Some((record, last)) = self.records.get_mut(&key) {
                *last = seq;
                records.entry(key).or_insert_with(|| record.clone());
            }
        }
        let mut bucket = Bucket {
            start,
            end,
            clock_end_ns: spans.times.iter().map(|t| t.last_ns).max().unwrap_or(0),
            times: spans.times,
            samples: spans.samples,
            records,
            seq,
            bytes: 0,
            by_pid: BTreeMap::new(),
        };
        bucket.measure();
        self.hold(&bucket, true);
        self.buckets.push_back(Arc::new(bucket));
        self.fold_expired(end);
        if self.bytes() > self.max_bytes {
            while self.bytes() > room && !self.buckets.is_empty() {
                if !self.fold_from_the_largest() {
                    if self.buckets.len() <= 1 {
                        break;
                    }
                    self.fold_oldest();
                }
            }
        }
    }

    /// Counts `b`'s bytes in (or, `held` false, out of) the store's.
    fn hold(&mut self, b: &Bucket, held: bool) {
        if held {
            self.bucket_bytes += b.bytes;
        } else {
            self.bucket_bytes -= b.bytes;
        }
        for (pid, bytes) in &b.by_pid {
            let h = self.held.entry(*pid).or_default();
            *h = if held {
                *h + bytes
            } else {
                h.saturating_sub(*bytes)
            };
            if *h == 0 {
                self.held.remove(pid);
            }
        }
    }

    /// Folds the oldest rows of the process that holds the most of the
    /// buckets, when more than one holds any: a process that floods spans
    /// ages out its own first, and keeps at most an equal share of the
    /// others' retention from them.
    fn fold_from_the_largest(&mut self) -> bool {
        let held = &self.held;
        let Some((&pid, _)) = held.iter().max_by_key(|(_, b)| **b) else {
            return false;
        };
        if held.len() < 2 {
            return false;
        }
        let Some(i) = self.buckets.iter().position(|b| b.names(pid)) else {
            return false;
        };
        let (mine, rest) = self.buckets[i].split_off(pid);
        let whole = self.buckets[i].clone();
        self.hold(&whole, false);
        if rest.times.is_empty() && rest.samples.is_empty() {
            self.buckets.remove(i);
        } else {
            self.hold(&rest, true);
            self.buckets[i] = Arc::new(rest);
        }
        self.fold(&mine, Some(pid));
        true
    }

    /// Folds the buckets that ended before the retention.
    fn fold_expired(&mut self, now: SystemTime) {
        let Some(horizon) = now.checked_sub(self.retention) else {
            return;
        };
        while self.buckets.front().is_some_and(|b| b.end < horizon) {
            self.fold_oldest();
        }
        Arc::make_mut(&mut self.aggregates).forget_before(horizon);
    }

    /// Folds the oldest bucket into the aggregates, forgetting the
    /// records no newer bucket names.
    fn fold_oldest(&mut self) {
        let Some(bucket) = self.buckets.pop_front() else {
            return;
        };
        self.hold(&bucket, false);
        self.fold(&bucket, None);
    }

    /// Folds `bucket` (taken out of the store) into the aggregates,
    /// forgetting the records (of `only`, when given) no newer bucket
    /// names.
    fn fold(&mut self, bucket: &Bucket, only: Option<u32>) {
        let bound = self.max_bytes / 100 * AGGREGATES_PERCENT;
        let aggregates = Arc::make_mut(&mut self.aggregates);
        let attrs_of = |key: &SpanKey| self.records.get(key).map(|(r, _)| r.clone());
        let folded = aggregates.add(bucket, attrs_of, bound);
        self.stats.others_rows += folded.others as u64;
        self.stats.aggregated_rows += (bucket.times.len() + bucket.samples.len()) as u64;
        let ended: Vec<SpanKey> = (self.records.iter())
            .filter(|(k, (_, last))| *last <= bucket.seq && only.is_none_or(|p| k.0 == p))
            .map(|(k, _)| *k)
            .collect();
        for key in ended {
            if let Some((record, _)) = self.records.remove(&key) {
                self.record_bytes -= size::record_bytes(&record);
                self.stats.aggregated_spans += 1;
                aggregates.count_span(&record, bucket.end, bound);
            }
        }
    }
}
