//! The language runtimes whose frames and threads wallscope reads from the
//! processes themselves, without an agent: one interface, [`Runtime`],
//! that the unwind registry and the symbolizer call, in the spirit of the
//! OpenTelemetry eBPF profiler's interpreter instances (attach, keep the
//! walk's entries in step, name frames and threads, report, detach).
//!
//! Each runtime is one module implementing the trait (`crate::jvm::runtime`,
//! `crate::python::runtime`, `crate::perfmap`); [`Runtimes`] holds them in
//! the order they are asked. Adding a runtime is adding a module and a
//! line in `crate::runtimes`, which builds the set. The trait lives below
//! the layers that call it (the unwind registry, the symbolizer) and
//! below its implementations, so neither caller names a runtime
//! (`tests/e2e/architecture.rs` checks it).
//!
//! Two threads call a runtime: the unwind registry's (the walk half:
//! [`Runtime::walk_entry`] to [`Runtime::walk_stats`]) and the
//! symbolizer's (the naming half: [`Runtime::begin_batch`] onwards). Each
//! implementation keeps each half's state behind its own lock, taken only
//! by that half's thread: uncontended, so a long walk-side scan never holds
//! up naming.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Instant,
};

use crate::{
    bpf::abi::{UnwindJava, UnwindProc, UnwindPython, JAVA_METHOD_TAG, PY_FRAME_TAG},
    process::{files::ExecMapping, Image, ProcKey},
    profile::model::{Frame, ThreadInfo},
};

pub mod stats;
pub use stats::RuntimeStats;

/// Where the frames a runtime names get their shared, bounded names: the
/// symbolizer's interner, whose budget is per process.
pub trait FrameNames {
    /// A name of no process in particular (a marker such as `[unknown]`).
    fn get(&mut self, name: &str) -> Frame;
    /// A name process `pid` made: charged to its share (past it, a shared
    /// marker).
    fn get_for(&mut self, pid: u32, name: &str) -> Frame;
    /// As [`FrameNames::get_for`], telling a refusal (`Err`: the marker,
    /// not to be cached) from a name.
    fn try_get_for(&mut self, pid: u32, name: &str) -> Result<Frame, Frame>;
}

/// A process being registered for the walk: what the table knows of it.
pub struct Attach<'a> {
    pub pid: u32,
    pub key: ProcKey,
    /// Its effective user, who pays for the reads.
    pub uid: u32,
    pub image: &'a Image,
    /// Its executable file mappings.
    pub mappings: &'a [ExecMapping],
    pub now: Instant,
}

/// The runtimes' part of a process's `unwind_procs` entry
/// (`bpf/wallscope.h`): what each runtime's BPF walker reads of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalkEntry {
    pub java: UnwindJava,
    pub python: UnwindPython,
}

impl WalkEntry {
    /// Writes this part into the process's entry.
    pub fn write_into(&self, entry: &mut UnwindProc) {
        entry.java = self.java;
        entry.python = self.python;
    }
}

/// A process as its stacks are named: its key, and the table's image of
/// it (whose maps say which runtime it runs, see [`Runtime::runs_in`]).
#[derive(Clone)]
pub struct Named {
    pub key: ProcKey,
    pub image: Option<Arc<Image>>,
}

impl Named {
    /// Whether `runtime` runs in this process.
    pub fn runs(&self, runtime: &dyn Runtime) -> bool {
        self.image.as_deref().is_some_and(|i| runtime.runs_in(i))
    }
}

/// Frames a runtime named from the entries its walk appended after a
/// stack's native frames: each call's frames take the place of the
/// native frame named `anchor` they ran in (innermost call first), and
/// `lead` goes innermost (a thread waiting to run the runtime's code).
#[derive(Debug, Default)]
pub struct Appended {
    pub lead: Option<Frame>,
    pub anchor: &'static str,
    /// Each call's frames innermost first, innermost call first.
    pub calls: Vec<Vec<Frame>>,
}

impl Appended {
    /// `native` (innermost first) with each `anchor` frame replaced by its
    /// call's frames; calls left over are outer than every native frame
    /// the walk reached, so they go last.
    pub fn interleave(&self, native: Vec<Frame>) -> Vec<Frame> {
        let mut calls = self.calls.iter();
        let mut out =
            Vec::with_capacity(native.len() + self.calls.iter().map(Vec::len).sum::<usize>() + 1);
        out.extend(self.lead.iter().cloned());
        for f in native {
            if &*f == self.anchor {
                if let Some(call) = calls.next() {
                    out.extend(call.iter().cloned());
                    continue;
                }
            }
            out.push(f);
        }
        for call in calls {
            out.extend(call.iter().cloned());
        }
        out
    }
}

/// The frames a runtime named for one stack entry, outermost first: most
/// often one (JIT code), several for a compiled method and the methods
/// inlined into it. One frame needs no allocation: a batch names hundreds
/// of thousands.
#[derive(Debug, Clone)]
pub enum Frames {
    One(Frame),
    Inlined(Vec<Frame>),
}

impl Frames {
    /// The frames innermost first, as a stack's user part is built.
    pub fn innermost_first(&self) -> impl Iterator<Item = &Frame> {
        let (one, many) = match self {
            Frames::One(f) => (Some(f), &[][..]),
            Frames::Inlined(v) => (None, &v[..]),
        };
        one.into_iter().chain(many.iter().rev())
    }
}

/// A frame in anonymous executable memory: `addr` is its pc if `leaf`
/// (the innermost frame), else its return address less one.
#[derive(Debug, Clone, Copy)]
pub struct AnonCode {
    pub addr: u64,
    pub leaf: bool,
}

/// Above every user-space address (57-bit with 5-level paging): the
/// entries a runtime's walk records in place of a pc carry a tag bit
/// above it (`WS_*_TAG` in `bpf/wallscope.h`), so a pc needs no runtime
/// asked.
const USER_ADDRESS_END: u64 = 1 << 57;
const _: () = assert!(JAVA_METHOD_TAG >= USER_ADDRESS_END && PY_FRAME_TAG >= USER_ADDRESS_END);

/// Whether a user stack entry may be a runtime's rather than a pc.
fn may_be_tagged(entry: u64) -> bool {
    entry >= USER_ADDRESS_END
}

/// One language runtime. Every method has a default that does nothing, so
/// a runtime implements the phases it has.
pub trait Runtime: Send + Sync {
    /// Its name, in logs.
    fn name(&self) -> &'static str;

    /// Whether the process of `image` runs this runtime (from its maps).
    fn runs_in(&self, _image: &Image) -> bool {
        false
    }

    // The walk, on the unwind registry's thread.

    /// Reads what BPF's walk needs of `proc` if it runs this runtime and
    /// writes it into its part of `entry`; leaves `entry` as is otherwise.
    fn walk_entry(&self, _proc: &Attach<'_>, _entry: &mut WalkEntry) {}

    /// Whether `pid` should be registered again now: its runtime could not
    /// be read yet.
    fn retry_due(&self, _pid: u32, _now: Instant) -> bool {
        false
    }

    /// Keeps per-thread state of the processes among `pids` in step until
    /// `deadline`; returns the processes whose entry must be written again
    /// (walks made before lack their frames).
    fn synchronize(&self, _pids: &HashSet<u32>, _now: Instant, _deadline: Instant) -> Vec<u32> {
        Vec::new()
    }

    /// Process `pid` is no longer registered (it ended, or exec'd).
    fn detach(&self, _pid: u32) {}

    /// Adds what its walk half did to `stats`.
    fn walk_stats(&self, _stats: &mut RuntimeStats) {}

    // Naming, on the symbolizer's thread.

    /// A batch starts: per-batch budgets start over.
    fn begin_batch(&self) {}

    /// Forgets process `key`: its program ended.
    fn forget(&self, _key: ProcKey) {}

    /// Keeps only the processes `keep` says (the table lost track of
    /// some).
    fn retain(&self, _keep: &dyn Fn(ProcKey) -> bool) {}

    /// Whether `entry`, from a user stack, was put there by this runtime's
    /// walk rather than being a pc: tagged entries among the native frames
    /// ([`Runtime::tagged`]) or appended after them ([`Runtime::appended`]).
    fn owns_entry(&self, _entry: u64) -> bool {
        false
    }

    /// Whether this runtime's walk appends its entries after the native
    /// frames, `entry` being the first of them.
    fn appends(&self, _entry: u64) -> bool {
        false
    }

    /// Names the entries the walk appended (`entries`, from the first one
    /// [`Runtime::appends`] claims to the end).
    fn appended(&self, _pid: u32, _entries: &[u64], _names: &mut dyn FrameNames) -> Appended {
        Appended::default()
    }

    /// The frames of a tagged entry among the native ones, outermost
    /// first; `None` if not this runtime's.
    fn tagged(&self, _proc: &Named, _entry: u64, _names: &mut dyn FrameNames) -> Option<Frames> {
        None
    }

    /// Names the code in anonymous executable memory of one stack: each
    /// entry of `code` whose slot in `named` is still `None` (a runtime
    /// asked before left it), leaving `None` for the next runtime. One call
    /// per stack: a runtime takes its lock once for all its frames.
    fn anonymous(
        &self,
        _proc: &Named,
        _code: &[AnonCode],
        _named: &mut [Option<Frames>],
        _names: &mut dyn FrameNames,
    ) {
    }

    /// A stack of process `proc` was named in this batch.
    fn saw(&self, _proc: &Named) {}

    /// The runtime's own name of thread `tid` of `proc`, if it gave one.
    fn thread_name(&self, _proc: &Named, _tid: u32, _names: &mut dyn FrameNames) -> Option<Frame> {
        None
    }

    /// The batch is named, with these threads: report what it needs to.
    fn end_batch(&self, _threads: &HashMap<u32, ThreadInfo>) {}

    /// Lets go of cached names (the interner is near its bound).
    fn clear_names(&self) {}

    /// Bytes its caches of names hold (counted with the symbolizer's), and
    /// publishes what else it holds to [`crate::held`].
    fn held(&self) -> usize {
        0
    }
}

/// The runtimes, in the order they are asked: the first whose answer is
/// not `None` names a frame.
#[derive(Clone, Default)]
pub struct Runtimes(Vec<Arc<dyn Runtime>>);

impl Runtimes {
    /// These runtimes, asked in this order.
    pub fn new(runtimes: Vec<Arc<dyn Runtime>>) -> Runtimes {
        Runtimes(runtimes)
    }

    /// Each runtime, in order.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Runtime> {
        self.0.iter().map(|r| &**r)
    }

    /// Whether a user stack entry is a runtime's rather than a pc.
    pub fn owns_entry(&self, entry: u64) -> bool {
        may_be_tagged(entry) && self.iter().any(|r| r.owns_entry(entry))
    }

    /// Where the entries a runtime appended after the native frames begin
    /// in `entries`, and that runtime.
    pub fn appended_from(&self, entries: &[u64]) -> Option<(usize, &dyn Runtime)> {
        entries
            .iter()
            .enumerate()
            .filter(|(_, &e)| may_be_tagged(e))
            .find_map(|(i, &e)| Some((i, self.iter().find(|r| r.appends(e))?)))
    }

    /// The first answer of the runtimes to `ask`.
    pub fn first<T>(&self, ask: impl FnMut(&dyn Runtime) -> Option<T>) -> Option<T> {
        self.iter().find_map(ask)
    }

    /// Calls `each` on every runtime.
    pub fn each(&self, each: impl FnMut(&dyn Runtime)) {
        self.iter().for_each(each);
    }

    /// What every runtime's walk half did.
    pub fn walk_stats(&self) -> RuntimeStats {
        let mut stats = RuntimeStats::default();
        self.each(|r| r.walk_stats(&mut stats));
        stats
    }

    /// Whether any runtime wants `pid` registered again now.
    pub fn retry_due(&self, pid: u32, now: Instant) -> bool {
        self.iter().any(|r| r.retry_due(pid, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> Frame {
        Arc::from(s)
    }

    #[test]
    fn calls_take_the_place_of_their_anchor_frames_and_the_rest_go_outermost() {
        let part = Appended {
            lead: Some(f("[gil]")),
            anchor: "eval",
            calls: vec![
                vec![f("inner"), f("outer")],
                vec![f("run")],
                vec![f("<module>")],
            ],
        };
        let native = vec![
            f("futex"),
            f("take_gil"),
            f("eval"),
            f("call"),
            f("eval"),
            f("start_thread"),
        ];
        let out = part.interleave(native);
        let names: Vec<&str> = out.iter().map(|f| &**f).collect();
        assert_eq!(
            names,
            [
                "[gil]",
                "futex",
                "take_gil",
                "inner",
                "outer",
                "call",
                "run",
                "start_thread",
                "<module>"
            ]
        );
    }

    struct Never;
    impl Runtime for Never {
        fn name(&self) -> &'static str {
            "never"
        }
    }
    /// Appends entries tagged with bit 60 (a made-up tag).
    struct Tagged;
    const TAG: u64 = 1 << 60;
    impl Runtime for Tagged {
        fn name(&self) -> &'static str {
            "tagged"
        }
        fn appends(&self, entry: u64) -> bool {
            entry & TAG != 0
        }
    }

    #[test]
    fn the_first_runtime_that_answers_names() {
        let set = Runtimes::new(vec![Arc::new(Never), Arc::new(Tagged)]);
        let (at, by) = set.appended_from(&[1, 2, TAG | 10, TAG]).unwrap();
        assert_eq!((at, by.name()), (2, "tagged"));
        assert!(set.appended_from(&[1, 2, 0x7fff_ffff_f000]).is_none());
        assert_eq!(set.first(|r| (r.name() == "tagged").then_some(7)), Some(7));
        assert!(!set.retry_due(1, Instant::now()));
    }
}
