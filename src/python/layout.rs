//! Where CPython keeps what this reader reads, per minor version: a table
//! for 3.10 to 3.12 (offsets from each version's headers, checked against
//! the process by [`super::find`]), and for 3.13 the interpreter's own
//! `_Py_DebugOffsets` at the start of `_PyRuntime`, completed by the few
//! offsets it does not carry (dict internals, heap types), which 3.13's
//! headers fix.

use super::PyError;
use crate::bpf::abi::{self, PyEntry as WalkEntry, UnwindPython, PY_FRAME_READ, PY_NO_FIELD};

/// How the main interpreter is found from `_PyRuntime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Main {
    /// `interpreters.main` at this offset.
    Field(u64),
    /// `interpreters.head` at this offset: the list, the main one has id 0.
    Head(u64),
}

/// Where the GIL (`struct _gil_runtime_state`) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gil {
    /// In `_PyRuntime`, at this offset (`ceval.gil`, 3.10 and 3.11).
    Runtime(u64),
    /// Pointed to by the interpreter's `ceval.gil` (at `ptr`), which for
    /// the main interpreter is its own `_gil` (at `own`): 3.12+.
    Interp { ptr: u64, own: u64 },
}

/// How a frame marks the start of an eval-loop call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Entry {
    /// Every frame is one call (3.10).
    Every,
    /// The `is_entry` byte at this offset (3.11).
    Flag(u64),
    /// A shim frame, whose `owner` byte (at this offset) is this value,
    /// sits under each call's frames (3.12+).
    Shim(u64, u8),
}

/// How an instance keeps its attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Managed {
    /// A dict at `tp_dictoffset` (3.10).
    DictOffset,
    /// `Py_TPFLAGS_MANAGED_DICT`: values at -4 words, dict at -3 (3.11).
    Values11,
    /// Managed: values (tagged, bit 0) or dict at -3 words (3.12).
    Tagged12,
    /// Managed dict at -3 words, else `Py_TPFLAGS_INLINE_VALUES`: values
    /// right after the object (3.13).
    Inline13,
}

/// The layout of `PyDictKeysObject`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keys {
    /// `dk_size` (an ssize), entries of (hash, key, value) (3.10).
    V10,
    /// `dk_log2_size`, `dk_log2_index_bytes`, `dk_kind` bytes (3.11+).
    V11,
}

/// `Py_TPFLAGS_MANAGED_DICT` (3.11+).
pub(super) const TPFLAGS_MANAGED_DICT: u64 = 1 << 4;
/// `Py_TPFLAGS_INLINE_VALUES` (3.13+).
pub(super) const TPFLAGS_INLINE_VALUES: u64 = 1 << 2;
/// `sizeof(struct _gil_runtime_state)`, 3.10 to 3.13 alike.
pub(super) const GIL_SIZE: u64 = 208;
/// Offset of `locked` (an int) in `struct _gil_runtime_state`.
pub(super) const GIL_LOCKED: u64 = 16;
/// `FRAME_OWNED_BY_CSTACK` (3.12, 3.13).
const OWNED_BY_CSTACK: u8 = 3;

/// Everything read, by offset. All offsets are checked small (see
/// [`Layout::check`]), so reads sized by them are bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    pub minor: u8,
    pub main: Main,
    pub gil: Gil,
    // PyInterpreterState
    pub interp_next: u64,
    pub interp_id: u64,
    /// `runtime` (the back pointer to `_PyRuntime`), where checked.
    pub interp_runtime: Option<u64>,
    /// `tstate_head` (3.10), `threads.head` (3.11+).
    pub interp_threads: u64,
    /// `modules` (sys.modules), `imports.modules` (3.12+).
    pub interp_modules: u64,
    // PyThreadState
    pub ts_size: u64,
    pub ts_next: u64,
    pub ts_interp: u64,
    /// `frame` (3.10), `cframe` (3.11, 3.12), `current_frame` (3.13).
    pub ts_frame: u64,
    /// 3.11, 3.12: offset of `current_frame` in `_PyCFrame`, its size.
    pub cframe: Option<(u64, u64)>,
    pub ts_thread_id: u64,
    pub ts_native_tid: Option<u64>,
    // Frames: PyFrameObject (3.10), _PyInterpreterFrame (3.11+).
    pub frame_back: u64,
    pub frame_code: u64,
    pub entry: Entry,
    // PyCodeObject
    /// `co_qualname` (3.11+), `co_name` (3.10).
    pub co_name: u64,
    pub co_filename: u64,
    pub co_firstlineno: u64,
    // PyTypeObject, PyHeapTypeObject
    pub tp_name: u64,
    pub tp_basicsize: u64,
    pub tp_flags: u64,
    pub tp_dictoffset: u64,
    pub ht_cached_keys: u64,
    // PyUnicodeObject
    pub str_length: u64,
    pub str_state: u64,
    /// `sizeof(PyASCIIObject)`: where compact ASCII data starts.
    pub ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where other compact data starts.
    pub compact_size: u64,
    /// The state has a `ready` bit (3.10, 3.11).
    pub str_ready_bit: bool,
    // PyDictObject, PyDictKeysObject, PyDictValues
    pub ma_keys: u64,
    pub ma_values: u64,
    pub keys: Keys,
    /// Offset of the values array in `PyDictValues` (3.13: 8).
    pub values_at: u64,
    pub managed: Managed,
    // PyLongObject
    /// `lv_tag` (3.12+) rather than `ob_size`, at `long_size`.
    pub long_tag: bool,
    pub long_size: u64,
    pub long_digits: u64,
    // PyModuleObject
    pub md_dict: u64,
}

/// The layout of 3.`minor` for 3.10 to 3.12 (3.13: [`from_debug_offsets`]).
pub(super) fn table(minor: u8) -> Result<Layout, PyError> {
    // Shared by 3.10 to 3.13: object and type headers, strings, dicts.
    let base = Layout {
        minor,
        main: Main::Field(0),
        gil: Gil::Runtime(0),
        interp_next: 0,
        interp_id: 0,
        interp_runtime: None,
        interp_threads: 0,
        interp_modules: 0,
        ts_size: 0,
        ts_next: 8,
        ts_interp: 16,
        ts_frame: 0,
        cframe: None,
        ts_thread_id: 0,
        ts_native_tid: None,
        frame_back: 0,
        frame_code: 0,
        entry: Entry::Every,
        co_name: 0,
        co_filename: 0,
        co_firstlineno: 0,
        tp_name: 24,
        tp_basicsize: 32,
        tp_flags: 168,
        tp_dictoffset: 288,
        ht_cached_keys: 872,
        str_length: 16,
        str_state: 32,
        ascii_size: 48,
        compact_size: 72,
        str_ready_bit: true,
        ma_keys: 32,
        ma_values: 40,
        keys: Keys::V11,
        values_at: 0,
        managed: Managed::Values11,
        long_tag: false,
        long_size: 16,
        long_digits: 24,
        md_dict: 16,
    };
    let layout = match minor {
        10 => Layout {
            main: Main::Field(40),
            gil: Gil::Runtime(352),
            interp_id: 24,
            interp_runtime: Some(16),
            interp_threads: 8,
            interp_modules: 856,
            ts_size: 280,
            ts_frame: 24,
            ts_thread_id: 176,
            frame_back: 24,
            frame_code: 32,
            entry: Entry::Every,
            co_name: 112,
            co_filename: 104,
            co_firstlineno: 40,
            keys: Keys::V10,
            managed: Managed::DictOffset,
            ..base
        },
        11 => Layout {
            main: Main::Field(48),
            gil: Gil::Runtime(360),
            interp_id: 48,
            interp_runtime: Some(40),
            interp_threads: 16,
            interp_modules: 888,
            ts_size: 360,
            ts_frame: 56,
            cframe: Some((8, 24)),
            ts_thread_id: 152,
            ts_native_tid: Some(160),
            frame_back: 48,
            frame_code: 32,
            entry: Entry::Flag(68),
            co_name: 128,
            co_filename: 112,
            co_firstlineno: 72,
            ..base
        },
        12 => Layout {
            main: Main::Field(48),
            gil: Gil::Interp {
                ptr: 384,
                own: 1040,
            },
            interp_id: 8,
            interp_runtime: Some(96),
            interp_threads: 72,
            interp_modules: 944,
            ts_size: 288,
            ts_frame: 56,
            cframe: Some((0, 16)),
            ts_thread_id: 136,
            ts_native_tid: Some(144),
            frame_back: 8,
            frame_code: 0,
            entry: Entry::Shim(70, OWNED_BY_CSTACK),
            co_name: 128,
            co_filename: 112,
            co_firstlineno: 68,
            ht_cached_keys: 880,
            ascii_size: 40,
            compact_size: 56,
            str_ready_bit: false,
            managed: Managed::Tagged12,
            long_tag: true,
            ..base
        },
        _ => return Err(PyError::Unsupported(minor)),
    };
    layout.check()?;
    Ok(layout)
}

/// Bytes of `_Py_DebugOffsets` as 3.13 lays it out: the cookie, then 72
/// u64s.
pub(super) const DEBUG_OFFSETS_SIZE: usize = 8 + 8 * 72;
/// Its cookie.
const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// What `_Py_DebugOffsets` (read from the start of `_PyRuntime`) says,
/// for 3.13: `version` is its `PY_VERSION_HEX`, to be compared with
/// `Py_Version`.
pub(super) fn from_debug_offsets(raw: &[u8]) -> Result<(u32, Layout), PyError> {
    if raw.len() < DEBUG_OFFSETS_SIZE || &raw[..8] != DEBUG_COOKIE {
        return Err(PyError::Implausible(
            "_PyRuntime does not start with _Py_DebugOffsets".into(),
        ));
    }
    // The n-th u64 after the cookie.
    let at = |n: usize| crate::process::remote::uint_at(raw, 8 + 8 * n, 8);
    let version = at(0);
    let minor = ((version >> 16) & 0xff) as u8;
    if version >> 24 != 3 || version > u64::from(u32::MAX) {
        return Err(PyError::Implausible(format!(
            "_Py_DebugOffsets version {version:#x}"
        )));
    }
    if minor != 13 {
        return Err(PyError::Unsupported(minor));
    }
    if at(1) != 0 {
        // Free-threaded (3.13t): other object headers, not read here.
        return Err(PyError::Unsupported(minor));
    }
    // runtime_state: size, finalizing, interpreters_head
    let (rt_size, rt_head) = (at(2), at(4));
    // interpreter_state: size, id, next, threads_head, gc, imports_modules,
    // sysdict, builtins, ceval_gil, gil_runtime_state, ..._enabled,
    // ..._locked, ..._holder
    let (is_size, is_id, is_next, is_threads) = (at(5), at(6), at(7), at(8));
    let (is_modules, is_ceval_gil, is_gil) = (at(10), at(13), at(14));
    // thread_state: size, prev, next, interp, current_frame, thread_id,
    // native_thread_id, datastack_chunk, status
    let (ts_size, ts_next, ts_interp, ts_frame) = (at(18), at(20), at(21), at(22));
    let (ts_thread_id, ts_native) = (at(23), at(24));
    // interpreter_frame: size, previous, executable, instr_ptr,
    // localsplus, owner
    let (fr_size, fr_prev, fr_exec, fr_owner) = (at(27), at(28), at(29), at(32));
    // code_object: size, filename, name, qualname, linetable,
    // firstlineno, ...
    let (co_size, co_file, co_qual, co_first) = (at(33), at(34), at(36), at(38));
    // pyobject: size, ob_type; type_object: size, tp_name, tp_repr,
    // tp_flags
    let (ob_type, tp_size, tp_name, tp_flags) = (at(44), at(45), at(46), at(48));
    // (tuple_object 49..51, list_object 52..54) dict_object: size,
    // ma_keys, ma_values (55..57); (float_object 58, 59) long_object:
    // size, lv_tag, ob_digit (60..62); (bytes_object 63..65)
    // unicode_object: size, state, length, asciiobject_size (66..69)
    let (ma_keys, ma_values) = (at(56), at(57));
    let (lv_tag, ob_digit) = (at(61), at(62));
    let (str_state, str_length, ascii_size) = (at(67), at(68), at(69));

    let within =
        |off: u64, width: u64, size: u64| off.checked_add(width).is_some_and(|e| e <= size);
    let sane = [
        rt_size < 16 << 20 && within(rt_head, 8, rt_size),
        is_size < 16 << 20,
        [is_id, is_next, is_threads, is_modules, is_ceval_gil]
            .iter()
            .all(|&o| within(o, 8, is_size)),
        within(is_gil, GIL_SIZE, is_size),
        ts_size <= 4096,
        [ts_next, ts_interp, ts_frame, ts_thread_id, ts_native]
            .iter()
            .all(|&o| within(o, 8, ts_size)),
        fr_size <= 4096 && within(fr_prev, 8, fr_size) && within(fr_exec, 8, fr_size),
        within(fr_owner, 1, fr_size),
        co_size <= 4096 && [co_file, co_qual].iter().all(|&o| within(o, 8, co_size)),
        within(co_first, 4, co_size),
        // What the table below takes from 3.13's headers assumes these.
        ob_type == 8 && tp_size <= 4096 && tp_name == 24 && tp_flags == 168,
        ma_keys == 32 && ma_values == 40,
        lv_tag == 16 && ob_digit == 24,
        str_length == 16 && str_state == 32 && ascii_size == 40,
    ];
    if sane.iter().any(|ok| !ok) {
        return Err(PyError::Implausible(
            "_Py_DebugOffsets out of bounds or unlike 3.13's".into(),
        ));
    }
    let layout = Layout {
        minor,
        main: Main::Head(rt_head),
        gil: Gil::Interp {
            ptr: is_ceval_gil,
            own: is_gil,
        },
        interp_next: is_next,
        interp_id: is_id,
        interp_runtime: None,
        interp_threads: is_threads,
        interp_modules: is_modules,
        ts_size,
        ts_next,
        ts_interp,
        ts_frame,
        cframe: None,
        ts_thread_id,
        ts_native_tid: Some(ts_native),
        frame_back: fr_prev,
        frame_code: fr_exec,
        entry: Entry::Shim(fr_owner, OWNED_BY_CSTACK),
        co_name: co_qual,
        co_filename: co_file,
        co_firstlineno: co_first,
        tp_name,
        // Not in _Py_DebugOffsets: 3.13's headers.
        tp_basicsize: 32,
        tp_flags,
        tp_dictoffset: 288,
        ht_cached_keys: 880,
        str_length,
        str_state,
        ascii_size,
        compact_size: 56,
        str_ready_bit: false,
        ma_keys,
        ma_values,
        keys: Keys::V11,
        values_at: 8,
        managed: Managed::Inline13,
        long_tag: true,
        long_size: lv_tag,
        long_digits: ob_digit,
        md_dict: 16,
    };
    layout.check()?;
    Ok((version as u32, layout))
}

impl Layout {
    /// Refuses a layout the BPF walk cannot follow: every field it reads
    /// within the first [`PY_FRAME_READ`] bytes of a frame, within
    /// `PyThreadState` and `_PyCFrame`, and every offset a `u16`.
    pub(super) fn check(&self) -> Result<(), PyError> {
        let frame = u64::from(PY_FRAME_READ);
        let fits = |off: u64, width: u64, size: u64| {
            off < u64::from(PY_NO_FIELD) && off.checked_add(width).is_some_and(|e| e <= size)
        };
        let entry_ok = match self.entry {
            Entry::Every => true,
            Entry::Flag(off) | Entry::Shim(off, _) => fits(off, 1, frame),
        };
        let ok = fits(self.ts_frame, 8, self.ts_size)
            && self.cframe.is_none_or(|(off, size)| fits(off, 8, size))
            && fits(self.frame_back, 8, frame)
            && fits(self.frame_code, 8, frame)
            && entry_ok;
        if !ok {
            return Err(PyError::Implausible(format!(
                "3.{} frame layout outside what the walk reads",
                self.minor
            )));
        }
        Ok(())
    }

    /// Bytes of a `PyThreadState` that hold every field read.
    pub(super) fn ts_span(&self) -> usize {
        let last = [
            self.ts_next,
            self.ts_interp,
            self.ts_frame,
            self.ts_thread_id,
        ]
        .into_iter()
        .chain(self.ts_native_tid)
        .max()
        .unwrap_or(0);
        (last + 8).min(self.ts_size) as usize
    }

    /// Bytes of a `PyCodeObject` that hold every field read.
    pub(super) fn code_span(&self) -> usize {
        let last = [self.co_name, self.co_filename, self.co_firstlineno, 8]
            .into_iter()
            .max()
            .unwrap_or(0);
        (last + 8) as usize
    }

    /// Bytes of a heap type that hold every field read.
    pub(super) fn type_span(&self) -> usize {
        let last = [
            self.tp_name,
            self.tp_basicsize,
            self.tp_flags,
            self.tp_dictoffset,
            self.ht_cached_keys,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        (last + 8) as usize
    }

    /// `struct ws_python_code` without the GIL range.
    pub(super) fn walk(&self) -> UnwindPython {
        let (entry, frame_entry, shim_owner) = match self.entry {
            Entry::Every => (WalkEntry::WS_PY_ENTRY_EVERY, PY_NO_FIELD, 0),
            Entry::Flag(off) => (WalkEntry::WS_PY_ENTRY_FLAG, off as u16, 0),
            Entry::Shim(off, owner) => (WalkEntry::WS_PY_ENTRY_SHIM, off as u16, owner),
        };
        UnwindPython {
            tstate_frame: self.ts_frame as u16,
            cframe_frame: self.cframe.map_or(PY_NO_FIELD, |(off, _)| off as u16),
            frame_back: self.frame_back as u16,
            frame_code: self.frame_code as u16,
            frame_entry,
            entry: entry as u8,
            shim_owner,
            minor: self.minor,
            ..abi::UnwindPython::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_fit_the_walk() {
        for minor in 10..=12 {
            let l = table(minor).unwrap();
            let w = l.walk();
            assert_eq!(w.minor, minor);
            assert!(u64::from(w.frame_back) + 8 <= u64::from(PY_FRAME_READ));
        }
        assert_eq!(table(9), Err(PyError::Unsupported(9)));
        assert_eq!(table(13), Err(PyError::Unsupported(13)));
        let mut bad = table(12).unwrap();
        bad.frame_back = 96;
        assert!(bad.check().is_err());
        bad = table(11).unwrap();
        bad.cframe = Some((20, 24));
        assert!(bad.check().is_err());
    }

    #[test]
    fn debug_offsets_are_refused_unless_sane() {
        assert!(from_debug_offsets(&[0; DEBUG_OFFSETS_SIZE]).is_err());
        let mut raw = vec![0xffu8; DEBUG_OFFSETS_SIZE];
        raw[..8].copy_from_slice(DEBUG_COOKIE);
        assert!(from_debug_offsets(&raw).is_err());
        raw[8..16].copy_from_slice(&0x030d_00f0u64.to_le_bytes());
        raw[16..24].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            from_debug_offsets(&raw),
            Err(PyError::Implausible(_))
        ));
        raw[8..16].copy_from_slice(&0x030e_00f0u64.to_le_bytes());
        assert_eq!(from_debug_offsets(&raw), Err(PyError::Unsupported(14)));
    }
}
