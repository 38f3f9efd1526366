//! Naming stacks. Rows of many threads share their stacks (a pool's
//! workers waiting in the same place), and so do the live view's blocked
//! threads: each distinct stack of a process is located and named once per
//! batch, whether a record or a live thread brought it.

use blazesym::symbolize::{
    source::{Kernel, Source},
    Input, Symbolized,
};
use rustc_hash::FxHashMap;

use super::{
    procs::Found,
    python::{self, PyPart},
    syscalls, Symbolizer,
};
use crate::process::{files::FileKey, ProcKey};
use crate::{
    bpf::abi::{State, JAVA_METHOD_TAG, UNWIND_PENDING_FRAME},
    collect::{RawLive, RawRecord, RawStack, RecordKind},
    jvm::frames,
    profile::{Frame, Stack},
};

/// Where one user address points, before symbolization.
#[derive(Debug, Clone)]
enum Location {
    File {
        file: FileKey,
        offset: u64,
    },
    /// A file offset once named (from the frame cache or its file).
    Named(Frame),
    Vdso,
    /// JIT code named by the process's perf map.
    Jit(Frame),
    /// Java frames read from the JVM: a compiled method and the methods
    /// inlined into it, outermost first, or one interpreted method.
    Java(Vec<Frame>),
    /// Where the walk stopped for want of a table not loaded yet.
    Pending,
    Unknown,
}

/// The frame in place of the callers a walk could not vouch for because
/// their code's unwind table was still pending.
pub const PENDING_FRAME: &str = "[tables pending]";

/// What naming one stack needs, from a record or a live thread.
#[derive(Clone, Copy)]
pub(super) struct StackSource<'a> {
    pid: u32,
    /// Thread name: which image a pid that exec'd in the batch had.
    comm: &'a str,
    user: Option<&'a RawStack>,
    kernel: Option<&'a RawStack>,
    /// Named as a `[syscall NAME]` frame when there is no kernel stack.
    syscall: Option<u32>,
    /// On-CPU samples get no syscall frame: the thread was not blocked.
    on_cpu: bool,
}

impl<'a> StackSource<'a> {
    pub(super) fn of_record(r: &'a RawRecord) -> Self {
        StackSource {
            pid: r.pid,
            comm: &r.comm,
            user: r.user_stack.as_ref(),
            kernel: r.kernel_stack.as_ref(),
            syscall: r.syscall,
            on_cpu: r.kind == RecordKind::Time(State::Cpu),
        }
    }

    pub(super) fn of_live(l: &'a RawLive) -> Self {
        StackSource {
            pid: l.pid,
            comm: &l.comm,
            user: l.user_stack.as_ref(),
            kernel: l.kernel_stack.as_ref(),
            syscall: l.syscall,
            on_cpu: false,
        }
    }
}

/// What a symbolized stack depends on: its process, its captured stacks
/// (shared `Arc`s: the same id gives the same pointer), and the syscall
/// frame off-CPU stacks without a kernel stack get.
#[derive(PartialEq, Eq, Hash)]
struct StackIdentity {
    pid: u32,
    user: usize,
    kernel: usize,
    syscall: Option<u32>,
    cpu: bool,
}

impl StackIdentity {
    fn of(s: &StackSource) -> StackIdentity {
        let ptr = |s: Option<&RawStack>| s.map_or(0, |s| s.as_ptr() as usize);
        StackIdentity {
            pid: s.pid,
            user: ptr(s.user),
            kernel: ptr(s.kernel),
            syscall: s.syscall,
            cpu: s.on_cpu,
        }
    }
}

impl Symbolizer {
    /// The stack of each source, in order; sources with equal
    /// [`StackIdentity`] share one (located and named once).
    pub(super) fn name_stacks(&mut self, sources: &[StackSource]) -> Vec<Stack> {
        let mut distinct: FxHashMap<StackIdentity, usize> = FxHashMap::default();
        let mut firsts: Vec<StackSource> = Vec::new();
        let which: Vec<usize> = sources
            .iter()
            .map(|s| {
                *distinct.entry(StackIdentity::of(s)).or_insert_with(|| {
                    firsts.push(*s);
                    firsts.len() - 1
                })
            })
            .collect();
        let mut locations: Vec<Vec<Location>> =
            firsts.iter().map(|s| self.locate_user(s)).collect();
        let python: Vec<Option<PyPart>> = firsts.iter().map(|s| self.python_part(s)).collect();
        self.resolve_user(&firsts, &mut locations);
        self.resolve_kernel(&firsts);
        let stacks: Vec<Stack> = firsts
            .iter()
            .zip(&locations)
            .zip(&python)
            .map(|((s, locs), py)| self.stack(s, locs, py.as_ref()))
            .collect();
        which.into_iter().map(|k| stacks[k].clone()).collect()
    }

    /// The Python frames the walk appended to a stack's native ones.
    fn python_part(&mut self, source: &StackSource) -> Option<PyPart> {
        let ips = source.user?;
        let first = ips.iter().position(|&ip| python::is_python(ip))?;
        Some(
            self.python
                .part(source.pid, &ips[first..], &mut self.interner),
        )
    }

    fn locate_user(&mut self, source: &StackSource) -> Vec<Location> {
        let Some(ips) = source.user else {
            return Vec::new();
        };
        // Python frames follow the native ones (see `python_part`).
        let native = ips.iter().take_while(|&&ip| !python::is_python(ip)).count();
        let ips = &ips[..native];
        let (pid, comm) = (source.pid, source.comm);
        let key = self.procs.key(pid, comm);
        let found: Vec<(u64, Option<Found>)> = ips
            .iter()
            .enumerate()
            .map(|(i, &ip)| {
                if ip & JAVA_METHOD_TAG != 0 || ip == UNWIND_PENDING_FRAME {
                    return (ip, None);
                }
                // Callers' frames hold return addresses, which may already
                // belong to the next line or function: look up the call.
                let addr = if i == 0 { ip } else { ip.saturating_sub(1) };
                (addr, self.procs.find(pid, comm, addr))
            })
            .collect();
        let jvm = self.procs.is_jvm(pid, comm);
        if jvm {
            self.jvms_seen.entry(key).or_insert(false);
        }
        found
            .into_iter()
            .enumerate()
            .map(|(i, (addr, found))| match found {
                Some(Found::File { file, offset }) => Location::File { file, offset },
                Some(Found::Vdso) => Location::Vdso,
                Some(Found::Anon) => self.locate_jit(key, addr, i == 0, jvm),
                None if addr == UNWIND_PENDING_FRAME => Location::Pending,
                None if jvm && addr & JAVA_METHOD_TAG != 0 => {
                    let method = addr & !JAVA_METHOD_TAG;
                    Location::Java(vec![self.java.interpreted(key, method, &mut self.interner)])
                }
                None => Location::Unknown,
            })
            .collect()
    }

    /// Code in anonymous executable memory: a compiled Java method read
    /// from the JVM, else JIT code if a perf map names it. `addr` is the
    /// frame's pc, less one unless `leaf` (see `locate_user`).
    fn locate_jit(&mut self, key: ProcKey, addr: u64, leaf: bool, jvm: bool) -> Location {
        if jvm {
            // The nmethod's pc descriptors are keyed by return address.
            let pc = if leaf { addr } else { addr + 1 };
            if let Some(frames) = self.java.compiled(key, pc, leaf, &mut self.interner) {
                return Location::Java(frames);
            }
        }
        let interner = &mut self.interner;
        let found = self.jit.find(key, addr, |name| {
            interner.get_for(key.pid, &frames::frame_name(name, jvm))
        });
        match found {
            Some(frame) => Location::Jit(frame),
            None if jvm => {
                self.jvms_seen.insert(key, true);
                Location::Jit(self.intern(frames::NOT_IN_PERF_MAP))
            }
            None => Location::Unknown,
        }
    }

    /// Names the file offsets `locations` (one list per source) point at,
    /// from the frame cache, else from their files (each asked once for
    /// all it missed); a new name counts against the share of the first
    /// process that wanted its file.
    fn resolve_user(&mut self, sources: &[StackSource], locations: &mut [Vec<Location>]) {
        let mut wanted: FxHashMap<FileKey, (u32, Vec<u64>)> = FxHashMap::default();
        for (source, locs) in sources.iter().zip(locations.iter_mut()) {
            for loc in locs.iter_mut() {
                let Location::File { file, offset } = *loc else {
                    continue;
                };
                if self.frames.unchecked(file) {
                    let version = match self.procs.locator(file) {
                        Some(at) => self.elf.version(file, at),
                        None => None,
                    };
                    self.frames.check(file, version);
                }
                match self.frames.get(file, offset) {
                    Some(frame) => *loc = Location::Named(frame),
                    None => {
                        let (_, offsets) = wanted.entry(file).or_insert((source.pid, Vec::new()));
                        offsets.push(offset);
                    }
                }
            }
        }
        if wanted.is_empty() {
            return;
        }
        // Offsets a process chose: a seeded hash (see `frame_cache`).
        let mut named: hashbrown::HashMap<(FileKey, u64), Frame> = hashbrown::HashMap::default();
        for (file, (pid, mut offsets)) in wanted {
            offsets.sort_unstable();
            offsets.dedup();
            let Some(locator) = self.procs.locator(file) else {
                continue;
            };
            let version = self.elf.version(file, locator);
            let names = match version {
                Some(_) => self.elf.symbolize(file, locator, &offsets),
                None => vec![None; offsets.len()],
            };
            let module = self
                .procs
                .display_name(file)
                .unwrap_or("[unknown]")
                .to_string();
            for (offset, name) in offsets.into_iter().zip(names) {
                let text = name.unwrap_or_else(|| format!("{module}+{offset:#x}"));
                // A refusal is that process's: not kept for the others.
                let Ok(frame) = self.interner.try_get_for(pid, &text) else {
                    continue;
                };
                // A file whose version could not be read is named for
                // this batch only (it may be another file next time).
                match version {
                    Some(v) => {
                        self.frames.insert(file, v, offset, frame.clone());
                    }
                    None => self.frames.refuse(),
                }
                named.insert((file, offset), frame);
            }
        }
        for loc in locations.iter_mut().flatten() {
            if let Location::File { file, offset } = *loc {
                if let Some(frame) = named.get(&(file, offset)) {
                    *loc = Location::Named(frame.clone());
                }
            }
        }
    }

    fn resolve_kernel(&mut self, sources: &[StackSource]) {
        let mut addrs: Vec<u64> = sources
            .iter()
            .filter_map(|s| s.kernel)
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

    fn stack(
        &mut self,
        source: &StackSource,
        locations: &[Location],
        py: Option<&PyPart>,
    ) -> Stack {
        let unknown = self.intern("[unknown]");
        let vdso = self.intern("[vdso]");
        // Innermost first, as walked.
        let mut user: Vec<Frame> = Vec::with_capacity(locations.len());
        for loc in locations {
            match loc {
                Location::Named(frame) => user.push(frame.clone()),
                // Not named: its file could not be read, or the name was
                // refused for want of room.
                Location::File { .. } => user.push(unknown.clone()),
                Location::Vdso => user.push(vdso.clone()),
                Location::Jit(frame) => user.push(frame.clone()),
                Location::Java(java) => user.extend(java.iter().rev().cloned()),
                Location::Pending => user.push(self.intern(PENDING_FRAME)),
                Location::Unknown => user.push(unknown.clone()),
            }
        }
        if let Some(py) = py {
            let gil = self.intern(python::GIL_FRAME);
            user = py.interleave(user, &gil);
        }
        let mut frames: Vec<Frame> = user.into_iter().rev().collect();
        if let Some(ips) = source.kernel {
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
            let own = if source.on_cpu {
                0
            } else {
                super::kernel_frames::own_frames(&kernel)
            };
            frames.extend(kernel.into_iter().skip(own).rev());
        } else if let (Some(nr), false) = (source.syscall, source.on_cpu) {
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
