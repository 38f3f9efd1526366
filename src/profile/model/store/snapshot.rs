//! The slices of a store at one instant, readable without its lock: a
//! query takes one (a reference count per slice, microseconds under the
//! lock) and reads it while the store goes on. Past the oldest slice held
//! in memory, a window reaches into the disk history, when there is one.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        Arc,
    },
    time::{Duration, SystemTime},
};

use super::{
    super::{
        live::LiveView,
        prorate, size,
        spans::SpanSlice,
        spans_store::SpanView,
        window::{Overlap, Window},
        HistOwner, Slice,
    },
    disk_read::{self as read, Interner},
    merge::FoldedPids,
    narrow_cache::NarrowCache,
    sealed::{open_block_keeping, Block},
};
use crate::profile::history::{History, StoredBlock};
use crate::profile::model::block::Keep;
use rustc_hash::FxHashSet;

/// Where a slice a snapshot sees is.
#[derive(Clone)]
pub(super) enum Body {
    Memory(Arc<Block>),
    Disk(StoredBlock),
    /// Decoded already (a narrowed snapshot's, see [`Snapshot::narrowed`]).
    Decoded(Arc<Slice>),
}

/// One held slice as a snapshot sees it.
#[derive(Clone)]
pub(super) struct Entry {
    pub body: Body,
    /// Seconds it spans at most (1, 10 or 60).
    pub step_s: u32,
    /// The processes whose rows it holds folded into per-pool rows.
    pub folded: FoldedPids,
}

impl Entry {
    pub fn start(&self) -> SystemTime {
        match &self.body {
            Body::Memory(b) => b.start,
            Body::Disk(d) => d.meta.start,
            Body::Decoded(s) => s.start,
        }
    }

    pub fn end(&self) -> SystemTime {
        match &self.body {
            Body::Memory(b) => b.end,
            Body::Disk(d) => d.meta.end,
            Body::Decoded(s) => s.end,
        }
    }

    /// The slice, decoded (read from disk first); `None` when a disk block
    /// cannot be read.
    fn read(&self, disk: Option<&History>, stacks: &mut Interner) -> Option<Arc<Slice>> {
        self.read_keeping(disk, stacks, Keep::All)
    }

    /// Its rows `keep` keeps (all of a slice decoded already).
    fn read_keeping(
        &self,
        disk: Option<&History>,
        stacks: &mut Interner,
        keep: Keep,
    ) -> Option<Arc<Slice>> {
        match &self.body {
            Body::Memory(b) => Some(Arc::new(open_block_keeping(b, keep))),
            Body::Disk(d) => read::slice_of(disk?, d, stacks, keep).map(Arc::new),
            Body::Decoded(s) => Some(s.clone()),
        }
    }

    /// A slice held in memory, decoded (for tests of the store's layout).
    #[cfg(test)]
    pub fn slice(&self) -> Arc<Slice> {
        self.read(None, &mut Interner::default()).unwrap()
    }
}

/// Most a narrowed snapshot keeps decoded (estimated, see [`size`]).
pub const NARROWED_MAX_BYTES: usize = 16 << 20;
/// Threads at most that decode a narrowed snapshot's blocks.
const NARROW_THREADS: usize = 4;

/// What of `slice` concerns process `pid` (see [`Snapshot::narrowed`]):
/// its rows, and the names of the processes and threads they mention
/// (its own, its wakers and wakees, what kept it off the CPU). Only
/// those names: a block of a churning host names hundreds of short-lived
/// threads, and copying them all into every narrowed block made the
/// narrowed window (and the cache of them) ten times larger than the rows.
fn only_of(slice: &Slice, pid: u32) -> Slice {
    let owner = |o: &HistOwner| matches!(o, HistOwner::Process(p) | HistOwner::ProcessThrottled(p) if *p == pid);
    let mine = |p: &u32| *p == pid;
    let samples: Vec<_> = slice
        .samples
        .iter()
        .filter(|r| mine(&r.pid))
        .cloned()
        .collect();
    let wakeups: Vec<_> = (slice.wakeups.iter())
        .filter(|w| mine(&w.pid) || mine(&w.peer_pid))
        .cloned()
        .collect();
    let kept_off: Vec<_> = (slice.kept_off.iter())
        .filter(|k| mine(&k.pid))
        .copied()
        .collect();
    // The pids and tids the kept rows name besides the process's own.
    let mut pids: FxHashSet<u32> = FxHashSet::default();
    let mut tids: FxHashSet<u32> = FxHashSet::default();
    pids.insert(pid);
    for w in &wakeups {
        pids.extend([w.pid, w.peer_pid]);
        tids.extend([w.tid, w.peer_tid]);
    }
    pids.extend(kept_off.iter().map(|k| k.by));
    let named = |p: &u32| pids.contains(p);
    Slice {
        samples,
        thread_totals: (slice.thread_totals.iter())
            .filter(|t| mine(&t.pid))
            .cloned()
            .collect(),
        runq_hists: (slice.runq_hists.iter())
            .filter(|(o, _)| owner(o))
            .cloned()
            .collect(),
        sleeps: (slice.sleeps.iter())
            .filter(|s| mine(&s.pid))
            .copied()
            .collect(),
        threads: (slice.threads.iter())
            .filter(|(tid, t)| mine(&t.pid) || tids.contains(tid))
            .map(|(tid, t)| (*tid, t.clone()))
            .collect(),
        processes: (slice.processes.iter())
            .filter(|(p, _)| named(p))
            .map(|(p, n)| (*p, n.clone()))
            .collect(),
        containers: (slice.containers.iter())
            .filter(|(p, _)| named(p))
            .map(|(p, c)| (*p, c.clone()))
            .collect(),
        origins: (slice.origins.iter())
            .filter(|(p, _)| named(p))
            .map(|(p, o)| (*p, o.clone()))
            .collect(),
        wakeups,
        kept_off,
        start: slice.start,
        end: slice.end,
        stats: slice.stats,
        spans: SpanSlice {
            records: (slice.spans.records.iter())
                .filter(|r| mine(&r.pid))
                .cloned()
                .collect(),
            times: (slice.spans.times.iter())
                .filter(|t| mine(&t.pid))
                .cloned()
                .collect(),
            samples: (slice.spans.samples.iter())
                .filter(|s| mine(&s.pid))
                .cloned()
                .collect(),
        },
    }
}

/// The store's slices, oldest first, and its live view, as of one instant.
#[derive(Clone, Default)]
pub struct Snapshot {
    pub(super) entries: Vec<Entry>,
    disk: Option<Arc<History>>,
    /// Memory blocks narrowed to a process by earlier queries.
    cache: Option<Arc<NarrowCache>>,
    retention: Duration,
    live: Arc<LiveView>,
    /// The spans' store as of the same instant.
    span_view: Arc<SpanView>,
}

impl Snapshot {
    pub(super) fn new(
        entries: Vec<Entry>,
        disk: Option<Arc<History>>,
        retention: Duration,
        live: Arc<LiveView>,
    ) -> Self {
        Snapshot {
            entries,
            disk,
            cache: None,
            retention,
            live,
            span_view: Arc::default(),
        }
    }

    /// The same snapshot with the spans' store's view.
    pub(super) fn with_spans(mut self, view: Arc<SpanView>) -> Self {
        self.span_view = view;
        self
    }

    /// The live view, shared.
    pub(super) fn live_shared(&self) -> Arc<LiveView> {
        self.live.clone()
    }

    /// What the spans' store held at the same instant.
    pub fn span_view(&self) -> &SpanView {
        &self.span_view
    }

    /// The slices `window` overlaps, oldest first: from the disk history
    /// those that ended before the oldest held in memory, then memory's.
    fn entries_in(&self, window: Window) -> Vec<Entry> {
        let overlaps = |e: &Entry| window.overlap(e.start(), e.end()) != Overlap::None;
        // Disk blocks the memory also holds (or merged) are read there.
        let memory_from = self.entries.first().map(Entry::start);
        let before_memory = |t: SystemTime| memory_from.is_none_or(|m| t <= m);
        let mut out = Vec::new();
        if let Some(disk) = self.disk.as_ref().filter(|_| before_memory(window.from)) {
            let until = memory_from.map_or(window.until, |m| m.min(window.until));
            out.extend(
                disk.blocks(window.from, until)
                    .into_iter()
                    .filter(|b| before_memory(b.meta.end))
                    .map(|b| Entry {
                        step_s: b.meta.step_s,
                        folded: FoldedPids::default(),
                        body: Body::Disk(b),
                    })
                    .filter(overlaps),
            );
        }
        out.extend(self.entries.iter().filter(|e| overlaps(e)).cloned());
        out
    }

    /// What `window` holds, oldest first: each slice inside it whole, a
    /// slice its edge falls inside cut to the window pro rata (see
    /// [`prorate`]). Each is decoded as the iterator reaches it.
    pub fn within(&self, window: Window) -> impl Iterator<Item = Arc<Slice>> + '_ {
        let mut stacks = Interner::default();
        let disk = self.disk.as_deref();
        self.entries_in(window).into_iter().filter_map(move |e| {
            let slice = e.read(disk, &mut stacks)?;
            match window.overlap(e.start(), e.end()) {
                Overlap::Part => Some(Arc::new(prorate::prorated(
                    &slice,
                    window.from,
                    window.until,
                ))),
                _ => Some(slice),
            }
        })
    }

    /// The same snapshot over `window`, each slice decoded once and kept:
    /// for a builder that reads a short window many times (the pusher, once
    /// per process pushed).
    pub fn decoded(&self, window: Window) -> Snapshot {
        let mut stacks = Interner::default();
        let disk = self.disk.as_deref();
        let entries = self.entries_in(window).into_iter().filter_map(|e| {
            let slice = e.read(disk, &mut stacks)?;
            Some(Entry {
                body: Body::Decoded(slice),
                ..e
            })
        });
        Snapshot::new(entries.collect(), None, self.retention, self.live.clone())
            .with_spans(self.span_view.clone())
    }

    /// The same snapshot, narrowing with `cache` (see
    /// [`Snapshot::narrowed`]).
    pub(super) fn with_cache(mut self, cache: Arc<NarrowCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The same snapshot over `window` with only what concerns process
    /// `pid` decoded, once: its rows and totals, the wakeups to and from
    /// it, its histograms (every name kept). A report about one process
    /// passes over the window several times (`/threads` four); each pass
    /// over the narrowed snapshot reads a few rows of each slice instead of
    /// decoding the whole host's again. `None` when what it keeps would
    /// pass [`NARROWED_MAX_BYTES`] (then read the snapshot itself).
    pub fn narrowed(&self, pid: u32, window: Window) -> Option<Snapshot> {
        let all = self.entries_in(window);
        let disk = self.disk.as_deref();
        // Decoded on up to NARROW_THREADS threads (an hour of disk history
        // is 3,600 blocks), each a run of neighbouring blocks.
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let run = all.len().div_ceil(workers.clamp(1, NARROW_THREADS)).max(1);
        let kept = AtomicUsize::new(0);
        let (hits, began) = (AtomicUsize::new(0), std::time::Instant::now());
        let cache = self.cache.as_deref();
        // An entry narrowed, and whether it was read from disk.
        let narrow_one = |e: &Entry, stacks: &mut Interner| -> Option<(Arc<Slice>, usize, bool)> {
            if let (Body::Memory(block), Some(cache)) = (&e.body, cache) {
                if let Some(hit) = cache.get(pid, block) {
                    hits.fetch_add(1, Relaxed);
                    return Some((hit.clone(), size::slice_bytes(&hit), false));
                }
            }
            // Only its rows decoded: the others are read past.
            let slice = e.read_keeping(disk, stacks, Keep::Process(pid))?;
            let part = Arc::new(only_of(&slice, pid));
            let bytes = size::slice_bytes(&part);
            if let (Body::Memory(block), Some(cache)) = (&e.body, cache) {
                cache.put(pid, block, part.clone(), bytes);
            }
            Some((part, bytes, matches!(e.body, Body::Disk(_))))
        };
        let narrow = |entries: &[Entry]| -> Option<Vec<(Entry, bool)>> {
            let mut stacks = Interner::default();
            let mut out = Vec::with_capacity(entries.len());
            for e in entries {
                let Some((part, bytes, from_disk)) = narrow_one(e, &mut stacks) else {
                    continue;
                };
                if kept.fetch_add(bytes, Relaxed) > NARROWED_MAX_BYTES {
                    return None;
                }
                let body = Body::Decoded(part);
                let folded = e.folded.only(pid);
                let step_s = e.step_s;
                out.push((
                    Entry {
                        body,
                        step_s,
                        folded,
                    },
                    from_disk,
                ));
            }
            Some(out)
        };
        // The workers compute for the query that asked (its priority).
        let crew = crate::priority::crew::Crew::current();
        let runs: Vec<Option<Vec<(Entry, bool)>>> = std::thread::scope(|scope| {
            let work = |c| {
                let _member = crew.as_ref().map(|crew| crew.join());
                narrow(c)
            };
            let workers: Vec<_> = all
                .chunks(run)
                .map(|c| scope.spawn(move || work(c)))
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().ok().flatten())
                .collect()
        });
        let mut entries = Vec::with_capacity(all.len());
        for run in runs {
            entries.extend(run?);
        }
        // One `Arc` per distinct stack across the runs' disk blocks again:
        // reports fold rows by a stack's address (memory blocks share the
        // store's).
        let mut stacks = Interner::default();
        let entries = entries.into_iter().map(|(mut e, from_disk)| {
            if let (Body::Decoded(slice), true) = (&mut e.body, from_disk) {
                stacks.intern_slice(Arc::make_mut(slice));
            }
            e
        });
        let entries: Vec<Entry> = entries.collect();
        tracing::debug!(
            "narrowed to pid {pid}: {} blocks ({} from the cache), {} bytes kept, in {:?}",
            entries.len(),
            hits.load(Relaxed),
            kept.load(Relaxed),
            began.elapsed()
        );
        Some(
            Snapshot::new(entries, None, self.retention, self.live.clone())
                .with_spans(self.span_view.clone()),
        )
    }

    /// Every slice the store holds in memory.
    pub fn all(&self) -> impl Iterator<Item = Arc<Slice>> + '_ {
        let mut stacks = Interner::default();
        self.entries
            .iter()
            .filter_map(move |e| e.read(None, &mut stacks))
    }

    /// The time span of each slice held in memory, oldest first (no
    /// decoding).
    pub fn spans(&self) -> impl Iterator<Item = (SystemTime, SystemTime)> + '_ {
        self.entries.iter().map(|e| (e.start(), e.end()))
    }

    /// How much history the store keeps.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The part of `window` there are records of: the window, less what
    /// lies before the oldest record (the daemon's start, or what the
    /// history keeps) or after the newest (the last drain); `None` when
    /// nothing of it is recorded.
    pub fn covered(&self, window: Window) -> Option<(SystemTime, SystemTime)> {
        let entries = self.entries_in(window);
        let first = entries.iter().map(Entry::start).min()?;
        let last = entries.iter().map(Entry::end).max()?;
        let disk_oldest = || {
            let oldest = self.disk.as_ref()?.stats().oldest?;
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(oldest))
        };
        let older = self
            .entries
            .first()
            .is_some_and(|e| e.start() < window.from)
            || disk_oldest().is_some_and(|t| t < window.from);
        let newer = self.entries.last().is_some_and(|e| e.end() >= window.until);
        let from = if older {
            window.from
        } else {
            first.max(window.from)
        };
        let until = if newer {
            window.until
        } else {
            last.min(window.until)
        };
        (from <= until).then_some((from, until))
    }

    /// Whole seconds of `window` there are records of (see
    /// [`Self::covered`]), rounded to the nearest.
    pub fn recorded_seconds(&self, window: Window) -> u64 {
        self.covered(window).map_or(0, |(from, until)| {
            until
                .duration_since(from)
                .map_or(0, |d| d.as_secs_f64().round() as u64)
        })
    }

    /// The threads off-CPU at the last drain (empty, without `as_of`,
    /// before the first).
    pub fn live(&self) -> &LiveView {
        &self.live
    }

    /// Each slice `window` overlaps, oldest first: its span, step and
    /// whether it holds rows folded into pools (of process `pid`, or of
    /// any), for [`super::resolution`].
    pub(super) fn layout(
        &self,
        window: Window,
        pid: Option<u32>,
    ) -> Vec<(SystemTime, SystemTime, u32, bool, Overlap)> {
        self.entries_in(window)
            .iter()
            .map(|e| {
                let overlap = window.overlap(e.start(), e.end());
                let folded = pid.map_or(e.folded.any(), |p| e.folded.contains(p));
                (e.start(), e.end(), e.step_s, folded, overlap)
            })
            .collect()
    }
}
