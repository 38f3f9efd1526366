//! Bytes the daemon's holders keep, as running counters each holder sets
//! when it changes (after a batch, a build, a read), so that `/healthz`
//! breaks the daemon's memory down by holder without walking anything.
//!
//! The store's figures are not here: it publishes its own
//! ([`crate::profile::model::store::Published`]). Nor is the file-backed memory
//! of the ELF files the symbolizer maps: the kernel counts it, per
//! mapping, and [`crate::api::memory`] reads it from `/proc/self/smaps`
//! for the files listed by [`set_mapped_files`].

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex,
};

/// A holder that keeps its own running count of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The symbolizer's interned frame names (the store's slices hold the
    /// same allocations).
    SymbolizerNames,
    /// Names read from JIT perf maps (`/tmp/perf-PID.map`).
    PerfMapNames,
    /// The heap the ELF symbolizers may use: the files' mapped bytes bound
    /// it (blazesym keeps what it parsed of a file, at most its size).
    ElfSymbols,
    /// The kernel's symbols (`/proc/kallsyms`) as blazesym parsed them for
    /// kernel frames: an estimate, fixed by the kernel.
    KernelSymbols,
    /// Unwind tables being built (their rows are in BPF maps once built,
    /// not in user space), and the registry's file and process entries.
    UnwindTables,
    /// Decoded JVM nmethods (code cache) and method names.
    JvmCode,
    /// The process table's images and their mappings.
    ProcessTable,
    /// Drained batches not yet symbolized: the one in the symbolizer's
    /// queue and the one waiting in the collector.
    Batches,
}

const COUNT: usize = 8;
const NONE: u64 = u64::MAX;

static BYTES: [AtomicU64; COUNT] = [const { AtomicU64::new(0) }; COUNT];
static BOUNDS: [AtomicU64; COUNT] = [const { AtomicU64::new(NONE) }; COUNT];
static MAPPED: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// Sets what `holder` holds now, and its enforced bound (`None`: none).
pub fn set(holder: Holder, bytes: u64, bound: Option<u64>) {
    BYTES[holder as usize].store(bytes, Ordering::Relaxed);
    BOUNDS[holder as usize].store(bound.unwrap_or(NONE), Ordering::Relaxed);
}

/// What `holder` holds, and its bound.
pub fn get(holder: Holder) -> (u64, Option<u64>) {
    let bound = BOUNDS[holder as usize].load(Ordering::Relaxed);
    (
        BYTES[holder as usize].load(Ordering::Relaxed),
        (bound != NONE).then_some(bound),
    )
}

/// `bytes` more (`add`) or fewer for `holder`, whose bound stays as set.
pub fn change(holder: Holder, bytes: u64, add: bool) {
    let counter = &BYTES[holder as usize];
    if add {
        counter.fetch_add(bytes, Ordering::Relaxed);
    } else {
        let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
            Some(b.saturating_sub(bytes))
        });
    }
}

/// The files (device, inode) the ELF symbolizers have mapped now.
pub fn set_mapped_files(files: Vec<(u64, u64)>) {
    *MAPPED.lock().unwrap_or_else(|e| e.into_inner()) = files;
}

/// See [`set_mapped_files`].
pub fn mapped_files() -> Vec<(u64, u64)> {
    MAPPED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_keep_bytes_and_bounds() {
        set(Holder::JvmCode, 12, Some(100));
        assert_eq!(get(Holder::JvmCode), (12, Some(100)));
        set(Holder::JvmCode, 0, None);
        assert_eq!(get(Holder::JvmCode), (0, None));
    }
}
