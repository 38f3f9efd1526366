//! The in-memory store: the last `retention` of slices, bounded in time and
//! in (estimated) bytes.
//!
//! Queries do not read the store under its lock: they take a [`Snapshot`]
//! (a copy of the list of `Arc<Slice>`, microseconds under the lock) and
//! compute from it, so the symbolizer's [`Store::push`] never waits behind
//! a query.
//!
//! Besides history, the store keeps the newest [`LiveView`] (the threads
//! off-CPU at the last drain), replaced at every drain.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use serde::Serialize;

use rustc_hash::FxHashMap;

use super::{
    live::LiveView,
    size::{self, NameBytes},
    spans_store::{SpanStats, SpanStore},
    window::Window,
    Slice, Stack, StatDeltas,
};
use crate::profile::model::state::STAT_COUNTERS;

/// Pushes between two sweeps of the stack table.
const COMPACT_EVERY: u64 = 60;
/// Default bound of the store's estimated size (`--max-memory-mb`): with
/// compaction it holds the default 10 minutes of a busy 2-CPU host (the
/// soak: 10,000 threads, spawns, a JVM, builds) and keeps the daemon's
/// whole RSS under 100 MB.
pub const DEFAULT_MAX_BYTES: usize = 32 << 20;
/// Once over its bound, the store evicts down to this share of it, so that
/// evictions (and the sweep of the stack table that follows them) happen
/// once per tenth of the bound, not on every push.
const EVICT_TO_PERCENT: usize = 90;

mod compact;
mod disk_read;
pub mod feed;
pub mod kept_off_totals;
pub mod merge;
mod narrow_cache;
mod process_totals;
mod resolution;
mod sealed;
mod share;
mod snapshot;
mod span_rows;

pub use process_totals::ProcessTotals;

use feed::Feed;
use sealed::{open_block, Block};

pub use resolution::{describe as describe_resolution, Part as ResolutionPart, Recorded};
pub use snapshot::Snapshot;

/// One sealed slice with its size, fixed when it was sealed (or its rows
/// of a process folded or shed), and what of it each process's rows cost.
struct Held {
    block: Arc<Block>,
    bytes: usize,
    /// What each process's rows cost (its share of the compressed block)
    /// and the stacks and names they brought into the store.
    by_pid: FxHashMap<u32, usize>,
    /// Of `by_pid`, the stacks and names brought (kept through merges).
    brought: FxHashMap<u32, usize>,
    /// Seconds the slice spans at most (1, 10 or 60: see [`compact`]).
    step_s: u32,
    /// The processes whose rows it holds folded into per-pool rows.
    folded: merge::FoldedPids,
}

/// The store's size and what its memory bound cost, for `/healthz` and
/// `/metrics`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct StoreStats {
    pub slices: usize,
    /// Distinct stacks in the stack table.
    pub stacks: usize,
    /// Estimated bytes of slices, stacks and the live view (see
    /// [`super::size`]).
    pub bytes: usize,
    pub slice_bytes: usize,
    pub stack_bytes: usize,
    /// Distinct names (frames, threads, processes) the slices and stacks
    /// hold, each counted once.
    pub name_bytes: usize,
    /// Threads in the live view (at most
    /// [`super::live::MAX_LIVE_THREADS`]).
    pub live_threads: usize,
    pub live_bytes: usize,
    /// The bound on `bytes` (`--max-memory-mb`).
    pub max_bytes: usize,
    /// Processes with running totals (for `/metrics`), outside the bound:
    /// at most the processes seen within the retention.
    pub process_totals: usize,
    /// Seconds from the start of the oldest slice to the end of the newest:
    /// less than the retention when the memory bound evicted history.
    pub history_s: u64,
    /// Slices merged into coarser ones (see [`compact`]).
    pub compacted_slices: u64,
    /// Slices held whose stack rows are folded into per-pool rows.
    pub folded_slices: usize,
    /// Stack rows (samples and wakeups) the slices hold.
    pub stack_rows: usize,
    /// Slices dropped, oldest first, to stay within `max_bytes`.
    pub evicted_slices: u64,
    /// Stack rows (samples and wakeups) those slices held.
    pub evicted_rows: u64,
    /// Rows of the processes holding the most of the store, dropped
    /// oldest first to make room before whole slices are (fair share).
    pub shed_rows: u64,
    /// Parts of slices (one process's rows and thread totals) folded into
    /// pools because that process held the most (fair share), before any
    /// of its rows were shed.
    pub folded_parts: u64,
}

/// The disk history, as `/healthz` shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum HistoryState {
    /// No `--history-dir`: memory only.
    Off,
    /// Asked for, but could not be opened: memory only.
    Failed { error: String },
    On {
        #[serde(flatten)]
        stats: crate::profile::history::HistoryStats,
        /// Slices dropped because the encoding thread was behind.
        encoder_dropped: u64,
    },
}

/// What [`Store::push`] publishes after each push, for readers that must
/// not wait for the store's lock (`/healthz`): a push holds it while it
/// interns a slice's stacks, milliseconds on a busy host.
#[derive(Debug, Clone)]
pub struct Published {
    pub stats: StoreStats,
    /// BPF loss counters summed since start.
    pub totals: StatDeltas,
    pub retention: Duration,
    pub history: HistoryState,
    /// The spans' store, beside the history with its own bound.
    pub spans: SpanStats,
}

// By hand: `Default` stops at arrays of 32, and there are more counters.
impl Default for Published {
    fn default() -> Published {
        Published {
            stats: StoreStats::default(),
            totals: [0; STAT_COUNTERS],
            retention: Duration::default(),
            history: HistoryState::Off,
            spans: SpanStats::default(),
        }
    }
}

/// Slices of recent history, oldest first, and the newest live view.
/// Memory is bounded by the retention (one slice per drain, older ones
/// merged in time: see [`compact`]), by the BPF map sizes (rows per
/// slice), by [`super::live::MAX_LIVE_THREADS`] and by `max_bytes`:
/// compaction (time merges, then rows folded into pools) keeps the store
/// under it; past it, the largest process's oldest rows are shed and, last,
/// the oldest slices dropped (counted).
pub struct Store {
    slices: VecDeque<Held>,
    retention: Duration,
    /// Every distinct stack once; slices share them.
    stacks: rustc_hash::FxHashSet<Stack>,
    pushes: u64,
    totals: StatDeltas,
    processes: HashMap<u32, ProcessTotals>,
    kept_off: kept_off_totals::CgroupKeptOff,
    /// Sum of the slices' `bytes`, kept as they come and go.
    slice_bytes: usize,
    /// Sum of [`size::stack_bytes`] over the table, kept likewise.
    stack_bytes: usize,
    names: NameBytes,
    /// Sum of the slices' `by_pid`.
    pid_bytes: FxHashMap<u32, usize>,
    shed_rows: u64,
    folded_parts: u64,
    live: Arc<LiveView>,
    /// [`size::live_bytes`] of `live`.
    live_bytes: usize,
    max_bytes: usize,
    evicted_slices: u64,
    evicted_rows: u64,
    compacted_slices: u64,
    published: Arc<Mutex<Published>>,
    /// Where sealed slices also go, to the disk history.
    feed: Option<Feed>,
    /// Why there is no disk history though one was asked for.
    history_error: Option<String>,
    /// Blocks narrowed to a process, kept across queries.
    narrowed: Arc<narrow_cache::NarrowCache>,
    /// The OpenTelemetry spans the slices brought, bounded apart.
    spans: SpanStore,
}

impl Store {
    /// An empty store that keeps `retention` of history, within
    /// [`DEFAULT_MAX_BYTES`].
    pub fn new(retention: Duration) -> Self {
        Store {
            slices: VecDeque::new(),
            retention,
            stacks: rustc_hash::FxHashSet::default(),
            pushes: 0,
            totals: [0; STAT_COUNTERS],
            processes: HashMap::new(),
            kept_off: Default::default(),
            slice_bytes: 0,
            stack_bytes: 0,
            names: NameBytes::default(),
            pid_bytes: FxHashMap::default(),
            shed_rows: 0,
            folded_parts: 0,
            live: Arc::default(),
            live_bytes: size::live_bytes(&LiveView::default()),
            max_bytes: DEFAULT_MAX_BYTES,
            evicted_slices: 0,
            evicted_rows: 0,
            compacted_slices: 0,
            feed: None,
            history_error: None,
            narrowed: Arc::default(),
            spans: SpanStore::new(retention, super::spans_store::DEFAULT_MAX_BYTES),
            published: Arc::new(Mutex::new(Published {
                retention,
                ..Published::default()
            })),
        }
    }

    /// Where the store's figures are published after each push; read it
    /// without taking the store's lock.
    pub fn published(&self) -> Arc<Mutex<Published>> {
        self.published.clone()
    }

    /// The same store bounded to `max_bytes` (estimated) instead.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The same store keeping spans within `max_bytes` (estimated).
    pub fn with_span_bytes(mut self, max_bytes: usize) -> Self {
        self.spans = SpanStore::new(self.retention, max_bytes);
        self.publish();
        self
    }

    /// How much history is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The end of the newest slice (the last drain).
    pub fn newest_end(&self) -> Option<SystemTime> {
        self.slices.back().map(|h| h.block.end)
    }

    /// The same store writing each slice to the disk history too, and
    /// reading windows older than its own slices from it.
    pub fn with_history(mut self, feed: Feed) -> Self {
        self.feed = Some(feed);
        self.publish();
        self
    }

    /// The same store, in memory only: the disk history asked for could
    /// not be opened, for `reason` (shown in `/healthz`).
    pub fn without_history(mut self, reason: String) -> Self {
        self.history_error = Some(reason);
        self.publish();
        self
    }

    /// The disk history's figures, for `/healthz` and `/metrics`.
    pub fn history(&self) -> HistoryState {
        match (&self.feed, &self.history_error) {
            (Some(feed), _) => HistoryState::On {
                stats: feed.history().stats(),
                encoder_dropped: feed.dropped(),
            },
            (None, Some(error)) => HistoryState::Failed {
                error: error.clone(),
            },
            (None, None) => HistoryState::Off,
        }
    }

    /// Writes what is queued for the disk history, waiting at most
    /// `timeout` (at shutdown); true when all of it was written.
    pub fn flush_history(&self, timeout: Duration) -> bool {
        self.feed.as_ref().is_none_or(|f| f.flush(timeout))
    }

    /// The slices as they are now, for a query to read without the lock.
    /// Costs one reference count per slice.
    pub fn snapshot(&self) -> Snapshot {
        let held = self.slices.iter().map(|h| snapshot::Entry {
            body: snapshot::Body::Memory(h.block.clone()),
            step_s: h.step_s,
            folded: h.folded.clone(),
        });
        let disk = self.feed.as_ref().map(|f| f.history().clone());
        Snapshot::new(held.collect(), disk, self.retention, self.live.clone())
            .with_cache(self.narrowed.clone())
            .with_spans(Arc::new(self.spans.view()))
    }

    /// Replaces the live view with the newest drain's; past `max_bytes`
    /// the oldest slices make room, as for a push.
    pub fn set_live(&mut self, view: LiveView) {
        self.live_bytes = size::live_bytes(&view);
        self.live = Arc::new(view);
        self.compact();
        self.enforce_max_bytes();
        self.publish();
    }

    /// Adds a slice and drops what fell out of the retention window or,
    /// oldest first, what the memory bound has no room for.
    pub fn push(&mut self, mut slice: Slice) {
        // Equal stacks share one allocation, whichever slice brought them.
        // A new stack and the new names it holds are charged to the
        // process whose row brought it (see `share`).
        let mut brought: FxHashMap<u32, usize> = FxHashMap::default();
        let stacks = slice.samples.iter_mut().map(|s| (s.pid, &mut s.stack));
        let wakeups = slice
            .wakeups
            .iter_mut()
            .map(|w| (w.charged_to(), &mut w.stack));
        for (pid, stack) in stacks.chain(wakeups) {
            match self.stacks.get(&*stack) {
                Some(shared) => *stack = shared.clone(),
                None => {
                    let bytes = size::stack_bytes(stack);
                    self.stack_bytes += bytes;
                    let names: usize = stack.iter().map(|f| self.names.add(f)).sum();
                    *brought.entry(pid).or_default() += bytes + names;
                    self.stacks.insert(stack.clone());
                }
            }
        }
        // Span rows share the stacks the main rows brought (the same rows).
        let mut spans = std::mem::take(&mut slice.spans);
        for s in &mut spans.samples {
            if let Some(shared) = self.stacks.get(&s.stack) {
                s.stack = shared.clone();
            }
        }
        self.spans.push(slice.start, slice.end, spans);
        for (total, delta) in self.totals.iter_mut().zip(slice.stats) {
            *total += delta;
        }
        self.add_process_totals(&slice);
        self.kept_off.add(&slice);
        let horizon = slice.end.checked_sub(self.retention);
        let held = Held::seal(&slice, brought, 1, merge::FoldedPids::default());
        self.hold(held, self.slices.len());
        if let Some(feed) = &self.feed {
            feed.send(slice);
        }
        while let (Some(oldest), Some(horizon)) = (self.slices.front(), horizon) {
            if oldest.block.end >= horizon {
                break;
            }
            self.pop_oldest();
        }
        self.pushes += 1;
        if self.pushes.is_multiple_of(COMPACT_EVERY) {
            self.sweep_stacks();
        }
        self.compact();
        self.enforce_max_bytes();
        self.publish();
    }

    fn publish(&self) {
        let published = Published {
            stats: self.stats(),
            totals: self.totals,
            retention: self.retention,
            history: self.history(),
            spans: self.spans.stats(),
        };
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = published;
    }

    /// Estimated bytes held (slices, stacks, their names and the live
    /// view).
    pub fn bytes(&self) -> usize {
        self.slice_bytes + self.stack_bytes + self.names.bytes() + self.live_bytes
    }

    /// Past `max_bytes`, makes room down to [`EVICT_TO_PERCENT`] of the
    /// bound: first from the processes holding the most (their oldest
    /// rows, see [`Store::shed_largest`]), then by dropping the oldest
    /// slices (never the newest), sweeping the stacks and names only they
    /// held after each round.
    fn enforce_max_bytes(&mut self) {
        if self.bytes() <= self.max_bytes {
            return;
        }
        let target = self.max_bytes / 100 * EVICT_TO_PERCENT;
        self.shed_largest(target);
        while self.bytes() > target && self.slices.len() > 1 {
            let mut excess = self.bytes() - target;
            while excess > 0 && self.slices.len() > 1 {
                excess = excess.saturating_sub(self.evict_oldest());
            }
            self.sweep_stacks();
        }
    }

    /// Drops the oldest slice, counted as evicted; returns its bytes.
    fn evict_oldest(&mut self) -> usize {
        let Some(held) = self.pop_oldest() else {
            return 0;
        };
        self.evicted_slices += 1;
        self.evicted_rows += held.block.rows as u64;
        held.bytes
    }

    fn pop_oldest(&mut self) -> Option<Held> {
        let held = self.slices.pop_front()?;
        self.forget(&held);
        Some(held)
    }

    /// Inserts `held` at `i`, counting what it costs.
    fn hold(&mut self, held: Held, i: usize) {
        self.slice_bytes += held.bytes;
        for (pid, b) in &held.by_pid {
            *self.pid_bytes.entry(*pid).or_default() += b;
        }
        self.slices.insert(i, held);
    }

    /// Stops counting what `held` (taken out) cost.
    fn forget(&mut self, held: &Held) {
        self.slice_bytes -= held.bytes;
        for (pid, b) in &held.by_pid {
            share::take(&mut self.pid_bytes, *pid, *b);
        }
    }

    /// Slice `i` decoded. A block the store sealed itself decodes; were it
    /// ever not to, its span is kept empty (logged) rather than the
    /// daemon stopped.
    fn open(&self, i: usize) -> Slice {
        open_block(&self.slices[i].block)
    }

    /// Replaces slice `i` with `slice` (its rows folded or shed), sealed
    /// anew: what each process brought stays (less `dropped`'s).
    fn replace(
        &mut self,
        i: usize,
        slice: &Slice,
        folded: merge::FoldedPids,
        dropped: Option<u32>,
    ) {
        let Some(old) = self.slices.remove(i) else {
            return;
        };
        self.forget(&old);
        let mut brought = old.brought;
        if let Some(pid) = dropped {
            brought.remove(&pid);
        }
        self.hold(Held::seal(slice, brought, old.step_s, folded), i);
    }

    /// Forgets the stacks no slice holds any more. A stack that a query's
    /// snapshot still holds is kept until a later sweep.
    fn sweep_stacks(&mut self) {
        let mut freed = 0;
        let names = &mut self.names;
        self.stacks.retain(|s| {
            let held = Arc::strong_count(s) > 1;
            if !held {
                freed += size::stack_bytes(s);
                s.iter().for_each(|f| names.remove(f));
            }
            held
        });
        self.stack_bytes -= freed;
    }

    /// Running totals per process; a process is forgotten once nothing of
    /// it is left in the retention window (its series then go stale).
    pub fn process_totals(&self) -> &HashMap<u32, ProcessTotals> {
        &self.processes
    }

    /// Runqueue waits since start by victim and culprit cgroup.
    pub fn cgroup_kept_off(&self) -> &kept_off_totals::CgroupKeptOff {
        &self.kept_off
    }

    fn add_process_totals(&mut self, slice: &Slice) {
        process_totals::add(&mut self.processes, slice, self.retention);
    }

    /// Every slice kept, decoded.
    pub fn all(&self) -> impl Iterator<Item = Slice> + '_ {
        self.slices.iter().map(|h| open_block(&h.block))
    }

    /// BPF loss counters summed since start.
    pub fn totals(&self) -> &StatDeltas {
        &self.totals
    }

    /// Number of distinct stacks held.
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }

    /// Sizes and evictions; cheap (no walk).
    pub fn stats(&self) -> StoreStats {
        let history = match (self.slices.front(), self.slices.back()) {
            (Some(first), Some(last)) => last
                .block
                .end
                .duration_since(first.block.start)
                .unwrap_or_default(),
            _ => Duration::ZERO,
        };
        StoreStats {
            slices: self.slices.len(),
            stacks: self.stacks.len(),
            bytes: self.bytes(),
            slice_bytes: self.slice_bytes,
            stack_bytes: self.stack_bytes,
            name_bytes: self.names.bytes(),
            live_threads: self.live.threads.len(),
            live_bytes: self.live_bytes,
            max_bytes: self.max_bytes,
            process_totals: self.processes.len(),
            history_s: history.as_secs(),
            compacted_slices: self.compacted_slices,
            folded_slices: self.slices.iter().filter(|h| h.folded.any()).count(),
            stack_rows: self.slices.iter().map(|h| h.block.rows).sum(),
            evicted_slices: self.evicted_slices,
            evicted_rows: self.evicted_rows,
            shed_rows: self.shed_rows,
            folded_parts: self.folded_parts,
        }
    }
}

#[cfg(test)]
mod compact_tests;
#[cfg(test)]
mod history_tests;
#[cfg(test)]
mod tests;
