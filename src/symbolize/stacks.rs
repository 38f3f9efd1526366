//! Naming stacks. Rows of many threads share their stacks (a pool's
//! workers waiting in the same place), and so do the live view's blocked
//! threads: each distinct stack of a process is located and named once per
//! batch, whether a record or a live thread brought it.

use blazesym::symbolize::{
    source::{Kernel, Source},
    Input, Symbolized,
};
use rustc_hash::FxHashMap;

use super::{procs::Found, syscalls, Symbolizer};
use crate::process::files::FileKey;
use crate::{
    bpf::abi::UNWIND_PENDING_FRAME,
    collect::{RawLive, RawRecord, RawStack, RecordKind},
    profile::model::state::State,
    profile::model::{Frame, Stack},
    runtime::{AnonCode, Appended, Frames},
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
    /// Frames a language runtime named (JIT code, a compiled method and
    /// the methods inlined into it, an interpreted method).
    Runtime(Frames),
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
        let mut locations = Vec::with_capacity(firsts.len());
        let mut appended = Vec::with_capacity(firsts.len());
        for s in &firsts {
            let (native, part) = self.appended_part(s);
            locations.push(self.locate_user(s, native));
            appended.push(part);
        }
        self.resolve_user(&firsts, &mut locations);
        self.resolve_kernel(&firsts);
        let stacks: Vec<Stack> = firsts
            .iter()
            .zip(&locations)
            .zip(&appended)
            .map(|((s, locs), app)| self.stack(s, locs, app.as_ref()))
            .collect();
        which.into_iter().map(|k| stacks[k].clone()).collect()
    }

    /// The frames a runtime's walk appended to a stack's native ones.
    /// How many of a stack's user entries are native frames, and, named,
    /// the frames a runtime's walk appended after them.
    fn appended_part(&mut self, source: &StackSource) -> (usize, Option<Appended>) {
        let Some(ips) = source.user else {
            return (0, None);
        };
        match self.runtimes.appended_from(ips) {
            Some((first, runtime)) => {
                let part = runtime.appended(source.pid, &ips[first..], &mut self.interner);
                (first, Some(part))
            }
            None => (ips.len(), None),
        }
    }

    /// Where each of the first `native` user entries of `source` points.
    fn locate_user(&mut self, source: &StackSource, native: usize) -> Vec<Location> {
        let Some(ips) = source.user else {
            return Vec::new();
        };
        let ips = &ips[..native.min(ips.len())];
        let (pid, comm) = (source.pid, source.comm);
        let found: Vec<(u64, Option<Found>)> = ips
            .iter()
            .enumerate()
            .map(|(i, &ip)| {
                if self.runtimes.owns_entry(ip) || ip == UNWIND_PENDING_FRAME {
                    return (ip, None);
                }
                // Callers' frames hold return addresses, which may already
                // belong to the next line or function: look up the call.
                let addr = if i == 0 { ip } else { ip.saturating_sub(1) };
                (addr, self.procs.find(pid, comm, addr))
            })
            .collect();
        let proc = self.named_proc(pid, comm);
        self.runtimes.each(|r| r.saw(&proc));
        let (runtimes, names) = (&self.runtimes, &mut self.interner);
        // Code in anonymous executable memory, named by the runtimes in
        // order, each once for the whole stack.
        let anon: Vec<AnonCode> = (found.iter().enumerate())
            .filter(|(_, (_, f))| matches!(f, Some(Found::Anon)))
            .map(|(i, (addr, _))| AnonCode {
                addr: *addr,
                leaf: i == 0,
            })
            .collect();
        let mut anon_named: Vec<Option<Frames>> = vec![None; anon.len()];
        if !anon.is_empty() {
            runtimes.each(|r| r.anonymous(&proc, &anon, &mut anon_named, names));
        }
        let mut anon_named = anon_named.into_iter();
        found
            .into_iter()
            .map(|(addr, found)| {
                let named = match found {
                    Some(Found::File { file, offset }) => return Location::File { file, offset },
                    Some(Found::Vdso) => return Location::Vdso,
                    None if addr == UNWIND_PENDING_FRAME => return Location::Pending,
                    Some(Found::Anon) => anon_named.next().flatten(),
                    None => runtimes.first(|r| r.tagged(&proc, addr, names)),
                };
                named.map_or(Location::Unknown, Location::Runtime)
            })
            .collect()
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
        appended: Option<&Appended>,
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
                Location::Runtime(frames) => user.extend(frames.innermost_first().cloned()),
                Location::Pending => user.push(self.intern(PENDING_FRAME)),
                Location::Unknown => user.push(unknown.clone()),
            }
        }
        if let Some(appended) = appended {
            user = appended.interleave(user);
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
