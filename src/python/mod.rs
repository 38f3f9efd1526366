//! CPython interpreters read from outside, as `jvm` reads HotSpot: which
//! processes run one ([`find`]), the layout its frames and thread states
//! have (3.13+: the interpreter's own `_Py_DebugOffsets`; 3.10-3.12: a
//! table per minor version, checked against the binary), its threads'
//! `PyThreadState`s (for the BPF walk's `python_threads`), and the names
//! of its code objects and threads.
//!
//! Everything here is read from a process that may be hostile: every
//! read is bounded (sizes, string lengths, list and loop lengths) and
//! paid from the process's own [`Budget`](crate::jvm::remote::Budget), and
//! anything implausible is refused (counted), never followed.

use crate::{bpf::abi::UnwindPython, jvm::remote::Remote, process::files::ExecMapping};

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
    // The implementation adds what it needs (layout, PyCode_Type, ...).
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
pub fn find(_pid: u32, _mappings: &[ExecMapping]) -> Result<Interpreter, PyError> {
    Err(PyError::NotPython)
}

impl Interpreter {
    /// What the BPF walk needs (`struct ws_python_code`).
    pub fn walk_layout(&self) -> UnwindPython {
        UnwindPython::default()
    }

    /// The interpreter's threads (the main interpreter's), at most
    /// [`MAX_THREADS`].
    pub fn threads(&self, _mem: &Remote) -> Result<Vec<PyThread>, PyError> {
        Ok(Vec::new())
    }

    /// The name of the code object at `code`.
    pub fn code_name(&self, _mem: &Remote, _code: u64) -> Result<CodeName, PyError> {
        Err(PyError::NotPython)
    }

    /// Python's names of its threads (`threading.Thread.name`), by
    /// `thread_id` (the thread's `ident`).
    pub fn thread_names(&self, _mem: &Remote) -> Result<Vec<(u64, String)>, PyError> {
        Ok(Vec::new())
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
    pub fn stack(&self, _mem: &Remote, _tstate: u64) -> Result<Vec<PyEntry>, PyError> {
        Ok(Vec::new())
    }
}

/// Python frames a stack holds at most (`WS_PY_MAX_FRAMES`).
pub const MAX_FRAMES: usize = crate::bpf::abi::PY_MAX_FRAMES;

/// Threads read per interpreter at most.
pub const MAX_THREADS: usize = 4096;
