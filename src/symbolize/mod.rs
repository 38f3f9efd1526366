//! Turning raw instruction pointers into frame names.
//!
//! Runs at drain time, while the sampled processes are most likely alive;
//! the store only ever holds names. Kernel frames come from kallsyms, native
//! frames from ELF symbol tables (and separate debug files), both through
//! blazesym; results are cached per file and offset, so a library mapped by
//! many processes is looked up once and repeated queries read no ELF file.

mod elf_files;
mod interner;
mod jit;
mod kernel_frames;
pub use crate::process::maps;
pub(crate) mod perfmap;
mod procs;
mod syscalls;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use rustc_hash::FxHashMap;

use blazesym::symbolize::{
    source::{Kernel, Source},
    Input, Symbolized, Symbolizer as Blaze,
};

use crate::{
    bpf::abi::{is_merged_tid, State},
    collect::{RawBatch, RawRecord, RecordKind},
    jvm::{agent::Sighting, frames, Jvms},
    process::ProcessTable,
    profile::{Frame, Sample, Slice, Stack, ThreadInfo, Wakeup},
};
use elf_files::ElfFiles;
pub use elf_files::{MAX_ELF_BYTES, MAX_OPEN as MAX_OPEN_ELF_FILES};
use interner::Interner;
pub use interner::MAX_FRAME_BYTES;
use procs::{FileKey, Found, Procs};

/// Caches grow with the code that runs; past this many entries they start over.
const CACHE_LIMIT: usize = 1 << 20;
/// Batches between two prunings of the name interner.
const PRUNE_EVERY_BATCHES: u64 = 30;
/// Bytes of frame names the interner may hold after pruning; past this the
/// frame caches start over, so that names no slice uses any more go.
pub const NAME_BUDGET_BYTES: usize = 128 << 20;

/// Where one user address points, before symbolization.
#[derive(Debug, Clone)]
enum Location {
    File {
        file: FileKey,
        offset: u64,
    },
    Vdso,
    /// JIT code named by the process's perf map.
    Jit(Frame),
    Unknown,
}

/// Where the symbolizer reports the JVMs it sees and reads their thread
/// names from.
pub struct JvmLink {
    pub jvms: Arc<Jvms>,
    /// Bounded: a JVM agent busy with a slow JVM must not hold up drains.
    pub sightings: std::sync::mpsc::SyncSender<Sighting>,
    /// Sightings dropped because the agent's queue was full.
    pub dropped: Arc<AtomicU64>,
}

/// Symbolizes [`RawBatch`]es into [`Slice`]s. Not `Send` (blazesym's
/// symbolizer is not): it lives on the thread that created it.
pub struct Symbolizer {
    /// For kernel frames; user files have their own, in `elf`.
    blaze: Blaze,
    elf: ElfFiles,
    procs: Procs,
    user_cache: FxHashMap<(FileKey, u64), Frame>,
    kernel_cache: FxHashMap<u64, Frame>,
    interner: Interner,
    batches: u64,
    jit: jit::JitMaps,
    jvm: Option<JvmLink>,
    /// JVMs of the current batch, and whether JIT lookups missed in them.
    jvms_seen: HashMap<u32, bool>,
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
            procs: Procs::new(table),
            user_cache: FxHashMap::default(),
            kernel_cache: FxHashMap::default(),
            interner: Interner::default(),
            batches: 0,
            jit: jit::JitMaps::default(),
            jvm: None,
            jvms_seen: HashMap::new(),
        }
    }

    /// A symbolizer that reads processes from `table`, reports JVMs to the
    /// JVM agent and uses the Java thread names it finds.
    pub fn with_jvms(table: Arc<ProcessTable>, link: JvmLink) -> Self {
        Symbolizer {
            jvm: Some(link),
            ..Symbolizer::with_table(table)
        }
    }

    /// Symbolizes one drained batch.
    pub fn symbolize(&mut self, batch: RawBatch) -> Slice {
        if self.user_cache.len() > CACHE_LIMIT {
            self.user_cache.clear();
        }
        if self.kernel_cache.len() > CACHE_LIMIT {
            self.kernel_cache.clear();
        }
        self.batches += 1;
        if self.batches.is_multiple_of(PRUNE_EVERY_BATCHES) {
            self.prune_names();
        }
        self.procs.begin_batch(batch_began(&batch));
        self.jit.begin_batch();

        // Rows of many threads share their stacks (a pool's workers waiting
        // in the same place): each distinct stack of a process is located
        // and named once per batch.
        let mut distinct: FxHashMap<StackIdentity, usize> = FxHashMap::default();
        let mut firsts: Vec<&RawRecord> = Vec::new();
        let which: Vec<usize> = batch
            .records
            .iter()
            .map(|r| {
                *distinct.entry(StackIdentity::of(r)).or_insert_with(|| {
                    firsts.push(r);
                    firsts.len() - 1
                })
            })
            .collect();
        let locations: Vec<Vec<Location>> = firsts.iter().map(|r| self.locate_user(r)).collect();
        self.resolve_user(&locations);
        self.resolve_kernel(&batch.records);
        let stacks: Vec<Stack> = firsts
            .iter()
            .zip(&locations)
            .map(|(r, locs)| self.stack(r, locs))
            .collect();

        let mut threads = HashMap::new();
        let mut processes = HashMap::new();
        let mut samples = Vec::with_capacity(batch.records.len());
        let mut wakeups = Vec::new();
        // An interrupt is no thread: pid 0 must keep its own name (the
        // idle task's), and the interrupt its `[irq]` frame.
        let names = batch
            .records
            .iter()
            .filter(|r| !r.from_interrupt())
            .map(|r| (r.pid, r.tid, r.comm.as_str()));
        let names = names.chain(
            batch
                .threads
                .iter()
                .map(|t| (t.pid, t.tid, t.comm.as_str())),
        );
        for (pid, tid, comm) in names {
            if let std::collections::hash_map::Entry::Vacant(slot) = threads.entry(tid) {
                let java_name = self.jvm.as_ref().and_then(|j| j.jvms.thread_name(pid, tid));
                slot.insert(ThreadInfo {
                    pid,
                    name: java_name.unwrap_or_else(|| self.intern(comm)),
                });
            }
            if let std::collections::hash_map::Entry::Vacant(slot) = processes.entry(pid) {
                let name = self.procs.name(pid).unwrap_or_else(|| comm.to_string());
                slot.insert(self.intern(&name));
            }
        }
        for (record, k) in batch.records.iter().zip(which) {
            let stack = stacks[k].clone();
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
                RecordKind::Wakeup { peer_pid, peer_tid } => wakeups.push(Wakeup {
                    pid,
                    tid,
                    interrupt: record
                        .from_interrupt()
                        .then(|| kernel_frames::interrupt(&stack)),
                    peer_pid,
                    peer_tid,
                    stack,
                    ns,
                    count,
                }),
            }
        }
        self.report_jvms(&threads);
        self.procs.end_batch();
        self.elf.end_batch();
        let start = batch
            .end
            .checked_sub(batch.interval)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Slice {
            start,
            end: batch.end,
            samples,
            wakeups,
            threads,
            thread_totals: batch.threads,
            runq_hists: batch.runq_hists,
            processes,
            stats: batch.stats,
        }
    }

    /// Tells the JVM agent which JVMs ran, whether their perf maps missed
    /// code, and which of their threads still lack a Java name.
    fn report_jvms(&mut self, threads: &HashMap<u32, ThreadInfo>) {
        let seen = std::mem::take(&mut self.jvms_seen);
        let Some(link) = &self.jvm else {
            return;
        };
        for (pid, jit_misses) in seen {
            let unnamed_tids = threads
                .iter()
                .filter(|(tid, t)| {
                    t.pid == pid && !is_merged_tid(**tid) && !link.jvms.knows_thread(pid, **tid)
                })
                .map(|(tid, _)| *tid)
                .collect();
            let sighting = Sighting {
                pid,
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
    /// get under [`NAME_BUDGET_BYTES`], the frame caches start over too.
    fn prune_names(&mut self) {
        self.interner.prune();
        if self.interner.bytes() > NAME_BUDGET_BYTES {
            self.user_cache.clear();
            self.kernel_cache.clear();
            self.jit.clear_frames();
            self.interner.prune();
        }
    }

    /// Batches symbolized so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Bytes of frame names held, and ELF files open (for `/healthz`).
    pub fn held(&self) -> (usize, usize) {
        (self.interner.bytes(), self.elf.len())
    }

    fn locate_user(&mut self, record: &RawRecord) -> Vec<Location> {
        let Some(ips) = &record.user_stack else {
            return Vec::new();
        };
        let pid = record.pid;
        let found: Vec<(u64, Option<Found>)> = ips
            .iter()
            .enumerate()
            .map(|(i, &ip)| {
                // Callers' frames hold return addresses, which may already
                // belong to the next line or function: look up the call.
                let addr = if i == 0 { ip } else { ip.saturating_sub(1) };
                (addr, self.procs.find(pid, &record.comm, addr))
            })
            .collect();
        let jvm = self.procs.is_jvm(pid, &record.comm);
        if jvm {
            self.jvms_seen.entry(pid).or_insert(false);
        }
        found
            .into_iter()
            .map(|(addr, found)| match found {
                Some(Found::File { file, offset }) => Location::File { file, offset },
                Some(Found::Vdso) => Location::Vdso,
                Some(Found::Anon) => self.locate_jit(pid, addr, jvm),
                None => Location::Unknown,
            })
            .collect()
    }

    /// Code in anonymous executable memory: JIT code if a perf map names it.
    fn locate_jit(&mut self, pid: u32, addr: u64, jvm: bool) -> Location {
        let interner = &mut self.interner;
        let found = self.jit.find(pid, addr, |name| {
            interner.get(&frames::frame_name(name, jvm))
        });
        match found {
            Some(frame) => Location::Jit(frame),
            None if jvm => {
                self.jvms_seen.insert(pid, true);
                Location::Jit(self.intern(frames::NOT_IN_PERF_MAP))
            }
            None => Location::Unknown,
        }
    }

    fn resolve_user(&mut self, locations: &[Vec<Location>]) {
        let mut wanted: HashMap<FileKey, Vec<u64>> = HashMap::new();
        for loc in locations.iter().flatten() {
            if let Location::File { file, offset } = loc {
                if !self.user_cache.contains_key(&(*file, *offset)) {
                    wanted.entry(*file).or_default().push(*offset);
                }
            }
        }
        for (file, mut offsets) in wanted {
            offsets.sort_unstable();
            offsets.dedup();
            let Some(locator) = self.procs.locator(file) else {
                continue;
            };
            let names = self.elf.symbolize(file, locator, &offsets);
            let module = self
                .procs
                .display_name(file)
                .unwrap_or("[unknown]")
                .to_string();
            for (offset, name) in offsets.into_iter().zip(names) {
                let text = name.unwrap_or_else(|| format!("{module}+{offset:#x}"));
                let frame = self.intern(&text);
                self.user_cache.insert((file, offset), frame);
            }
        }
    }

    fn resolve_kernel(&mut self, records: &[RawRecord]) {
        let mut addrs: Vec<u64> = records
            .iter()
            .filter_map(|r| r.kernel_stack.as_ref())
            .flat_map(|s| {
                s.iter()
                    .enumerate()
                    .map(|(i, &ip)| kernel_lookup_addr(i, ip))
            })
            .filter(|a| !self.kernel_cache.contains_key(a))
            .collect();
        if addrs.is_empty() {
            return;
        }
        addrs.sort_unstable();
        addrs.dedup();
        let kernel = Kernel {
            vmlinux: blazesym::MaybeDefault::None,
            ..Kernel::default()
        };
        let names: Vec<Option<String>> = match self
            .blaze
            .symbolize(&Source::Kernel(kernel), Input::AbsAddr(&addrs))
        {
            Ok(syms) => syms.into_iter().map(sym_name).collect(),
            Err(err) => {
                tracing::warn!("kernel symbolization failed: {err}");
                vec![None; addrs.len()]
            }
        };
        for (addr, name) in addrs.into_iter().zip(names) {
            let text = format!("{}_[k]", name.as_deref().unwrap_or("[unknown]"));
            let frame = self.intern(&text);
            self.kernel_cache.insert(addr, frame);
        }
    }

    fn stack(&mut self, record: &RawRecord, locations: &[Location]) -> Stack {
        let unknown = self.intern("[unknown]");
        let vdso = self.intern("[vdso]");
        let mut frames: Vec<Frame> = locations
            .iter()
            .rev()
            .map(|loc| match loc {
                Location::File { file, offset } => self
                    .user_cache
                    .get(&(*file, *offset))
                    .cloned()
                    .unwrap_or_else(|| unknown.clone()),
                Location::Vdso => vdso.clone(),
                Location::Jit(frame) => frame.clone(),
                Location::Unknown => unknown.clone(),
            })
            .collect();
        if let Some(ips) = &record.kernel_stack {
            let unknown = self.intern("[unknown]_[k]");
            let kernel: Vec<Frame> = ips
                .iter()
                .enumerate()
                .map(|(i, &ip)| {
                    let frame = self.kernel_cache.get(&kernel_lookup_addr(i, ip));
                    frame.cloned().unwrap_or_else(|| unknown.clone())
                })
                .collect();
            // Stacks our tracepoint programs took begin with the program
            // and the glue that ran it. A CPU sample's stack is the
            // interrupted code's (perf_event programs get its registers):
            // a BPF program there is someone's real work, so it stays.
            let own = if record.kind == RecordKind::Time(State::Cpu) {
                0
            } else {
                kernel_frames::own_frames(&kernel)
            };
            frames.extend(kernel.into_iter().skip(own).rev());
        } else if let (Some(nr), false) =
            (record.syscall, record.kind == RecordKind::Time(State::Cpu))
        {
            // Off-CPU rows skip the costly kernel stack: the syscall names
            // the kernel path.
            frames.push(self.intern(&syscalls::frame(nr)));
        }
        if frames.is_empty() {
            frames.push(unknown);
        }
        frames.into()
    }
}

/// What a record's symbolized stack depends on: its process, its captured
/// stacks (shared `Arc`s: the same id gives the same pointer), and the
/// syscall frame off-CPU rows without a kernel stack get.
#[derive(PartialEq, Eq, Hash)]
struct StackIdentity {
    pid: u32,
    user: usize,
    kernel: usize,
    syscall: Option<u32>,
    cpu: bool,
}

impl StackIdentity {
    fn of(r: &RawRecord) -> StackIdentity {
        let ptr =
            |s: &Option<crate::collect::RawStack>| s.as_ref().map_or(0, |s| s.as_ptr() as usize);
        StackIdentity {
            pid: r.pid,
            user: ptr(&r.user_stack),
            kernel: ptr(&r.kernel_stack),
            syscall: r.syscall,
            cpu: r.kind == RecordKind::Time(State::Cpu),
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

fn kernel_lookup_addr(i: usize, ip: u64) -> u64 {
    if i == 0 {
        ip
    } else {
        ip.saturating_sub(1)
    }
}

fn sym_name(sym: Symbolized<'_>) -> Option<String> {
    sym.into_sym().map(|s| s.name.into_owned())
}
