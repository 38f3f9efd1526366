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
mod java;
mod jit;
mod kernel_frames;
mod live;
pub(crate) mod perfmap;
mod procs;
mod python;
mod stacks;
mod syscalls;
#[cfg(test)]
mod tests;

use std::{
    collections::{hash_map::Entry, HashMap},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use rustc_hash::FxHashMap;

use blazesym::symbolize::Symbolizer as Blaze;

use crate::{
    bpf::abi::is_merged_tid,
    collect::{RawBatch, RecordKind},
    jvm::{agent::Sighting, JvmFrames, Jvms},
    process::{ProcKey, ProcessTable, Subscription},
    profile::{
        live::{keep_longest, LiveView, MAX_LIVE_THREADS},
        Frame, Sample, Slice, ThreadInfo, Wakeup,
    },
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

/// Where the symbolizer reports the JVMs it sees and reads their thread
/// names from.
pub struct JvmLink {
    pub jvms: Arc<Jvms>,
    /// Bounded: a JVM agent busy with a slow JVM must not hold up drains.
    pub sightings: std::sync::mpsc::SyncSender<Sighting>,
    /// Sightings dropped because the agent's queue was full.
    pub dropped: Arc<AtomicU64>,
}

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
    jit: jit::JitMaps,
    java: java::JavaFrames,
    python: python::PythonFrames,
    jvm: Option<JvmLink>,
    /// JVMs of the current batch, and whether JIT lookups missed in them.
    jvms_seen: FxHashMap<ProcKey, bool>,
    /// The process table's changes: the JIT and Java caches forget a
    /// process by them.
    changes: Subscription,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// A symbolizer with empty caches and a process table of its own,
    /// filled from `/proc` as processes are seen (no lifecycle events).
    pub fn new() -> Self {
        Self::with_table(Arc::default())
    }

    /// A symbolizer that reads processes from `table`.
    pub fn with_table(table: Arc<ProcessTable>) -> Self {
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
            interner: Interner::new(table.clone()),
            batches: 0,
            jit: jit::JitMaps::new(table.clone()),
            java: java::JavaFrames::new(table),
            python: python::PythonFrames::default(),
            jvm: None,
            jvms_seen: FxHashMap::default(),
        }
    }

    /// A symbolizer that reads processes from `table`, reports JVMs to the
    /// JVM agent and uses the Java thread names it finds.
    pub fn with_jvms(table: Arc<ProcessTable>, link: JvmLink, frames: JvmFrames) -> Self {
        let mut s = Symbolizer {
            jvm: Some(link),
            ..Symbolizer::with_table(table)
        };
        s.java.disabled = frames == JvmFrames::PerfMap;
        s
    }

    /// Names Python frames and threads from the interpreters the unwind
    /// registry publishes in `pythons`.
    pub fn with_pythons(mut self, pythons: crate::python::registry::Pythons) -> Self {
        self.python = python::PythonFrames::new(pythons);
        self
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
        self.python.start_batch();
        self.forget_ended();
        self.jit.begin_batch();
        self.java.begin_batch();
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
        for (record, stack) in records.iter().zip(stacks) {
            let (pid, tid, ns, count) = (record.pid, record.tid, record.ns, record.count);
            match record.kind {
                RecordKind::Time(state) => samples.push(Sample {
                    pid,
                    tid,
                    state,
                    stack,
                    ns,
                    count,
                }),
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
        self.report_jvms(&threads);
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
        };
        Named { slice, live }
    }

    /// Drops the JIT and Java state of processes whose program ended (see
    /// [`crate::process::Subscription`]).
    fn forget_ended(&mut self) {
        let due = self.changes.poll(Instant::now());
        for key in due.forget {
            self.jit.forget(key);
            self.java.forget(key);
            self.python.forget(key);
        }
        if due.check_all {
            let table = self.changes.table().clone();
            self.jit.retain(|k| table.knows(k));
            self.java.retain(|k| table.knows(k));
        }
    }

    /// Names of the batch's threads (full Java names where the JVM agent
    /// found them) and processes, by tid and pid; the first name seen wins.
    fn name_threads<'a>(
        &mut self,
        names: impl Iterator<Item = (u32, u32, &'a str)>,
    ) -> (HashMap<u32, ThreadInfo>, HashMap<u32, Frame>) {
        let mut threads = HashMap::new();
        let mut processes = HashMap::new();
        for (pid, tid, comm) in names {
            if let Entry::Vacant(slot) = threads.entry(tid) {
                let key = self.procs.key(pid, comm);
                let java_name = self.jvm.as_ref().and_then(|j| j.jvms.thread_name(key, tid));
                let name = java_name.or_else(|| self.python_thread_name(pid, tid));
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

    /// Python's name of thread `tid` of `pid`, if it runs a registered
    /// interpreter that named it.
    fn python_thread_name(&mut self, pid: u32, tid: u32) -> Option<Frame> {
        let proc = self.python.process(pid)?;
        let name = proc.names.get(&tid)?;
        Some(self.interner.get_for(pid, name))
    }

    /// Tells the JVM agent which JVMs ran, whether their perf maps missed
    /// code, and which of their threads still lack a Java name.
    fn report_jvms(&mut self, threads: &HashMap<u32, ThreadInfo>) {
        let seen = std::mem::take(&mut self.jvms_seen);
        let Some(link) = &self.jvm else {
            return;
        };
        for (key, jit_misses) in seen {
            let pid = key.pid;
            if let Some(frames) = self.java.status(key) {
                link.jvms.set_frames(pid, frames);
            }
            let unnamed_tids = threads
                .iter()
                .filter(|(tid, t)| {
                    t.pid == pid && !is_merged_tid(**tid) && !link.jvms.knows_thread(key, **tid)
                })
                .map(|(tid, _)| *tid)
                .collect();
            let sighting = Sighting {
                key,
                jit_misses,
                unnamed_tids,
            };
            if let Err(std::sync::mpsc::TrySendError::Full(_)) = link.sightings.try_send(sighting) {
                link.dropped.fetch_add(1, Ordering::Relaxed);
            }
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
            self.jit.clear_frames();
            self.python.clear_names();
            self.interner.prune();
        }
    }

    /// Batches symbolized so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Tells [`crate::held`] what the names and the JVM code it decoded
    /// hold, with their bounds (running counters: no walk).
    fn publish_held(&self) {
        use crate::held::{set, Holder};
        // The address caches that hand the names out count with them:
        // by capacity (one control byte per slot).
        let caches = self.frames.bytes()
            + self.kernel_cache.capacity() * cache_slot(std::mem::size_of::<u64>())
            + self.python.held_bytes();
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
        set(
            Holder::PerfMapNames,
            self.jit.bytes() as u64,
            Some(jit::budget_bytes() as u64),
        );
        set(
            Holder::JvmCode,
            self.java.bytes() as u64,
            Some(java::nmethod_budget_bytes() as u64),
        );
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
