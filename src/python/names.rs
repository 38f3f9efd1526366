//! Python's names of its threads: `threading._active`, a dict of
//! `{ident: Thread}`, found through `sys.modules`, and each `Thread`'s
//! `_name`.

use std::ops::ControlFlow;

use super::{
    objects::{pointer, read, read_u64, u64_in},
    Interpreter, PyError, MAX_THREADS,
};
use crate::process::remote::Remote;

pub(super) fn thread_names(py: &Interpreter, mem: &Remote) -> Result<Vec<(u64, String)>, PyError> {
    let Some(active) = active(py, mem)? else {
        return Ok(Vec::new());
    };
    let objects = py.objects(mem);
    let dict = objects.dict(active)?;
    let mut threads = Vec::new();
    objects.each(&dict, |key, value| {
        threads.push((key, value));
        if threads.len() == MAX_THREADS {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    let mut names = Vec::new();
    for (key, thread) in threads {
        // A thread whose entry cannot be read is left out, not the rest.
        let name = objects.uint(key).and_then(|ident| {
            let name = objects.attribute(thread, "_name")?;
            Ok((ident, name.map(|n| objects.string(n)).transpose()?))
        });
        match name {
            Ok((ident, Some(name))) => names.push((ident, name)),
            Ok((_, None)) => {}
            Err(e) if mem.exhausted() => return Err(e),
            Err(e) => tracing::debug!(pid = py.pid, "python thread name: {e}"),
        }
    }
    Ok(names)
}

/// `threading._active`, if `threading` is imported: once found, kept and
/// checked to be a dict still at each use.
fn active(py: &Interpreter, mem: &Remote) -> Result<Option<u64>, PyError> {
    let mut cached = py.active.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(at) = *cached {
        if read_u64(mem, at + 8).ok() == Some(py.types.dict) {
            return Ok(Some(at));
        }
        *cached = None;
    }
    let l = &py.layout;
    let objects = py.objects(mem);
    let modules = read_u64(mem, py.interp + l.interp_modules)?;
    if modules == 0 {
        return Ok(None);
    }
    let Some(threading) = objects.get(&objects.dict(modules)?, "threading")? else {
        return Ok(None);
    };
    pointer(threading, "threading module")?;
    let module = read(mem, threading, (l.md_dict + 8) as usize)?;
    if py.types.module != 0 && u64_in(&module, 8) != py.types.module {
        return Err(PyError::Implausible("threading is not a module".into()));
    }
    let globals = objects.dict(u64_in(&module, l.md_dict))?;
    let found = objects.get(&globals, "_active")?;
    if let Some(at) = found {
        objects.dict(at)?;
        *cached = Some(at);
    }
    Ok(found)
}
