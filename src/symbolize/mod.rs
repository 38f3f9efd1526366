//! Turning raw instruction pointers into frame names.
//!
//! Runs at drain time, while the sampled processes are most likely alive;
//! the store only ever holds names. Kernel frames come from kallsyms, native
//! frames from ELF symbol tables (and separate debug files), both through
//! blazesym; results are cached per file and offset across batches
//! ([`frame_cache`]), so a library mapped by many processes is looked up
//! once and a frame seen before reads no ELF file.
//!
//! Hashing: maps keyed by what the kernel gave (pids, tids, device and
//! inode, kernel addresses, stack pointers of our own) use Fx; maps keyed
//! by what a process chooses (addresses in its files, names) use a seeded
//! hash (hashbrown's default, foldhash) or std's, unless a per-process
//! budget bounds them.

pub mod elf_files;
pub mod frame_cache;
mod interner;
mod kernel_frames;
mod live;
mod procs;
mod stacks;
mod syscalls;
#[cfg(test)]
mod tests;

use std::{
    collections::{hash_map::Entry, HashMap},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use rustc_hash::FxHashMap;

use blazesym::symbolize::Symbolizer as Blaze;

use crate::{
    collect::{
        spans::{NoKeyNames, RawSpanRecord, SpanKeyNames},
        RawBatch, RecordKind,
    },
    process::{ProcKey, ProcessTable, Subscription},
    profile::model::{
        live::{keep_longest, LiveView, MAX_LIVE_THREADS},
        spans::{SpanRecord, SpanSample, SpanSlice},
        Frame, Sample, Slice, ThreadInfo, Wakeup,
    },
    runtime::{Named as NamedProc, Runtimes},
};
use elf_files::ElfFiles;
pub use elf_files::MAX_OPEN as MAX_OPEN_ELF_FILES;
use frame_cache::FrameCache;
pub use frame_cache::FrameCacheStats;
use interner::Interner;
pub use interner::{MAX_FRAME_BYTES, OVER_BUDGET as NAMES_OVER_BUDGET};
use live::Names;
use procs::Procs;
use stacks::StackSource;

/// Bytes an address cache's slot holds, its key being `key` bytes: the
/// frame it hands out and hashbrown's control byte.
fn cache_slot(key: usize) -> usize {
    key + std::mem::size_of::<Frame>() + 1
}

/// The address caches' bytes: the two fifths of the budget's `names` part
/// that the interner leaves them, half for native frames (bounded before
/// each insertion, see [`frame_cache`]), half for kernel ones.
fn caches_bytes() -> usize {
    crate::budget::bytes(crate::budget::Part::Names) / 5 * 2
}

/// The kernel cache grows with the kernel code that runs; past this many
/// entries it starts over: at most twice this many slots once it grew past
/// it, again doubled by one batch's growth, within its half.
fn kernel_cache_limit() -> usize {
    (caches_bytes() / 2 / (2 * 4 * cache_slot(32))).max(1024)
}
/// Batches between two prunings of the name interner.
const PRUNE_EVERY_BATCHES: u64 = 30;

/// What one batch becomes once named: history for the store, and the
/// newest live view, which replaces the store's previous one.
pub struct Named {
    pub slice: Slice,
    pub live: LiveView,
}

/// Symbolizes [`RawBatch`]es into [`Slice`]s and [`LiveView`]s. Not
/// `Send` (blazesym's symbolizer is not): it lives on the thread that
/// created it.
pub struct Symbolizer {
    /// For kernel frames; user files have their own, in `elf`.
    blaze: Blaze,
    elf: ElfFiles,
    procs: Procs,
    /// Native frames by file and offset, across batches.
    frames: FrameCache,
    kernel_cache: FxHashMap<u64, Frame>,
    interner: Interner,
    batches: u64,
    /// The language runtimes that name what native symbols do not (see
    /// [`crate::runtime`]), asked in order.
    runtimes: Runtimes,
    /// The process table's changes: the runtimes' caches forget a process
    /// by them.
    changes: Subscription,
    /// Names of span attributes' keys per process.
    span_key_names: Arc<dyn SpanKeyNames>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// A symbolizer with empty caches and a process table of its own,
    /// filled from `/proc` as processes are seen (no lifecycle events),
    /// naming the runtimes wallscope reads (no agent, no walk entries).
    pub fn new() -> Self {
        let table: Arc<ProcessTable> = Arc::default();
        let runtimes = crate::runtimes::standard(&table);
        Self::with_runtimes(table, runtimes)
    }

    /// A symbolizer that reads processes from `table` and names runtime
    /// frames and threads through `runtimes`.
    pub fn with_runtimes(table: Arc<ProcessTable>, runtimes: Runtimes) -> Self {
        let blaze = Blaze::builder()
            .enable_code_info(false)
            .enable_inlined_fns(false)
            .build();
        Symbolizer {
            blaze,
            elf: ElfFiles::default(),
            changes: table.subscribe(),
            procs: Procs::new(table.clone()),
            frames: FrameCache::new(caches_bytes() / 2),
            kernel_cache: FxHashMap::default(),
            interner: Interner::new(table),
            batches: 0,
            runtimes,
            span_key_names: Arc::new(NoKeyNames),
        }
    }

    /// Names span attributes' keys through `names` (by default none are
    /// known: attributes are named by their index).
    pub fn set_span_key_names(&mut self, names: Arc<dyn SpanKeyNames>) {
        self.span_key_names = names;
    }

    /// Symbolizes one drained batch: its slice of history, and the live
    /// view of the threads that were off-CPU when it was drained.
    pub fn symbolize(&mut self, batch: RawBatch) -> Named {
        if self.kernel_cache.len() > kernel_cache_limit() {
            self.kernel_cache.clear();
        }
        self.batches += 1;
        if self.batches.is_multiple_of(PRUNE_EVERY_BATCHES) || self.interner.full() {
            self.prune_names();
        }
        self.procs.begin_batch(batch_began(&batch));
        self.frames.begin_batch();
        self.runtimes.each(|r| r.begin_batch());
        self.forget_ended();
        let RawBatch {
            end,
            interval,
            records,
            threads: totals,
            runq_hists,
            kept_off,
            sleeps,
            mut live,
            stats,
            span_times,
            span_records,
            ..
        } = batch;
        // The longest waits only: the others are neither named nor kept.
        let left_out = keep_longest(&mut live, MAX_LIVE_THREADS, |l| (l.in_state, l.pid, l.tid));
        let sources: Vec<StackSource> = records
            .iter()
            .map(StackSource::of_record)
            .chain(live.iter().map(StackSource::of_live))
            .collect();
        let mut stacks = self.name_stacks(&sources);
        let live_stacks = stacks.split_off(records.len());

        // An interrupt is no thread: pid 0 must keep its own name (the
        // idle task's), and the interrupt its `[irq]` frame.
        let names = records
            .iter()
            .filter(|r| !r.from_interrupt())
            .map(|r| (r.pid, r.tid, r.comm.as_str()));
        let names = names
            .chain(totals.iter().map(|t| (t.pid, t.tid, t.comm.as_str())))
            .chain(live.iter().map(|l| (l.pid, l.tid, l.comm.as_str())));
        let (threads, processes) = self.name_threads(names);
        let containers = processes
            .keys()
            .filter_map(|pid| Some((*pid, self.procs.container(*pid)?)))
            .collect();
        let origins = processes
            .keys()
            .filter_map(|pid| Some((*pid, self.procs.origin(*pid)?)))
            .collect();
        let mut samples = Vec::with_capacity(records.len());
        let mut wakeups = Vec::new();
        let mut span_samples = Vec::new();
        for (record, stack) in records.iter().zip(stacks) {
            let (pid, tid, ns, count) = (record.pid, record.tid, record.ns, record.count);
            match record.kind {
                RecordKind::Time(state) => {
                    // Under a span: also the span's row, the main one as
                    // ever (the store's rows do not multiply by spans).
                    if let Some(span) = record.span {
                        span_samples.push(SpanSample {
                            pid,
                            tid,
                            span,
                            state,
                            stack: stack.clone(),
                            ns,
                            count,
                        });
                    }
                    samples.push(Sample {
                        pid,
                        tid,
                        state,
                        stack,
                        ns,
                        count,
                    })
                }
                RecordKind::Wakeup { peer_pid, peer_tid } => {
                    let interrupt = record
                        .from_interrupt()
                        .then(|| kernel_frames::interrupt(&stack));
                    // What the interrupt interrupted (the idle loop, a
                    // syscall, a kworker's work) is not part of its story.
                    let stack = match interrupt.and(kernel_frames::interrupt_entry(&stack)) {
                        Some(at) if at > 0 => stack[at..].iter().cloned().collect(),
                        _ => stack,
                    };
                    wakeups.push(Wakeup {
                        pid,
                        tid,
                        interrupt,
                        peer_pid,
                        peer_tid,
                        stack,
                        ns,
                        count,
                    })
                }
            }
        }
        let live = self.live_view(
            live.into_iter().zip(live_stacks),
            left_out,
            Names {
                threads: &threads,
                processes: &processes,
            },
            end,
        );
        self.runtimes.each(|r| r.end_batch(&threads));
        self.procs.end_batch();
        self.elf.end_batch();
        self.frames.end_batch();
        self.publish_held();
        let start = end.checked_sub(interval).unwrap_or(SystemTime::UNIX_EPOCH);
        let slice = Slice {
            start,
            end,
            samples,
            wakeups,
            threads,
            thread_totals: totals,
            runq_hists,
            processes,
            containers,
            origins,
            kept_off,
            sleeps,
            stats,
            spans: SpanSlice {
                records: self.span_records(&span_records),
                times: span_times,
                samples: span_samples,
            },
        };
        Named { slice, live }
    }

    /// The records' attributes, named by each process's key map.
    fn span_records(&self, raw: &[RawSpanRecord]) -> Vec<SpanRecord> {
        let mut names: FxHashMap<u32, Option<Arc<[Arc<str>]>>> = FxHashMap::default();
        raw.iter()
            .map(|r| {
                let known = names
                    .entry(r.pid)
                    .or_insert_with(|| self.span_key_names.names(r.pid));
                r.parse(known.as_deref())
            })
            .collect()
    }

    /// Drops the runtimes' state of processes whose program ended (see
    /// [`crate::process::Subscription`]).
    fn forget_ended(&mut self) {
        let due = self.changes.poll(Instant::now());
        for key in due.forget {
            self.runtimes.each(|r| r.forget(key));
        }
        if due.check_all {
            let table = self.changes.table().clone();
            self.runtimes.each(|r| r.retain(&|k| table.knows(k)));
        }
    }

    /// Names of the batch's threads (the runtime's own name where one gave
    /// it) and processes, by tid and pid; the first name seen wins.
    fn name_threads<'a>(
        &mut self,
        names: impl Iterator<Item = (u32, u32, &'a str)>,
    ) -> (HashMap<u32, ThreadInfo>, HashMap<u32, Frame>) {
        let mut threads = HashMap::new();
        let mut processes = HashMap::new();
        for (pid, tid, comm) in names {
            if let Entry::Vacant(slot) = threads.entry(tid) {
                let proc = self.named_proc(pid, comm);
                let interner = &mut self.interner;
                let name = (self.runtimes).first(|r| r.thread_name(&proc, tid, interner));
                slot.insert(ThreadInfo {
                    pid,
                    name: name.unwrap_or_else(|| self.interner.get_for(pid, comm)),
                });
            }
            if let Entry::Vacant(slot) = processes.entry(pid) {
                let name = self.procs.name(pid).unwrap_or_else(|| comm.to_string());
                slot.insert(self.interner.get_for(pid, &name));
            }
        }
        (threads, processes)
    }

    /// Process `pid` as thread `comm` saw it, for the runtimes.
    pub(super) fn named_proc(&mut self, pid: u32, comm: &str) -> NamedProc {
        // The key is the image's (one lookup), else the pid's alone.
        let image = self.procs.image(pid, comm);
        NamedProc {
            key: image.as_ref().map_or(ProcKey::of_pid(pid), |i| i.key()),
            image,
        }
    }

    fn intern(&mut self, name: &str) -> Frame {
        self.interner.get(name)
    }

    /// Lets go of names no stored slice uses; when that is not enough to
    /// get near [`interner::max_bytes`] (checked as each name is inserted),
    /// the frame caches start over too, so that names no slice uses go.
    fn prune_names(&mut self) {
        self.interner.prune();
        if self.interner.bytes() > interner::max_bytes() / 10 * 9 {
            self.frames.clear();
            self.kernel_cache.clear();
            self.runtimes.each(|r| r.clear_names());
            self.interner.prune();
        }
    }

    /// Batches symbolized so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Tells [`crate::held`] what the names and the runtimes' code it decoded
    /// hold, with their bounds (running counters: no walk).
    fn publish_held(&self) {
        use crate::held::{set, Holder};
        // The address caches that hand the names out count with them:
        // by capacity (one control byte per slot).
        let mut runtime_caches = 0;
        self.runtimes.each(|r| runtime_caches += r.held());
        let caches = self.frames.bytes()
            + self.kernel_cache.capacity() * cache_slot(std::mem::size_of::<u64>())
            + runtime_caches;
        // The kernel cache is cleared past kernel_cache_limit() at the
        // start of a batch; one batch may grow it once more (it doubles).
        let max_caches = self.frames.max_bytes() + 2 * 4 * kernel_cache_limit() * cache_slot(32);
        set(
            Holder::SymbolizerNames,
            (self.interner.bytes() + caches) as u64,
            Some((interner::max_bytes() + max_caches) as u64),
        );
        if !self.kernel_cache.is_empty() {
            // blazesym parsed kallsyms at the first kernel frame.
            static KSYMS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
            let bytes = *KSYMS.get_or_init(crate::process::own::kallsyms_bytes);
            set(Holder::KernelSymbols, bytes, Some(bytes));
        }
    }

    /// Bytes of frame names held, and ELF files open (for `/healthz`).
    pub fn held(&self) -> (usize, usize) {
        (self.interner.bytes(), self.elf.len())
    }

    /// The native frame cache's counters and what the ELF files' own
    /// symbolizers did (for `/healthz`).
    pub fn cache_stats(&self) -> FrameCacheStats {
        let (elf_parses, elf_lookups) = self.elf.work();
        FrameCacheStats {
            elf_parses,
            elf_lookups,
            ..self.frames.stats()
        }
    }
}

/// When the batch's records began to be taken, on the monotonic clock the
/// process table keeps (with a margin for the drain's own duration).
fn batch_began(batch: &RawBatch) -> Instant {
    let age = SystemTime::now()
        .duration_since(batch.end)
        .unwrap_or_default()
        + batch.interval
        + batch.drain_time
        + Duration::from_millis(100);
    Instant::now().checked_sub(age).unwrap_or_else(Instant::now)
}
