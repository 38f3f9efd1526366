//! Turning on `-XX:+DebugNonSafepoints` in a running JVM, as async-profiler
//! does from inside: without it C2 records which methods it inlined only
//! at safepoints and calls, so a pc in a hot inlined loop maps to the
//! method the loop was compiled into, never to the small method whose
//! code it is. The flag is read by the compiler each time it compiles, so
//! code compiled from then on carries the full inlining record; code
//! compiled before keeps the sparse one until it is recompiled. It is a
//! diagnostic flag (not settable through `jcmd VM.set_flag`), so its byte
//! is written directly.
//!
//! This is the one write wallscope makes into another process, so it is
//! made only where everything agrees: the flag table is found through the
//! layout read from that very JVM ([`super::vmstructs`], never another
//! process's), and checked against what its own libjvm *file* fixes (the
//! addresses of `JVMFlag::flags`, `JVMFlag::numFlags`, the flag table and
//! `DebugNonSafepoints` in its symbol table, `sizeof(JVMFlag)`, the
//! writable segment); the flag's entry must name `DebugNonSafepoints`,
//! and its byte must lie in the process's writable mapping of that same
//! file. The process is held by a pidfd, and its start time and libjvm
//! mapping are checked again just before the write (no pid reuse, no
//! exec) and its pidfd after. Anything that disagrees is refused and
//! counted (`jvm_write`/`unverified`). `--jvm-frames perf-map` and
//! `--jvm=off` write nothing ([`super::Jvms::allow_flag_writes`]).

use std::{
    collections::HashMap,
    fs::File,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    sync::{Arc, Mutex},
};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SegmentFlags};

use super::vmstructs::Vm;
use crate::{
    process::files::{hotspot_libjvm_in, ExecMapping, FileKey},
    process::live::{self, exec_mappings},
    process::remote::Remote,
    untrusted::refusals::{count_for, Reason, What},
};

/// Flags a JVM has at most (JDK 25 has about 1,500).
const MAX_FLAGS: u64 = 10_000;
/// Largest `sizeof(JVMFlag)` believed.
const MAX_FLAG_SIZE: u64 = 256;
/// libjvm files whose facts are remembered.
const MAX_FILES: usize = 16;
const FLAG: &str = "DebugNonSafepoints";

/// What became of the flag in one JVM, for `/processes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DebugNonSafepoints {
    /// It was on already (set on the command line, or by an agent).
    AlreadyOn,
    /// wallscope turned it on.
    SetByWallscope,
    /// It could not be found, verified or written: inlined frames are
    /// only known at safepoints and calls.
    Unavailable,
}

/// Why the flag was not written.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    /// Something needed is missing or gone (the JVM exited, no table).
    #[error("{0}")]
    Unavailable(String),
    /// The JVM's tables do not read (yet: a JVM seen as it maps libjvm has
    /// not filled them): tried again at a later sighting.
    #[error("JVM structures: {0}")]
    NotYet(String),
    /// What the JVM's memory says disagrees with its libjvm file, or the
    /// process is no longer the one checked: refused and counted.
    #[error("unverified: {0}")]
    Unverified(String),
}

fn unavailable(e: impl std::fmt::Display) -> WriteError {
    WriteError::Unavailable(e.to_string())
}

/// Prepares JVM `pid` as soon as it maps libjvm, before it compiles
/// anything: turns the flag on and records the outcome in its report.
/// Done once per JVM (the agent does it at first sighting otherwise);
/// nothing at all unless flag writes are allowed.
pub fn prepare(pid: u32, jvms: &super::Jvms) {
    if !jvms.flag_writes_allowed()
        || jvms
            .report(pid)
            .is_some_and(|r| r.debug_non_safepoints.is_some())
    {
        return;
    }
    let state = match enable(pid, jvms) {
        Ok(state) => state,
        Err(WriteError::NotYet(why)) => {
            tracing::debug!(pid, "{FLAG}: {why}");
            return;
        }
        Err(WriteError::Unavailable(why)) => {
            tracing::debug!(pid, "{FLAG}: {why}");
            DebugNonSafepoints::Unavailable
        }
        Err(WriteError::Unverified(why)) => {
            tracing::warn!(pid, "not writing {FLAG}: {why}");
            count_for(What::JvmWrite, Reason::Unverified, pid);
            DebugNonSafepoints::Unavailable
        }
    };
    jvms.update(pid, |e| e.report.debug_non_safepoints = Some(state));
}

/// Finds, checks and turns on the flag in JVM `pid`.
fn enable(pid: u32, jvms: &super::Jvms) -> Result<DebugNonSafepoints, WriteError> {
    // The pidfd first: the start time read after it (while it has not
    // exited) is that of the process it holds.
    let pidfd = PidFd::open(pid).map_err(unavailable)?;
    let started = live::start_ticks(pid).ok_or_else(|| unavailable("exited"))?;
    if pidfd.exited() {
        return Err(unavailable("exited"));
    }
    let mappings = exec_mappings(pid).map_err(unavailable)?;
    let m = libjvm(&mappings).ok_or_else(|| unavailable("no libjvm.so mapping"))?;
    let file = m.open(pid).map_err(unavailable)?;
    let bias = crate::unwind::table::load_bias_of(&file, m.start, m.offset).map_err(unavailable)?;
    let facts = jvms.libjvm_facts().of(&file, m.key)?;
    let vm = (jvms.layouts().of_mapped(pid, &mappings))
        .map_err(|e| WriteError::NotYet(e.to_string()))?;
    let mem = Remote::new(pid);
    let addr = verified_flag(&vm, &mem, &facts, bias)?;
    writable_in(pid, &m, addr)?;
    let still_same = || -> Result<(), WriteError> {
        if pidfd.exited() || live::start_ticks(pid) != Some(started) {
            return Err(WriteError::Unverified("the process exited".into()));
        }
        let now = exec_mappings(pid).map_err(unavailable)?;
        if libjvm(&now).as_ref() != Some(&m) {
            return Err(WriteError::Unverified("the process exec'd".into()));
        }
        Ok(())
    };
    still_same()?;
    let byte = mem.bytes(addr, 1).map_err(unavailable)?;
    if byte[0] != 0 {
        return Ok(DebugNonSafepoints::AlreadyOn);
    }
    mem.write_byte(addr, 1).map_err(unavailable)?;
    if pidfd.exited() {
        return Err(WriteError::Unverified(
            "the process exited during the write".into(),
        ));
    }
    Ok(DebugNonSafepoints::SetByWallscope)
}

fn libjvm(mappings: &[ExecMapping]) -> Option<ExecMapping> {
    hotspot_libjvm_in(mappings).cloned()
}

/// The address of the flag's byte, found through the JVM's own flag table
/// and checked against its libjvm file.
fn verified_flag(vm: &Vm, mem: &Remote, facts: &FileFacts, bias: u64) -> Result<u64, WriteError> {
    let t = vm
        .layout
        .flags
        .ok_or_else(|| unavailable("the VM does not describe its flags"))?;
    let disagree = |what: &str, mem: u64, file: u64| {
        Err(WriteError::Unverified(format!(
            "{what} is {mem:#x} in memory, {file:#x} in the file"
        )))
    };
    let (array_at, count_at) = (bias.wrapping_add(t.array), bias.wrapping_add(t.count));
    if let Some(p) = facts.flags_ptr {
        if bias.wrapping_add(p) != array_at {
            return disagree("&JVMFlag::flags", array_at, bias.wrapping_add(p));
        }
    }
    let array = mem.u64(array_at).map_err(unavailable)?;
    let count = mem.u64(count_at).map_err(unavailable)?;
    if let Some((at, n)) = facts.num_flags {
        if bias.wrapping_add(at) != count_at {
            return disagree("&JVMFlag::numFlags", count_at, bias.wrapping_add(at));
        }
        if count != n {
            return disagree("JVMFlag::numFlags", count, n);
        }
    }
    if let Some((at, size)) = facts.table {
        if array != bias.wrapping_add(at) {
            return disagree("JVMFlag::flags", array, bias.wrapping_add(at));
        }
        if t.size.checked_mul(count) != Some(size) {
            return disagree("the flag table's size", t.size.saturating_mul(count), size);
        }
    }
    let inside = |f: super::vmstructs::Field| f.offset + f.width as u64 <= t.size;
    if !inside(t.name) || !inside(t.addr) {
        return Err(WriteError::Unverified(format!(
            "JVMFlag::_name at {}, _addr at {}, past sizeof(JVMFlag) = {}",
            t.name.offset, t.addr.offset, t.size
        )));
    }
    if count == 0 || count > MAX_FLAGS || !(8..=MAX_FLAG_SIZE).contains(&t.size) {
        return Err(WriteError::Unverified(format!(
            "{count} flags of {} bytes",
            t.size
        )));
    }
    let len = count * t.size;
    if !facts.writable(array.wrapping_sub(bias), len) {
        return Err(WriteError::Unverified(format!(
            "flag table at {array:#x} outside libjvm's data"
        )));
    }
    let table = mem.bytes(array, len as usize).map_err(unavailable)?;
    let addr = table
        .chunks_exact(t.size as usize)
        .find(|f| mem.cstr(t.name.get(f)).as_deref() == Some(FLAG))
        .map(|f| t.addr.get(f))
        .ok_or_else(|| unavailable("no such flag"))?;
    if let Some(sym) = facts.flag {
        if addr != bias.wrapping_add(sym) {
            return disagree(FLAG, addr, bias.wrapping_add(sym));
        }
    }
    if !facts.writable(addr.wrapping_sub(bias), 1) {
        return Err(WriteError::Unverified(format!(
            "{FLAG} at {addr:#x} outside libjvm's data"
        )));
    }
    Ok(addr)
}

/// Checks that `addr` lies in `pid`'s writable mapping of the libjvm file
/// `m` maps, or in the anonymous writable mappings right after it (its
/// `.bss`).
fn writable_in(pid: u32, m: &ExecMapping, addr: u64) -> Result<(), WriteError> {
    let lines = live::regions(pid).map_err(unavailable)?;
    let mut i = lines
        .iter()
        .position(|l| l.start <= addr && addr < l.end)
        .ok_or_else(|| WriteError::Unverified(format!("{addr:#x} is not mapped")))?;
    // The file's own mapping, or anonymous ones back to it.
    for _ in 0..4 {
        let l = &lines[i];
        if !l.writable {
            break;
        }
        if l.file == Some(m.key) {
            return Ok(());
        }
        if l.file.is_some() || i == 0 || lines[i - 1].end != l.start {
            break;
        }
        i -= 1;
    }
    Err(WriteError::Unverified(format!(
        "{addr:#x} is not in a writable mapping of {}",
        m.path
    )))
}

/// What a libjvm file fixes about its flags, by virtual address. Read
/// from the file, never from a process, so it can be kept per file.
#[derive(Debug, Default)]
struct FileFacts {
    /// `[start, end)` of each writable `PT_LOAD` segment.
    writable: Vec<(u64, u64)>,
    /// `DebugNonSafepoints` (the flag's variable), from `.symtab`.
    flag: Option<u64>,
    /// `JVMFlag::flags` (the pointer to the table).
    flags_ptr: Option<u64>,
    /// `JVMFlag::numFlags` and its value.
    num_flags: Option<(u64, u64)>,
    /// The flag table `JVMFlag::flags` points at: address and size.
    table: Option<(u64, u64)>,
}

impl FileFacts {
    /// Whether `[at, at + len)` lies in one writable segment.
    fn writable(&self, at: u64, len: u64) -> bool {
        at.checked_add(len)
            .is_some_and(|end| self.writable.iter().any(|&(s, e)| s <= at && end <= e))
    }

    fn read(file: &File) -> Result<FileFacts, WriteError> {
        let data = object::ReadCache::new(file);
        let elf = object::File::parse(&data).map_err(unavailable)?;
        let mut facts = FileFacts {
            writable: elf
                .segments()
                .filter(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_W != 0))
                .map(|s| (s.address(), s.address().saturating_add(s.size())))
                .collect(),
            ..FileFacts::default()
        };
        let mut num_flags_at = None;
        for sym in elf.symbols().chain(elf.dynamic_symbols()) {
            match sym.name() {
                Ok(FLAG) => facts.flag = Some(sym.address()),
                Ok("_ZN7JVMFlag5flagsE") => facts.flags_ptr = Some(sym.address()),
                Ok("_ZN7JVMFlag8numFlagsE") => num_flags_at = Some(sym.address()),
                Ok("_ZL9flagTable") => facts.table = Some((sym.address(), sym.size())),
                _ => {}
            }
        }
        facts.num_flags = num_flags_at.and_then(|at| {
            let section = elf
                .sections()
                .find(|s| s.address() <= at && at < s.address().saturating_add(s.size()))?;
            let bytes = section.data_range(at, 8).ok()??;
            Some((at, u64::from_le_bytes(bytes.try_into().ok()?)))
        });
        if facts.writable.is_empty() {
            return Err(unavailable("libjvm.so has no writable segment"));
        }
        Ok(facts)
    }
}

/// The facts of libjvm files, read once per file version (at most
/// [`MAX_FILES`]): held by [`super::Jvms`].
#[derive(Debug, Default)]
pub struct LibjvmFacts(Mutex<FactsByVersion>);

/// Facts by file and version (mtime, its nanoseconds, size).
type FactsByVersion = HashMap<(FileKey, i64, i64, u64), Arc<FileFacts>>;

impl LibjvmFacts {
    /// The facts of the libjvm `file` (`key`).
    fn of(&self, file: &File, key: FileKey) -> Result<Arc<FileFacts>, WriteError> {
        file_facts(&self.0, file, key)
    }
}

fn file_facts(
    facts: &Mutex<FactsByVersion>,
    file: &File,
    key: FileKey,
) -> Result<Arc<FileFacts>, WriteError> {
    let meta = file.metadata().map_err(unavailable)?;
    // A file rewritten in place (its owner's to do) is read again.
    let version = (key, meta.mtime(), meta.mtime_nsec(), meta.size());
    if let Some(known) = facts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&version)
    {
        return Ok(known.clone());
    }
    let read = Arc::new(FileFacts::read(file)?);
    let mut facts = facts.lock().unwrap_or_else(|e| e.into_inner());
    if facts.len() >= MAX_FILES {
        facts.clear();
    }
    facts.insert(version, read.clone());
    Ok(read)
}

/// A process held by a pidfd: it can be told whether it exited (its pid
/// then may name another process).
struct PidFd(OwnedFd);

impl PidFd {
    fn open(pid: u32) -> std::io::Result<PidFd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned to us and is owned by nobody else.
        Ok(PidFd(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// Whether the process exited (or cannot be told).
    fn exited(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) != 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pidfd_tells_a_child_exited() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let fd = PidFd::open(child.id()).unwrap();
        assert!(!fd.exited());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(fd.exited());
    }

    #[test]
    fn facts_bound_writes_to_writable_segments() {
        let facts = FileFacts {
            writable: vec![(0x1000, 0x3000)],
            ..FileFacts::default()
        };
        assert!(facts.writable(0x1000, 0x2000));
        assert!(!facts.writable(0x2fff, 2));
        assert!(!facts.writable(0x0fff, 1));
        assert!(!facts.writable(u64::MAX, 2));
    }

    #[test]
    fn the_system_libjvm_fixes_the_flag_table() {
        let Some(path) = system_libjvm() else {
            eprintln!("skipped: no JDK");
            return;
        };
        let facts = FileFacts::read(&File::open(&path).unwrap()).unwrap();
        let flag = facts.flag.expect("DebugNonSafepoints in .symtab");
        assert!(facts.writable(flag, 1));
        let (_, n) = facts.num_flags.unwrap();
        let (table, size) = facts.table.unwrap();
        assert!(n > 500 && size % n == 0, "{n} flags in {size} bytes");
        assert!(facts.writable(table, size));
    }

    #[test]
    fn no_write_unless_allowed() {
        let jvms = super::super::Jvms::default();
        prepare(std::process::id(), &jvms);
        assert_eq!(jvms.report(std::process::id()), None);
    }

    fn system_libjvm() -> Option<std::path::PathBuf> {
        let java = std::fs::canonicalize(which("java")?).ok()?;
        let lib = java.parent()?.parent()?.join("lib/server/libjvm.so");
        lib.exists().then_some(lib)
    }

    fn which(cmd: &str) -> Option<std::path::PathBuf> {
        std::env::var_os("PATH")?
            .to_str()?
            .split(':')
            .map(|d| std::path::Path::new(d).join(cmd))
            .find(|p| p.exists())
    }
}
