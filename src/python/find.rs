//! Finding a process's CPython: the mapped `libpython3.X.so*` or static
//! `python3.X` executable, its version, its layout, checked against what
//! its memory holds.

use std::sync::{Arc, Mutex};

use super::{
    layout::{self, Gil, Layout, Main, DEBUG_OFFSETS_SIZE, GIL_LOCKED, GIL_SIZE},
    objects::{add, pointer, read, read_u64, Types},
    Interpreter, PyError,
};
use crate::{
    process::files::ExecMapping,
    process::mapped::MappedPath,
    process::remote::{uint_at, Budget, Remote},
};

/// Reads [`find`] allows itself per process: calls and bytes.
const FIND_CALLS: u64 = 256;
const FIND_BYTES: u64 = 256 << 10;
/// Distinct interpreter files tried per process.
const MAX_CANDIDATES: usize = 4;
/// Dynamic symbols looked at, at most (CPython exports about 2,000).
const MAX_SYMBOLS: usize = 1 << 16;
/// Interpreters followed in `_PyRuntime`'s list (3.13) looking for the
/// main one.
const MAX_INTERPRETERS: usize = 64;

/// A mapped file that may be an interpreter, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Candidate {
    /// 3.minor, from the name.
    pub minor: u8,
    /// `libpython3.X.so*` (else the `python3.X` executable, which counts
    /// only when it exports `_PyRuntime`).
    pub lib: bool,
    /// A build variant (`3.13t`, `3.10d`): another object layout.
    pub variant: bool,
}

/// What the file named `path` (as `/proc/PID/maps` shows it) may be.
pub(super) fn candidate(path: &str) -> Option<Candidate> {
    let path = MappedPath::parse(path).path;
    let name = path.rsplit('/').next()?;
    let (lib, rest) = if let Some(rest) = name.strip_prefix("libpython3.") {
        (true, rest)
    } else {
        (false, name.strip_prefix("python3.")?)
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 2 {
        return None;
    }
    let minor: u8 = rest[..digits].parse().ok()?;
    let tail = &rest[digits..];
    let (variant, tail) = match tail.strip_prefix(|c: char| c.is_ascii_lowercase()) {
        Some(t) => (true, t),
        None => (false, tail),
    };
    let ok = if lib {
        tail.strip_prefix(".so").is_some_and(|v| {
            v.is_empty()
                || (v.starts_with('.') && v.bytes().all(|b| b == b'.' || b.is_ascii_digit()))
        })
    } else {
        tail.is_empty()
    };
    ok.then_some(Candidate {
        minor,
        lib,
        variant,
    })
}

pub(super) fn find(pid: u32, mappings: &[ExecMapping]) -> Result<Interpreter, PyError> {
    let mem = Remote::with_budget(pid, Budget::new(FIND_CALLS, FIND_BYTES));
    let mut error = PyError::NotPython;
    let mut tried = Vec::new();
    for m in mappings {
        let Some(c) = candidate(&m.path) else {
            continue;
        };
        if tried.contains(&m.key) {
            continue;
        }
        if tried.len() == MAX_CANDIDATES {
            break;
        }
        tried.push(m.key);
        match one(pid, &mem, m, c) {
            Ok(found) => return Ok(found),
            Err(PyError::NotPython) => {}
            Err(e) => error = e,
        }
    }
    Err(error)
}

/// The dynamic symbols read.
#[derive(Debug, Default)]
struct Symbols {
    runtime: Option<u64>,
    version: Option<u64>,
    code: Option<u64>,
    str: Option<u64>,
    long: Option<u64>,
    dict: Option<u64>,
    module: Option<u64>,
}

fn symbols(file: &std::fs::File) -> Result<Symbols, PyError> {
    use object::{Object, ObjectSymbol};
    let data = object::ReadCache::new(file);
    let elf = object::File::parse(&data).map_err(|e| PyError::File(e.to_string()))?;
    let mut s = Symbols::default();
    for sym in elf.dynamic_symbols().take(MAX_SYMBOLS) {
        let slot = match sym.name() {
            Ok("_PyRuntime") => &mut s.runtime,
            Ok("Py_Version") => &mut s.version,
            Ok("PyCode_Type") => &mut s.code,
            Ok("PyUnicode_Type") => &mut s.str,
            Ok("PyLong_Type") => &mut s.long,
            Ok("PyDict_Type") => &mut s.dict,
            Ok("PyModule_Type") => &mut s.module,
            _ => continue,
        };
        if sym.is_definition() && sym.address() != 0 {
            *slot = Some(sym.address());
        }
    }
    Ok(s)
}

/// The interpreter in `m`'s file, if it is one.
fn one(pid: u32, mem: &Remote, m: &ExecMapping, c: Candidate) -> Result<Interpreter, PyError> {
    if c.lib && !(10..=13).contains(&c.minor) {
        return Err(PyError::Unsupported(c.minor));
    }
    let file = m.open(pid).map_err(|e| PyError::File(e.to_string()))?;
    let syms = symbols(&file)?;
    let Some(runtime) = syms.runtime else {
        // An executable linked to libpython, or a stub.
        return Err(if c.lib {
            PyError::File(format!("{}: no _PyRuntime", m.path))
        } else {
            PyError::NotPython
        });
    };
    if !(10..=13).contains(&c.minor) || c.variant {
        return Err(PyError::Unsupported(c.minor));
    }
    let bias = crate::unwind::table::load_bias_of(&file, m.start, m.offset)
        .map_err(|e| PyError::File(e.to_string()))?;
    let at = |sym: u64| bias.wrapping_add(sym);
    let runtime = pointer(at(runtime), "_PyRuntime")?;

    // Py_Version (3.11+) must agree with the name.
    let version = match syms.version {
        Some(v) => {
            let raw = read(mem, at(v), 4)?;
            Some(uint_at(&raw, 0, 4) as u32)
        }
        None => None,
    };
    if let Some(v) = version {
        let minor = (v >> 16) as u8;
        if v >> 24 != 3 || minor != c.minor {
            return Err(PyError::Implausible(format!(
                "{} holds Py_Version {v:#x}",
                m.path
            )));
        }
    } else if c.minor >= 11 {
        return Err(PyError::Implausible(format!("{}: no Py_Version", m.path)));
    }

    let layout = if c.minor >= 13 {
        let raw = read(mem, runtime, DEBUG_OFFSETS_SIZE)?;
        let (debug_version, layout) = layout::from_debug_offsets(&raw)?;
        if Some(debug_version) != version {
            return Err(PyError::Implausible(format!(
                "_Py_DebugOffsets version {debug_version:#x}, Py_Version {version:#x?}"
            )));
        }
        layout
    } else {
        layout::table(c.minor)?
    };
    let Some(code) = syms.code else {
        return Err(PyError::File(format!("{}: no PyCode_Type", m.path)));
    };
    let types = Types {
        code: pointer(at(code), "PyCode_Type")?,
        str: syms.str.map_or(0, at),
        long: syms.long.map_or(0, at),
        dict: syms.dict.map_or(0, at),
        module: syms.module.map_or(0, at),
    };
    let interp = main_interpreter(mem, &layout, runtime)?;
    let gil = check(mem, &layout, runtime, interp, &types)?;
    Ok(Interpreter {
        pid,
        minor: c.minor,
        runtime,
        interp,
        version: version.unwrap_or(0x0300_0000 | u32::from(c.minor) << 16),
        gil,
        layout,
        types,
        active: Arc::new(Mutex::new(None)),
    })
}

/// The main interpreter's `PyInterpreterState`.
fn main_interpreter(mem: &Remote, l: &Layout, runtime: u64) -> Result<u64, PyError> {
    let id = |interp: u64| read_u64(mem, add(interp, l.interp_id)?);
    match l.main {
        Main::Field(off) => {
            let interp = pointer(read_u64(mem, runtime + off)?, "main interpreter")?;
            if id(interp)? != 0 {
                return Err(PyError::Implausible(
                    "main interpreter's id is not 0".into(),
                ));
            }
            Ok(interp)
        }
        Main::Head(off) => {
            let mut at = read_u64(mem, runtime + off)?;
            for _ in 0..MAX_INTERPRETERS {
                let interp = pointer(at, "interpreter")?;
                if id(interp)? == 0 {
                    return Ok(interp);
                }
                at = read_u64(mem, add(interp, l.interp_next)?)?;
            }
            Err(PyError::Implausible(
                "no main interpreter in the list".into(),
            ))
        }
    }
}

/// Checks the layout against the process; the GIL's range.
fn check(
    mem: &Remote,
    l: &Layout,
    runtime: u64,
    interp: u64,
    types: &Types,
) -> Result<(u64, u64), PyError> {
    if let Some(off) = l.interp_runtime {
        if read_u64(mem, add(interp, off)?)? != runtime {
            return Err(PyError::Implausible(
                "the interpreter does not point back to _PyRuntime".into(),
            ));
        }
    }
    // The first thread belongs to it.
    let head = read_u64(mem, add(interp, l.interp_threads)?)?;
    let tstate = pointer(head, "first thread state")?;
    if read_u64(mem, tstate + l.ts_interp)? != interp {
        return Err(PyError::Implausible(
            "the first thread state is not the interpreter's".into(),
        ));
    }
    // The code type is named so.
    let name = read_u64(mem, add(types.code, l.tp_name)?)?;
    if mem.cstr(name).as_deref() != Some("code") {
        return Err(PyError::Implausible("PyCode_Type is not named code".into()));
    }
    let gil = match l.gil {
        Gil::Runtime(off) => runtime + off,
        Gil::Interp { ptr, own } => {
            let gil = read_u64(mem, add(interp, ptr)?)?;
            if gil != add(interp, own)? {
                return Err(PyError::Implausible(
                    "the main interpreter's GIL is not its own".into(),
                ));
            }
            gil
        }
    };
    let state = read(mem, gil, GIL_SIZE as usize)?;
    let locked = uint_at(&state, GIL_LOCKED as usize, 4);
    if locked > 1 {
        return Err(PyError::Implausible(format!(
            "GIL locked = {locked:#x} (not created yet?)"
        )));
    }
    Ok((gil, gil + GIL_SIZE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_interpreters() {
        let lib = |minor| {
            Some(Candidate {
                minor,
                lib: true,
                variant: false,
            })
        };
        assert_eq!(candidate("/usr/lib/libpython3.12.so.1.0"), lib(12));
        assert_eq!(candidate("/x/libpython3.10.so"), lib(10));
        assert_eq!(candidate("/x/libpython3.10.so (deleted)"), lib(10));
        assert_eq!(
            candidate("/usr/bin/python3.11"),
            Some(Candidate {
                minor: 11,
                lib: false,
                variant: false
            })
        );
        assert!(candidate("/x/libpython3.13t.so.1.0").unwrap().variant);
        assert_eq!(candidate("/x/libpython3.so"), None);
        assert_eq!(candidate("/x/libpython3.12.so.py"), None);
        assert_eq!(candidate("/x/libpython3.12.a"), None);
        assert_eq!(candidate("/usr/bin/python3"), None);
        assert_eq!(candidate("/usr/bin/python3.11-config"), None);
        assert_eq!(candidate("/x/python3.11.so"), None);
        assert_eq!(candidate("/x/libpython3.999.so"), None);
    }
}
