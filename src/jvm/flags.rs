//! Turning on `-XX:+DebugNonSafepoints` in a running JVM, as async-profiler
//! does from inside: without it C2 records which methods it inlined only
//! at safepoints and calls, so a pc in a hot inlined loop maps to the
//! method the loop was compiled into, never to the small method whose
//! code it is. The flag is read by the compiler each time it compiles, so
//! code compiled from then on carries the full inlining record; code
//! compiled before keeps the sparse one until it is recompiled. It is a
//! diagnostic flag (not settable through `jcmd VM.set_flag`), so its byte
//! is written directly, found through the VM's own flag table.

use super::{remote::Remote, vmstructs::Vm};

/// Flags a JVM has at most (JDK 25 has about 1,500).
const MAX_FLAGS: u64 = 10_000;
const FLAG: &str = "DebugNonSafepoints";

/// What became of the flag in one JVM, for `/processes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DebugNonSafepoints {
    /// It was on already (set on the command line, or by an agent).
    AlreadyOn,
    /// wallscope turned it on.
    SetByWallscope,
    /// It could not be found or written: inlined frames are only known
    /// at safepoints and calls.
    Unavailable,
}

/// Prepares JVM `pid` as soon as it maps libjvm, before it compiles
/// anything: turns the flag on and records the outcome in its report.
/// Done once per JVM (the agent does it at first sighting otherwise).
pub fn prepare(pid: u32, jvms: &super::Jvms) {
    if jvms
        .report(pid)
        .is_some_and(|r| r.debug_non_safepoints.is_some())
    {
        return;
    }
    let state = match super::vmstructs::layout_of(pid) {
        Ok(vm) => enable_debug_non_safepoints(&vm, &Remote::new(pid)),
        Err(err) => {
            tracing::debug!(pid, "JVM structures: {err}");
            DebugNonSafepoints::Unavailable
        }
    };
    jvms.update(pid, |e| e.report.debug_non_safepoints = Some(state));
}

/// Turns the flag on in JVM `vm` (memory `mem`), once.
pub fn enable_debug_non_safepoints(vm: &Vm, mem: &Remote) -> DebugNonSafepoints {
    match find_flag(vm, mem) {
        Some(addr) => match mem.bytes(addr, 1) {
            Ok(b) if b[0] != 0 => DebugNonSafepoints::AlreadyOn,
            Ok(_) => match mem.write_byte(addr, 1) {
                Ok(()) => DebugNonSafepoints::SetByWallscope,
                Err(err) => {
                    tracing::debug!("writing {FLAG}: {err}");
                    DebugNonSafepoints::Unavailable
                }
            },
            Err(_) => DebugNonSafepoints::Unavailable,
        },
        None => DebugNonSafepoints::Unavailable,
    }
}

/// The address of the flag's value.
fn find_flag(vm: &Vm, mem: &Remote) -> Option<u64> {
    let t = vm.layout.flags?;
    let array = mem.u64(vm.bias + t.array).ok()?;
    let count = mem.u64(vm.bias + t.count).ok()?.min(MAX_FLAGS);
    let table = mem.bytes(array, (count * t.size) as usize).ok()?;
    table.chunks_exact(t.size as usize).find_map(|f| {
        let name = mem.cstr(t.name.get(f))?;
        (name == FLAG).then(|| t.addr.get(f))
    })
}
