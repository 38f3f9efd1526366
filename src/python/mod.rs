//! CPython interpreters read from outside, as `jvm` reads HotSpot: which
//! processes run one ([`find`]), the layout its frames and thread states
//! have (3.13+: the interpreter's own `_Py_DebugOffsets`; 3.10-3.12: a
//! table per minor version, checked against the binary), its threads'
//! `PyThreadState`s (for the BPF walk's `python_threads`), and the names
//! of its code objects and threads.
//!
//! Everything here is read from a process that may be hostile: every
//! read is bounded (sizes, string lengths, list and loop lengths) and
//! paid from the process's own [`Budget`](crate::process::remote::Budget), and
//! anything implausible is refused (counted), never followed.

mod find;
pub(crate) mod frames;
mod layout;
mod names;
mod objects;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};

pub mod registry;
pub mod runtime;
pub mod shares;

use crate::{bpf::abi::UnwindPython, process::files::ExecMapping, process::remote::Remote};
use layout::{Entry, Layout};
use objects::{add, pointer, read, read_u64, u64_in, Objects, Types};
pub use objects::{sanitize, MAX_DICT_ENTRIES, MAX_STR_BYTES, MAX_STR_LEN};

/// Why a process's interpreter is not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PyError {
    /// No libpython3.X / python3.X exporting `_PyRuntime` is mapped.
    #[error("no CPython interpreter mapped")]
    NotPython,
    /// A CPython this reader has no layout for (3.minor).
    #[error("CPython 3.{0} is not supported (3.10 to 3.13 are)")]
    Unsupported(u8),
    /// Its file could not be opened or parsed.
    #[error("{0}")]
    File(String),
    /// Its memory could not be read (gone, or the budget is spent).
    #[error("reading its memory: {0}")]
    Read(String),
    /// What it holds contradicts the layout (a fake or corrupt interpreter,
    /// or one not yet initialised).
    #[error("implausible interpreter state: {0}")]
    Implausible(String),
}

/// One CPython interpreter in a process: what the walk and the namers need.
#[derive(Debug, Clone)]
pub struct Interpreter {
    pub pid: u32,
    /// 3.minor.
    pub minor: u8,
    /// Where `_PyRuntime` is in the process.
    pub runtime: u64,
    /// Where the main interpreter's `PyInterpreterState` is.
    pub interp: u64,
    /// `PY_VERSION_HEX` (`Py_Version`; 3.10: 0x030a0000).
    pub version: u32,
    /// [start, end) of the GIL's `struct _gil_runtime_state`.
    gil: (u64, u64),
    layout: Layout,
    types: Types,
    /// `threading._active` once found (checked to be a dict at each use).
    active: Arc<Mutex<Option<u64>>>,
}

/// One Python thread: its `PyThreadState` and the thread it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyThread {
    /// `PyThreadState.thread_id`: `pthread_self()`, the thread's TLS base.
    pub thread_id: u64,
    /// Where its `PyThreadState` is.
    pub tstate: u64,
    /// `PyThreadState.native_thread_id` (3.11+): its kernel tid.
    pub native_tid: Option<u32>,
}

/// What names a Python frame: its code object's qualified name (3.10:
/// `co_name`), file and first line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeName {
    pub qualname: String,
    pub file: String,
    pub first_line: u32,
}

/// The CPython interpreter `pid` runs, if `mappings` (its file mappings)
/// include one whose layout this reader knows and whose state checks out.
/// Its reads are paid from a small budget of its own.
pub fn find(pid: u32, mappings: &[ExecMapping]) -> Result<Interpreter, PyError> {
    find::find(pid, mappings)
}

impl Interpreter {
    /// What the BPF walk needs (`struct ws_python_code`).
    pub fn walk_layout(&self) -> UnwindPython {
        UnwindPython {
            gil_start: self.gil.0,
            gil_end: self.gil.1,
            ..self.layout.walk()
        }
    }

    /// The interpreter's threads (the main interpreter's), at most
    /// [`MAX_THREADS`]. A list that loops, or holds a thread state of
    /// another interpreter, is refused.
    pub fn threads(&self, mem: &Remote) -> Result<Vec<PyThread>, PyError> {
        let l = &self.layout;
        let mut at = read_u64(mem, self.interp + l.interp_threads)?;
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        while at != 0 && out.len() < MAX_THREADS {
            let tstate = pointer(at, "thread state")?;
            if !seen.insert(tstate) {
                return Err(PyError::Implausible("the thread list loops".into()));
            }
            let buf = read(mem, tstate, l.ts_span())?;
            if u64_in(&buf, l.ts_interp) != self.interp {
                return Err(PyError::Implausible(format!(
                    "thread state {tstate:#x} of another interpreter"
                )));
            }
            out.push(PyThread {
                thread_id: u64_in(&buf, l.ts_thread_id),
                tstate,
                native_tid: l
                    .ts_native_tid
                    .and_then(|off| u32::try_from(u64_in(&buf, off)).ok()),
            });
            at = u64_in(&buf, l.ts_next);
        }
        Ok(out)
    }

    /// The name of the code object at `code`.
    pub fn code_name(&self, mem: &Remote, code: u64) -> Result<CodeName, PyError> {
        let l = &self.layout;
        pointer(code, "code object")?;
        let buf = read(mem, code, l.code_span())?;
        if u64_in(&buf, 8) != self.types.code {
            return Err(PyError::Implausible(format!(
                "{code:#x} is not a code object"
            )));
        }
        let objects = self.objects(mem);
        Ok(CodeName {
            qualname: objects.string(u64_in(&buf, l.co_name))?,
            file: objects.string(u64_in(&buf, l.co_filename))?,
            first_line: crate::process::remote::uint_at(&buf, l.co_firstlineno as usize, 4) as u32,
        })
    }

    /// Python's names of its threads (`threading.Thread.name`), by
    /// `thread_id` (the thread's `ident`). Found through `sys.modules['threading']._active` (empty when
    /// `threading` is not imported), at most [`MAX_THREADS`]; names are
    /// cut and sanitized as [`CodeName`]s are.
    pub fn thread_names(&self, mem: &Remote) -> Result<Vec<(u64, String)>, PyError> {
        names::thread_names(self, mem)
    }

    fn objects<'a>(&'a self, mem: &'a Remote) -> Objects<'a> {
        Objects {
            mem,
            layout: &self.layout,
            types: &self.types,
        }
    }
}

/// One entry of a thread's Python stack as the BPF walk records it
/// (`bpf/python.bpf.h`), innermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PyEntry {
    /// A frame running the code object at this address.
    Code(u64),
    /// The frames of one eval-loop call (one native
    /// `_PyEval_EvalFrameDefault` frame) end here.
    EvalEnd,
}

impl Interpreter {
    /// The Python stack of the thread whose `PyThreadState` is at
    /// `tstate`, read as the BPF walk reads it (the same fields, the same
    /// bound [`MAX_FRAMES`]): for tests of the walk and of the layout.
    ///
    /// Innermost first: each frame's [`PyEntry::Code`], and
    /// [`PyEntry::EvalEnd`] after every frame (3.10), after each frame
    /// whose `is_entry` is set (3.11), or in place of each shim frame
    /// (3.12+). A chain that loops is refused.
    pub fn stack(&self, mem: &Remote, tstate: u64) -> Result<Vec<PyEntry>, PyError> {
        let l = &self.layout;
        let mut frame = read_u64(mem, add(tstate, l.ts_frame)?)?;
        if let Some((current, _)) = l.cframe {
            if frame == 0 {
                return Ok(Vec::new());
            }
            frame = read_u64(mem, add(frame, current)?)?;
        }
        let mut seen = Vec::new();
        let mut out = Vec::new();
        while frame != 0 && out.len() < MAX_FRAMES {
            if seen.contains(&frame) {
                return Err(PyError::Implausible("the frame chain loops".into()));
            }
            seen.push(frame);
            let buf = read(mem, frame, crate::bpf::abi::PY_FRAME_READ as usize)?;
            let code = u64_in(&buf, l.frame_code);
            match l.entry {
                Entry::Every => out.extend([PyEntry::Code(code), PyEntry::EvalEnd]),
                Entry::Flag(off) => {
                    out.push(PyEntry::Code(code));
                    if buf[off as usize] != 0 {
                        out.push(PyEntry::EvalEnd);
                    }
                }
                Entry::Shim(off, owner) if buf[off as usize] == owner => out.push(PyEntry::EvalEnd),
                Entry::Shim(..) => out.push(PyEntry::Code(code)),
            }
            frame = u64_in(&buf, l.frame_back);
        }
        out.truncate(MAX_FRAMES);
        Ok(out)
    }
}

/// Python frames a stack holds at most (`WS_PY_MAX_FRAMES`).
pub const MAX_FRAMES: usize = crate::bpf::abi::PY_MAX_FRAMES;

/// Threads read per interpreter at most.
pub const MAX_THREADS: usize = 4096;
