//! Java frames from the JVM's own structures ([`crate::jvm::code`]): each
//! compiled frame becomes its method and the methods inlined into it at
//! that pc, and each interpreted frame (a `Method*` the BPF walker read
//! from the frame) its method. Code that is not an nmethod (stubs, the
//! interpreter's own code) and JVMs whose structures cannot be read are
//! left to the perf map.
//!
//! Bounds: per JVM at most [`MAX_NMETHODS`] decoded nmethods and
//! [`MAX_METHODS`] method names (each set starts over when full), all
//! JVMs' nmethods together at most [`nmethod_budget_bytes`] (past it the
//! JVM being read starts over, then all). JVMs are kept per process (pid
//! and start time: a reused pid never gets the previous JVM's layout) and
//! forgotten by the process table's rule (see
//! [`crate::process::Subscription`]).
//!
//! Reading a JVM's memory is work done on its behalf, and its memory is
//! its user's to forge: each JVM may make at most [`READ_CALLS`] reads of
//! [`READ_BYTES`] in all per batch. Past that its remaining frames in the
//! batch fall back to its perf map (or `[unknown]`), the exhaustion is
//! counted, and no other process is slowed. The CPU time of those reads
//! is the JVM's user's to pay ([`crate::budget::cpu`]): past their budget
//! their compiled frames fall back to the perf map and their interpreted
//! ones are [`OVER_BUDGET`] until it refills.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::runtime::FrameNames;
use crate::{
    budget::cpu,
    jvm::{
        code::{segment_of, FrameKind, Heap, JavaCode, Nmethod},
        methods::method_name,
        vmstructs::{LayoutError, Vm},
        Jvms,
    },
    process::{
        remote::{Budget, Remote},
        ProcKey, ProcessTable,
    },
    profile::model::Frame,
    untrusted::refusals::{count_for, Reason, What},
};

/// Reads of one JVM's memory per batch at most: a JVM in its steady state
/// needs about two per distinct compiled pc, one warming up about ten per
/// new nmethod (most of them once).
pub const READ_CALLS: u64 = 4096;
/// Bytes read from one JVM's memory per batch at most (an nmethod's
/// tables are a few KiB).
pub const READ_BYTES: u64 = 4 << 20;

const MAX_NMETHODS: usize = 32_768;
/// Bytes of decoded nmethods of all JVMs together (a JVM's memory is its
/// user's to fill: sizes are only bounded per nmethod): the budget's
/// `jvm_code` part.
pub fn nmethod_budget_bytes() -> usize {
    crate::budget::bytes(crate::budget::Part::JvmCode)
}
const MAX_METHODS: usize = 65_536;
/// Batches a method's name is trusted for.
const METHOD_NAMES_FOR_BATCHES: u64 = 300;
/// An interpreted frame whose `Method*` does not read as a method.
pub const INTERPRETER: &str = "Interpreter";
/// An interpreted frame not read because the JVM's user was over their
/// CPU budget.
pub const OVER_BUDGET: &str = "[jvm over budget]";

struct JvmCode {
    vm: Result<Vm, LayoutError>,
    heaps: Vec<Heap>,
    /// Batch the heaps were read in (and nmethods last checked against).
    checked: u64,
    /// Decoded nmethods by blob address, with the batch they were last
    /// found alive in (their compile id unchanged).
    nmethods: FxHashMap<u64, (Arc<Nmethod>, u64)>,
    methods: FxHashMap<u64, Option<Arc<str>>>,
    /// Bytes its decoded nmethods hold.
    bytes: usize,
    /// Its memory, read on this batch's budget.
    mem: Remote,
    /// Whether this batch's budget ran out and was counted.
    counted: bool,
    /// The JVM's effective user, who pays for the reads.
    uid: u32,
}

/// Java frames of every JVM seen, read from their memory.
#[derive(Default)]
pub struct JavaFrames {
    jvms: FxHashMap<ProcKey, JvmCode>,
    batch: u64,
    /// This batch's answers by (pid, pc, leaf): the same return addresses
    /// come back in many stacks. Emptied each batch.
    answers: FxHashMap<(ProcKey, u64, bool), Option<Vec<Frame>>>,
    /// This batch's code blobs by (pid, segment map, segment): the pcs of
    /// one segment share a blob. Emptied each batch.
    blobs: FxHashMap<(ProcKey, u64, u64), Option<u64>>,
    /// Owners of JVMs with no state yet (refused before their first
    /// read). Emptied each batch.
    owners: FxHashMap<ProcKey, u32>,
    /// Bytes of all JVMs' decoded nmethods (the sum of their `bytes`).
    nmethod_bytes: usize,
    /// `--jvm-frames perf-map`: never read JVM memory.
    pub disabled: bool,
    /// Where a JVM's user comes from.
    table: Arc<ProcessTable>,
    /// Where the JVMs' layouts are kept.
    known: Arc<Jvms>,
}

impl JavaFrames {
    /// No JVMs yet, of the processes of `table`.
    pub fn new(table: Arc<ProcessTable>, known: Arc<Jvms>) -> Self {
        JavaFrames {
            table,
            known,
            ..JavaFrames::default()
        }
    }

    /// Bytes of the JVMs' decoded nmethods, within [`nmethod_budget_bytes`].
    pub fn bytes(&self) -> usize {
        self.nmethod_bytes
    }

    /// Drops JVM `key`'s state.
    pub fn forget(&mut self, key: ProcKey) {
        self.jvms.remove(&key);
    }

    /// Keeps the JVMs `keep` says.
    pub fn retain(&mut self, keep: &dyn Fn(ProcKey) -> bool) {
        self.jvms.retain(|k, _| keep(*k));
    }

    /// Starts a batch.
    pub fn begin_batch(&mut self) {
        self.batch += 1;
        self.answers.clear();
        self.blobs.clear();
        self.owners.clear();
        let batch = self.batch;
        self.nmethod_bytes = self.jvms.values().map(|j| j.bytes).sum();
        // A class unloaded frees its methods, and their addresses may come
        // back as other methods: names are read again now and then.
        if batch.is_multiple_of(METHOD_NAMES_FOR_BATCHES) {
            self.jvms.values_mut().for_each(|j| j.methods.clear());
        }
    }

    /// Where JVM `key`'s frames come from, for its report.
    pub fn status(&self, key: ProcKey) -> Option<String> {
        let j = self.jvms.get(&key)?;
        Some(match &j.vm {
            Ok(vm) => format!("vm_structures (HotSpot {})", vm.layout.major),
            Err(err) => format!("perf_map: {err}"),
        })
    }

    /// Whose budget JVM `key`'s reads come from (its status read when
    /// first met, and kept with its state).
    fn owner(&mut self, key: ProcKey) -> u32 {
        if let Some(j) = self.jvms.get(&key) {
            return j.uid;
        }
        *self
            .owners
            .entry(key)
            .or_insert_with(|| self.table.facts(key).map_or(cpu::UNKNOWN_USER, |f| f.euid))
    }

    fn jvm(&mut self, key: ProcKey, uid: u32) -> Option<&mut JvmCode> {
        if self.disabled {
            return None;
        }
        let batch = self.batch;
        let pid = key.pid;
        let j = self.jvms.entry(key).or_insert_with(|| JvmCode {
            vm: self
                .known
                .layouts()
                .of(pid)
                .inspect_err(|err| tracing::debug!(pid, "JVM structures: {err}")),
            heaps: Vec::new(),
            checked: 0,
            nmethods: FxHashMap::default(),
            methods: FxHashMap::default(),
            bytes: 0,
            mem: Remote::new(pid),
            counted: false,
            uid,
        });
        if j.vm.is_err() {
            // Read again when the layout cache says it is time (a JVM seen
            // as it starts has not filled its tables yet).
            j.vm = self.known.layouts().of(pid);
        }
        let vm = j.vm.as_ref().ok()?;
        if j.checked != batch {
            j.checked = batch;
            j.counted = false;
            j.mem = Remote::with_budget(pid, Budget::new(READ_CALLS, READ_BYTES));
            j.heaps = JavaCode::with_mem(vm, j.mem.clone())
                .heaps()
                .unwrap_or_default();
        }
        (!j.mem.exhausted()).then_some(j)
    }

    /// Counts JVM `key`'s budget as exhausted, once a batch, if it is.
    fn settle(&mut self, key: ProcKey) {
        if let Some(j) = self.jvms.get_mut(&key) {
            if j.mem.exhausted() && !j.counted {
                j.counted = true;
                count_for(What::JvmMemory, Reason::Budget, key.pid);
            }
        }
    }

    /// The frames, outermost first, of the compiled method at `pc` in
    /// JVM `key`; `None` when `pc` is not in a live nmethod.
    pub fn compiled(
        &mut self,
        key: ProcKey,
        pc: u64,
        leaf: bool,
        interner: &mut dyn FrameNames,
    ) -> Option<Vec<Frame>> {
        if let Some(known) = self.answers.get(&(key, pc, leaf)) {
            return known.clone();
        }
        if self.disabled {
            return None;
        }
        let uid = self.owner(key);
        let unit = cpu::admit(uid, key.pid, What::JvmMemory)?;
        let mut blobs = std::mem::take(&mut self.blobs);
        let answer = self.read_compiled(key, uid, pc, leaf, &mut blobs, interner);
        drop(unit);
        self.blobs = blobs;
        self.settle(key);
        self.answers.insert((key, pc, leaf), answer.clone());
        answer
    }

    fn read_compiled(
        &mut self,
        key: ProcKey,
        uid: u32,
        pc: u64,
        leaf: bool,
        blobs: &mut FxHashMap<(ProcKey, u64, u64), Option<u64>>,
        interner: &mut dyn FrameNames,
    ) -> Option<Vec<Frame>> {
        let batch = self.batch;
        if self.nmethod_bytes > nmethod_budget_bytes() {
            self.jvms.values_mut().for_each(|j| {
                j.clear_nmethods();
            });
            self.nmethod_bytes = 0;
        }
        let total = self.nmethod_bytes;
        let j = self.jvm(key, uid)?;
        let vm = j.vm.as_ref().ok()?.clone();
        let code = JavaCode::with_mem(&vm, j.mem.clone());
        let mut new_total = total;
        let (heap, seg) = segment_of(&j.heaps, pc)?;
        let segment = (key, heap.segmap(), seg);
        let blob = match blobs.get(&segment) {
            Some(&known) => known,
            None => {
                let found = code.blob_at(&j.heaps, pc);
                if !j.mem.exhausted() {
                    blobs.insert(segment, found);
                }
                found
            }
        }?;
        let nm = match j.nmethods.get_mut(&blob) {
            Some((nm, seen)) if *seen == batch => nm.clone(),
            Some((nm, seen)) if alive(&code, blob, nm) => {
                *seen = batch;
                nm.clone()
            }
            _ => {
                let nm = Arc::new(code.nmethod(blob).ok()?);
                let mut freed = 0;
                if j.nmethods.len() >= MAX_NMETHODS || total + nm.bytes() > nmethod_budget_bytes() {
                    freed = j.clear_nmethods();
                }
                j.bytes += nm.bytes();
                if let Some((old, _)) = j.nmethods.insert(blob, (nm.clone(), batch)) {
                    j.bytes -= old.bytes();
                    freed += old.bytes();
                }
                new_total = total + nm.bytes() - freed;
                nm
            }
        };
        let chain = nm.frames_at(pc, leaf, vm.layout.unsigned5_excluded());
        // A method that does not read (unloaded since) leaves the whole
        // frame to the perf map.
        let frames = chain
            .into_iter()
            .map(|(m, kind)| frame(j, &code, m, kind, interner))
            .collect();
        self.nmethod_bytes = new_total;
        frames
    }

    /// The frame of an interpreted method, from the `Method*` the BPF
    /// walker read from its frame.
    pub fn interpreted(
        &mut self,
        key: ProcKey,
        method: u64,
        interner: &mut dyn FrameNames,
    ) -> Frame {
        if self.disabled {
            return interner.get(INTERPRETER);
        }
        let uid = self.owner(key);
        let Some(unit) = cpu::admit(uid, key.pid, What::JvmMemory) else {
            return interner.get(OVER_BUDGET);
        };
        let frame = self.read_interpreted(key, uid, method, interner);
        drop(unit);
        self.settle(key);
        frame
    }

    fn read_interpreted(
        &mut self,
        key: ProcKey,
        uid: u32,
        method: u64,
        interner: &mut dyn FrameNames,
    ) -> Frame {
        let Some(j) = self.jvm(key, uid) else {
            return interner.get(INTERPRETER);
        };
        let Ok(vm) = j.vm.clone() else {
            return interner.get(INTERPRETER);
        };
        let mem = j.mem.clone();
        frame(
            j,
            &JavaCode::with_mem(&vm, mem),
            method,
            FrameKind::Interpreted,
            interner,
        )
        .unwrap_or_else(|| interner.get(INTERPRETER))
    }
}

impl JvmCode {
    /// Forgets its nmethods; the bytes they held.
    fn clear_nmethods(&mut self) -> usize {
        self.nmethods.clear();
        std::mem::take(&mut self.bytes)
    }
}

/// Whether the nmethod decoded at `blob` is still the one there.
fn alive(code: &JavaCode, blob: u64, nm: &Nmethod) -> bool {
    code.vm
        .layout
        .nm_compile_id
        .read(&code.mem, blob)
        .is_ok_and(|id| id as u32 == nm.compile_id)
}

fn frame(
    j: &mut JvmCode,
    code: &JavaCode,
    method: u64,
    kind: FrameKind,
    interner: &mut dyn FrameNames,
) -> Option<Frame> {
    if j.methods.len() >= MAX_METHODS {
        j.methods.clear();
    }
    let name = j
        .methods
        .entry(method)
        .or_insert_with(|| method_name(code.vm, &code.mem, method).map(Arc::from))
        .clone()?;
    // Method names are the JVM's to choose: charged to it like its other
    // names.
    Some(interner.get_for(code.mem.pid(), &format!("{name}{}", kind.suffix())))
}
