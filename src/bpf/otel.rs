//! The handle user space writes OpenTelemetry thread-context locations
//! with (`otel_procs`, see `bpf/otelctx.bpf.h`): discovery finds where a
//! process's `otel_thread_ctx_v1` lives and registers it here; the
//! programs read a thread's context only for processes registered.

use aya::maps::{HashMap, MapData, MapError};

use super::abi::{otel_tls, OtelProc, OTEL_PROCS};

/// How a thread's pointer leads to its `otel_thread_ctx_v1` variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtelTls {
    /// At thread pointer + `tp_offset` (initial- or local-exec, or a
    /// TLSDESC resolved to static TLS).
    Static { tp_offset: i64 },
    /// At the thread's glibc dtv[`module`] block + `offset` (general
    /// dynamic, or a TLSDESC resolved to dynamic TLS).
    Dtv { module: u64, offset: u64 },
}

/// `otel_procs`: the processes whose thread context the programs read.
pub struct OtelProcs {
    map: HashMap<MapData, u32, OtelProc>,
}

impl OtelProcs {
    pub(super) fn new(map: HashMap<MapData, u32, OtelProc>) -> Self {
        OtelProcs { map }
    }

    /// Processes that can be registered at once.
    pub const CAPACITY: u32 = OTEL_PROCS;

    /// Registers (or moves) process `pid`'s thread context. Fails when the
    /// map is full.
    pub fn set(&mut self, pid: u32, tls: OtelTls) -> Result<(), MapError> {
        let mut entry = OtelProc::default();
        match tls {
            OtelTls::Static { tp_offset } => {
                entry.kind = otel_tls::STATIC;
                entry.tp_offset = tp_offset;
            }
            OtelTls::Dtv { module, offset } => {
                entry.kind = otel_tls::DTV;
                entry.module = module;
                entry.offset = offset;
            }
        }
        self.map.insert(pid, entry, 0)
    }

    /// Stops reading process `pid`'s context (its threads' next sample or
    /// switch-out closes the span they were in). Nothing when absent.
    pub fn remove(&mut self, pid: u32) {
        let _ = self.map.remove(&pid);
    }
}
