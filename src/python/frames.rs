//! Python frames: naming the code objects the BPF walk recorded after a
//! stack's native frames (`bpf/python.bpf.h`), and putting each eval-loop
//! call's frames where its native `_PyEval_EvalFrameDefault` frame was, so
//! that a stack reads `Thread.run;handler;sock.recv_into;recv` rather
//! than the interpreter's own functions.
//!
//! A code object is named `qualname (file:first line)_[py]` from its own
//! fields, read from the process through the interpreter the unwind
//! registry found ([`Pythons`]), each process paying from its own budget.
//! Names are kept per process and code object, and read again after
//! [`NAME_TTL`]: a freed code object's address may come to hold another.
//! The CPU time of reading a new name is its user's to pay
//! ([`crate::budget::cpu`]): past their budget, [`OVER_BUDGET`].

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use rustc_hash::FxHashMap;

use crate::{
    bpf::abi::{JAVA_METHOD_TAG, PY_CUT, PY_EVAL_END, PY_FRAME_TAG, PY_GIL},
    budget::cpu,
    process::remote::{Budget, Remote},
    process::ProcKey,
    profile::model::Frame,
    python::registry::{PyProc, Pythons},
    runtime::{Appended, FrameNames},
    untrusted::refusals::What,
};

/// The native frame each eval-loop call runs in.
pub const EVAL_FRAME: &str = "_PyEval_EvalFrameDefault";
/// The frame of a thread waiting for the GIL.
pub const GIL_FRAME: &str = crate::profile::model::GIL_FRAME;
/// A code object that could not be read (or of a process whose
/// interpreter is not registered).
const UNKNOWN: &str = "[unknown]_[py]";
/// A code object not read because its process's user was over their CPU
/// budget.
pub const OVER_BUDGET: &str = "[python over budget]_[py]";
/// A name is read again after this long.
const NAME_TTL: Duration = Duration::from_secs(120);
/// Names kept in all; past it they start over.
const MAX_NAMES: usize = 1 << 18;
/// Reads one process may make per batch to name new code objects (about
/// three per code object: the object, its name, its file).
const BATCH_CALLS: u64 = 3 * 1024;
const BATCH_BYTES: u64 = 1 << 20;

/// Whether a user stack entry is a Python one (a code object or marker).
pub fn is_python(ip: u64) -> bool {
    ip & (PY_FRAME_TAG | JAVA_METHOD_TAG) == PY_FRAME_TAG
}

/// Names Python frames for the symbolizer.
#[derive(Default)]
pub(super) struct PythonFrames {
    pythons: Option<Pythons>,
    names: FxHashMap<(ProcKey, u64), (Frame, Instant)>,
    /// This batch's budget of each process.
    budgets: FxHashMap<u32, Arc<Budget>>,
}

impl PythonFrames {
    pub(super) fn new(pythons: Pythons) -> PythonFrames {
        PythonFrames {
            pythons: Some(pythons),
            ..PythonFrames::default()
        }
    }

    /// A new batch: new budgets.
    pub(super) fn start_batch(&mut self) {
        self.budgets.clear();
        if self.names.len() > MAX_NAMES {
            self.names.clear();
        }
    }

    /// Process `pid`'s interpreter, if registered.
    pub(super) fn process(&self, pid: u32) -> Option<Arc<PyProc>> {
        self.pythons.as_ref()?.get(pid)
    }

    /// Lets go of every name (the interner is near its bound).
    pub(super) fn clear_names(&mut self) {
        self.names = FxHashMap::default();
    }

    /// Bytes its name cache holds (by capacity; the names are the
    /// interner's), at most [`MAX_NAMES`] entries.
    pub(super) fn held_bytes(&self) -> usize {
        let entry = std::mem::size_of::<((ProcKey, u64), (Frame, Instant))>() + 1;
        self.names.capacity() * entry
    }

    /// Forgets what was read of a process whose program ended.
    pub(super) fn forget(&mut self, key: ProcKey) {
        self.names.retain(|(k, _), _| *k != key);
    }

    /// Names the Python entries `entries` (what follows a stack's native
    /// frames) of process `pid`.
    pub(super) fn part(
        &mut self,
        pid: u32,
        entries: &[u64],
        interner: &mut dyn FrameNames,
    ) -> Appended {
        let proc = self.process(pid);
        let mut part = Appended {
            anchor: EVAL_FRAME,
            ..Appended::default()
        };
        let mut call: Vec<Frame> = Vec::new();
        for &e in entries {
            match e {
                PY_GIL => part.lead = Some(interner.get(GIL_FRAME)),
                PY_EVAL_END => {
                    if !call.is_empty() {
                        part.calls.push(std::mem::take(&mut call));
                    }
                }
                PY_CUT => call.push(interner.get("[more Python frames]_[py]")),
                _ => call.push(self.code_frame(proc.as_deref(), pid, e & !PY_FRAME_TAG, interner)),
            }
        }
        if !call.is_empty() {
            part.calls.push(call);
        }
        part
    }

    fn code_frame(
        &mut self,
        proc: Option<&PyProc>,
        pid: u32,
        code: u64,
        interner: &mut dyn FrameNames,
    ) -> Frame {
        let Some(proc) = proc else {
            return interner.get(UNKNOWN);
        };
        let now = Instant::now();
        if let Some((frame, at)) = self.names.get(&(proc.key, code)) {
            if now.duration_since(*at) < NAME_TTL {
                return frame.clone();
            }
        }
        let budget = self
            .budgets
            .entry(pid)
            .or_insert_with(|| Budget::new(BATCH_CALLS, BATCH_BYTES))
            .clone();
        let Some(unit) = cpu::admit(proc.uid, pid, What::Python) else {
            return interner.get(OVER_BUDGET);
        };
        let mem = Remote::with_budget(pid, budget);
        let read = proc.interp.code_name(&mem, code);
        drop(unit);
        let text = match read {
            Ok(n) => format!(
                "{} ({}:{})_[py]",
                n.qualname,
                short_file(&n.file),
                n.first_line
            ),
            Err(_) => return interner.get(UNKNOWN),
        };
        match interner.try_get_for(pid, &text) {
            Ok(frame) => {
                self.names.insert((proc.key, code), (frame.clone(), now));
                frame
            }
            Err(frame) => frame,
        }
    }
}

/// A file's last path component: stacks stay short, and the standard
/// library's files are known by name.
fn short_file(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_entries_are_told_from_pcs_and_java_methods() {
        assert!(is_python(PY_FRAME_TAG | 0x7f00_0000_1000));
        assert!(is_python(PY_EVAL_END));
        assert!(!is_python(0x7f00_0000_1000));
        assert!(!is_python(JAVA_METHOD_TAG | 0x7f00_0000_1000));
    }
}
