//! Estimates of what the spans' store holds, in the manner of
//! [`crate::profile::model::size`]: computed once per bucket or record.

use std::mem::size_of;

use super::{Bucket, SpanKey};
use crate::profile::model::{
    size::{stack_bytes, ARC_HEADER},
    spans::{SpanRecord, SpanSample, SpanSlice, SpanTime},
    Frame,
};
use std::sync::Arc;

use std::collections::BTreeMap;

use rustc_hash::FxHashSet;

/// A record, its attributes and the index entry that holds it.
pub fn record_bytes(r: &SpanRecord) -> usize {
    let attrs: usize = (r.attrs.iter())
        .map(|(n, v)| 2 * ARC_HEADER + n.len() + v.len())
        .sum();
    ARC_HEADER
        + size_of::<SpanRecord>()
        + r.attrs.capacity() * size_of::<(Arc<str>, Arc<str>)>()
        + attrs
        + (size_of::<(SpanKey, (Arc<SpanRecord>, u64))>() + 1) * 8 / 7
}

/// A time, and the record it may name in a bucket's index.
fn time_bytes() -> usize {
    size_of::<SpanTime>() + (size_of::<(SpanKey, Arc<SpanRecord>)>() + 1) * 8 / 7
}

/// The rows of `pid` in `b`: what folding them gives back.
pub fn pid_bytes_in(b: &Bucket) -> BTreeMap<u32, usize> {
    let mut by_pid = BTreeMap::new();
    for t in &b.times {
        *by_pid.entry(t.pid).or_insert(0) += time_bytes();
    }
    let mut stacks: BTreeMap<u32, Stacks> = BTreeMap::new();
    for s in &b.samples {
        let bytes = stacks.entry(s.pid).or_default().sample_bytes(s);
        *by_pid.entry(s.pid).or_insert(0) += bytes;
    }
    by_pid
}

/// Stack rows' bytes, each distinct stack counted once: the rows of a
/// drain share one `Arc` per distinct stack (with the main store too), so
/// rows keep at most one copy of each alive, however many name it. A
/// busy service's spans wait in a handful of places; counting the stack
/// per row made each span cost kilobytes and aged a 160 spans/s service's
/// spans out of the store in ~20 s.
#[derive(Default)]
struct Stacks(FxHashSet<*const Frame>);

impl Stacks {
    /// A row, with its stack if no row counted before named it.
    fn sample_bytes(&mut self, s: &SpanSample) -> usize {
        let first = self.0.insert(s.stack.as_ptr());
        size_of::<SpanSample>() + if first { stack_bytes(&s.stack) } else { 0 }
    }
}

/// Rows, each distinct stack once (see [`Stacks`]).
fn samples_bytes(samples: &[SpanSample]) -> usize {
    let mut stacks = Stacks::default();
    samples.iter().map(|s| stacks.sample_bytes(s)).sum()
}

/// A bucket apart from the records it shares.
pub fn bucket_bytes(b: &Bucket) -> usize {
    ARC_HEADER
        + size_of::<Bucket>()
        + b.times.capacity() * size_of::<SpanTime>()
        + samples_bytes(&b.samples)
        + (b.samples.capacity() - b.samples.len()) * size_of::<SpanSample>()
        + b.records.capacity() * (size_of::<(SpanKey, Arc<SpanRecord>)>() + 1) * 8 / 7
}

/// Cuts `spans` to about `room` bytes, keeping whole spans in the BPF
/// maps' order: a record with one time reserved for it, then the times
/// of the spans kept (or first seen in an earlier push), then their
/// stack rows. Returns the rows cut.
pub fn cut_to(spans: &mut SpanSlice, room: usize) -> usize {
    let per_time = time_bytes();
    let mut need = 0;
    let mut fits = |bytes: usize| {
        let fit = need + bytes <= room;
        if fit {
            need += bytes;
        }
        fit
    };
    let before = spans.records.len() + spans.times.len() + spans.samples.len();
    let recorded: FxHashSet<SpanKey> = spans.records.iter().map(|r| (r.pid, r.span)).collect();
    let mut reserved: FxHashSet<SpanKey> = FxHashSet::default();
    spans.records.retain(|r| {
        let keep = fits(record_bytes(r) + per_time);
        if keep {
            reserved.insert((r.pid, r.span));
        }
        keep
    });
    let kept = |key: &SpanKey| reserved.contains(key) || !recorded.contains(key);
    let mut timed: FxHashSet<SpanKey> = FxHashSet::default();
    spans.times.retain(|t| {
        let key = (t.pid, t.span);
        let free = reserved.contains(&key) && timed.insert(key);
        kept(&key) && (free || fits(per_time))
    });
    let mut stacks = Stacks::default();
    spans
        .samples
        .retain(|s| kept(&(s.pid, s.span)) && fits(stacks.sample_bytes(s)));
    let cut = before - (spans.records.len() + spans.times.len() + spans.samples.len());
    if cut > 0 {
        spans.times.shrink_to_fit();
        spans.records.shrink_to_fit();
        spans.samples.shrink_to_fit();
    }
    cut
}

/// Cuts `spans` to about `room` bytes, the room shared out between its
/// processes (each gets at most an equal share of what the smaller ones
/// leave), each part cut as [`cut_to`] does: a process that floods spans
/// cuts its own only. Returns the rows cut.
pub fn cut_fair(spans: &mut SpanSlice, room: usize) -> usize {
    let mut parts: BTreeMap<u32, SpanSlice> = BTreeMap::new();
    for r in spans.records.drain(..) {
        parts.entry(r.pid).or_default().records.push(r);
    }
    for t in spans.times.drain(..) {
        parts.entry(t.pid).or_default().times.push(t);
    }
    for s in spans.samples.drain(..) {
        parts.entry(s.pid).or_default().samples.push(s);
    }
    let mut sizes: Vec<(u32, usize)> = (parts.iter())
        .map(|(pid, p)| {
            let records: usize = p
                .records
                .iter()
                .map(|r| record_bytes(r) + time_bytes())
                .sum();
            let samples = samples_bytes(&p.samples);
            (*pid, records + p.times.len() * time_bytes() + samples)
        })
        .collect();
    sizes.sort_by_key(|(_, bytes)| *bytes);
    let (mut left, mut n, mut cut) = (room, sizes.len(), 0);
    for (pid, bytes) in sizes {
        let share = left / n.max(1);
        n -= 1;
        let Some(mut part) = parts.remove(&pid) else {
            continue;
        };
        if bytes > share {
            cut += cut_to(&mut part, share);
        }
        left = left.saturating_sub(bytes.min(share));
        spans.records.append(&mut part.records);
        spans.times.append(&mut part.times);
        spans.samples.append(&mut part.samples);
    }
    if cut > 0 {
        // The drained vectors kept the whole push's capacity.
        spans.records.shrink_to_fit();
        spans.times.shrink_to_fit();
        spans.samples.shrink_to_fit();
    }
    cut
}
