//! A snapshot made of the stack rows under some spans only: what
//! `/folded`, `/flamegraph` and `/pprof` read when asked for spans
//! (`span_id=`, `trace_id=`, `attr.NAME=`), so that they fold it as any
//! other window.

use std::{collections::HashMap, sync::Arc};

use super::{
    merge::FoldedPids,
    snapshot::{Body, Entry, Snapshot},
};
use crate::profile::model::{
    counters::{RawThread, ThreadCounters},
    spans::{SpanId, SpanRecord},
    window::Window,
    Frame, Sample, Slice, Stack,
};

impl Snapshot {
    /// The rows of `window` (of process `pid`, if given) spent under the
    /// spans `keep` keeps (given each span and its record, when known),
    /// one slice per bucket of the spans' store: the stack rows under
    /// them, each thread's exact time under them as its totals, and the
    /// names of the processes and threads they mention.
    pub fn under_spans(
        &self,
        window: Window,
        pid: Option<u32>,
        keep: impl Fn(SpanId, Option<&SpanRecord>) -> bool,
    ) -> Snapshot {
        let view = self.span_view();
        let mut slices: Vec<Slice> = Vec::new();
        for bucket in view.within(window) {
            let mut slice = Slice::empty(bucket.start, bucket.end);
            let kept = |p: u32, span: SpanId| {
                pid.is_none_or(|asked| asked == p)
                    && keep(span, bucket.records.get(&(p, span)).map(|r| &**r))
            };
            let mut totals: HashMap<(u32, u32), ThreadCounters> = HashMap::new();
            for t in bucket.times.iter().filter(|t| kept(t.pid, t.span)) {
                let counters = totals.entry((t.pid, t.tid)).or_default();
                for (sum, ns) in counters.ns.iter_mut().zip(t.ns) {
                    *sum += ns;
                }
            }
            slice.thread_totals = (totals.into_iter())
                .map(|((pid, tid), counters)| RawThread {
                    tid,
                    pid,
                    comm: String::new(),
                    counters,
                })
                .collect();
            let rows = bucket.samples.iter().filter(|s| kept(s.pid, s.span));
            slice.samples = rows
                .map(|s| Sample {
                    pid: s.pid,
                    tid: s.tid,
                    state: s.state,
                    stack: s.stack.clone(),
                    ns: s.ns,
                    count: s.count,
                })
                .collect();
            slices.push(slice);
        }
        self.name_rows(window, pid, &mut slices);
        let entries = slices.into_iter().map(|s| Entry {
            body: Body::Decoded(Arc::new(s)),
            step_s: 1,
            folded: FoldedPids::default(),
        });
        Snapshot::new(
            entries.collect(),
            None,
            self.retention(),
            self.live_shared(),
        )
        .with_spans(Arc::new(view.clone()))
    }

    /// Gives `slices` the names of the processes and threads their rows
    /// mention, as the window's slices recorded them.
    fn name_rows(&self, window: Window, pid: Option<u32>, slices: &mut [Slice]) {
        let rows = slices.iter().flat_map(|s| {
            let totals = s.thread_totals.iter().map(|t| (t.pid, t.tid));
            totals.chain(s.samples.iter().map(|r| (r.pid, r.tid)))
        });
        let (pids, tids): (
            std::collections::HashSet<u32>,
            std::collections::HashSet<u32>,
        ) = rows.unzip();
        if pids.is_empty() {
            return;
        }
        let narrowed = pid.and_then(|p| self.narrowed(p, window));
        let mut threads = HashMap::new();
        let mut processes = HashMap::new();
        let mut containers = HashMap::new();
        for slice in narrowed.as_ref().unwrap_or(self).within(window) {
            let tids = slice.threads.iter().filter(|(t, _)| tids.contains(t));
            threads.extend(tids.map(|(t, i)| (*t, i.clone())));
            let named = slice.processes.iter().filter(|(p, _)| pids.contains(p));
            processes.extend(named.map(|(p, n)| (*p, n.clone())));
            let held = slice.containers.iter().filter(|(p, _)| pids.contains(p));
            containers.extend(held.map(|(p, c)| (*p, c.clone())));
        }
        for slice in slices {
            slice.threads = threads.clone();
            slice.processes = processes.clone();
            slice.containers = containers.clone();
        }
    }
}

/// Time under spans not yet taken from the main rows: by process,
/// thread, state and stack, each part with its attribute's value.
type Parts = rustc_hash::FxHashMap<
    (u32, u32, crate::profile::model::state::State, Stack),
    Vec<(Frame, u64, u64)>,
>;

/// The frame that roots time whose span has no value of the attribute.
pub const NO_VALUE: &str = "(none)";

impl Snapshot {
    /// `window` (of process `pid`, if given) as one slice whose every
    /// stack starts with a frame `NAME=value`: the value of attribute
    /// `name` of the span the row's time was spent under, `NAME=(none)`
    /// for time under no span or a span without it. The span rows are
    /// taken from the main rows of the same thread, state and stack, so
    /// no time counts twice.
    pub fn by_attribute(&self, window: Window, pid: Option<u32>, name: &str) -> Snapshot {
        let frame = |value: &str| -> Frame { Arc::from(format!("{name}={value}")) };
        let none = frame(NO_VALUE);
        let mut frames: HashMap<Option<Arc<str>>, Frame> = HashMap::new();
        let mut parts: Parts = Parts::default();
        for bucket in self.span_view().within(window) {
            for s in bucket
                .samples
                .iter()
                .filter(|s| pid.is_none_or(|p| p == s.pid))
            {
                let record = bucket.records.get(&(s.pid, s.span));
                let value = record.and_then(|r| {
                    (r.attrs.iter())
                        .rev()
                        .find(|(n, _)| &**n == name)
                        .map(|(_, v)| v.clone())
                });
                let root = (frames.entry(value))
                    .or_insert_with_key(|v| v.as_deref().map_or(none.clone(), frame))
                    .clone();
                let key = (s.pid, s.tid, s.state, s.stack.clone());
                parts.entry(key).or_default().push((root, s.ns, s.count));
            }
        }
        let mut slice = Slice::empty(window.from, window.until);
        let narrowed = pid.and_then(|p| self.narrowed(p, window));
        for part in narrowed.as_ref().unwrap_or(self).within(window) {
            for s in part
                .samples
                .iter()
                .filter(|s| pid.is_none_or(|p| p == s.pid))
            {
                let mut rest = (s.ns, s.count);
                let key = (s.pid, s.tid, s.state, s.stack.clone());
                for (root, ns, count) in parts.get_mut(&key).into_iter().flatten() {
                    let taken = ((*ns).min(rest.0), (*count).min(rest.1));
                    (*ns, *count) = (*ns - taken.0, *count - taken.1);
                    rest = (rest.0 - taken.0, rest.1 - taken.1);
                    if taken.0 > 0 {
                        slice.samples.push(rooted(s, root, taken));
                    }
                }
                if rest.0 > 0 {
                    slice.samples.push(rooted(s, &none, rest));
                }
            }
            slice
                .threads
                .extend(part.threads.iter().map(|(t, i)| (*t, i.clone())));
            slice
                .processes
                .extend(part.processes.iter().map(|(p, n)| (*p, n.clone())));
            slice
                .containers
                .extend(part.containers.iter().map(|(p, c)| (*p, c.clone())));
        }
        let entry = Entry {
            body: Body::Decoded(Arc::new(slice)),
            step_s: 1,
            folded: FoldedPids::default(),
        };
        Snapshot::new(vec![entry], None, self.retention(), self.live_shared())
            .with_spans(Arc::new(self.span_view().clone()))
    }
}

/// Row `s` with `(ns, count)` of its time, under a first frame `root`.
fn rooted(s: &Sample, root: &Frame, (ns, count): (u64, u64)) -> Sample {
    let stack: Stack = std::iter::once(root.clone())
        .chain(s.stack.iter().cloned())
        .collect();
    Sample {
        stack,
        ns,
        count,
        ..s.clone()
    }
}
