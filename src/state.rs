//! The state the pipeline writes and the API and the pusher read: the
//! store and the daemon's health. It sits below `pipeline`, `api` and
//! `export`, so that each of them can hold it without importing another.
//! The pusher's counters ([`push`]) are here for the same reason: the
//! pusher writes them, `/healthz` and `/metrics` read them.

pub mod push;

use std::{
    sync::{Arc, Mutex, OnceLock, RwLock},
    time::Instant,
};

use serde::Serialize;

use self::push::PushStats;
use crate::{
    bpf,
    collect::walks::WalkCostRow,
    jvm::Jvms,
    process::{ProcessTable, TableStats},
    profile::model::store::Store,
    trace::Recorder,
    unwind::registry::UnwindStats,
};

/// Health of the daemon's own machinery.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Health {
    pub drains: u64,
    pub drain_errors: u64,
    pub last_drain_us: u64,
    pub max_drain_us: u64,
    /// Drain durations over the last `pipeline::DRAIN_WINDOW` drains.
    pub drain_us_p50: u64,
    pub drain_us_p99: u64,
    /// Longest time between the starts of two drains (the drain interval
    /// plus any stall), since start and its p99 over the last
    /// `pipeline::DRAIN_WINDOW` drains.
    pub max_drain_gap_us: u64,
    pub drain_gap_us_p99: u64,
    /// How the collector thread was raised above the daemon's others:
    /// `fifo 1`, `nice -10` or `others niced` (see `priority::raise`).
    pub drain_priority: String,
    pub last_symbolize_us: u64,
    /// Sum of every batch's `last_symbolize_us`: with
    /// `symbolized_batches`, the mean over any window (benches).
    pub symbolize_us_total: u64,
    /// Batches symbolized so far.
    pub symbolized_batches: u64,
    /// CPU time the symbolizer's thread spent on the last batch: its work,
    /// without the time it waited for a CPU on a busy host.
    pub last_symbolize_cpu_us: u64,
    /// Sum of every batch's `last_symbolize_cpu_us`.
    pub symbolize_cpu_us_total: u64,
    /// Rows whose stack was gone from the stack map when read.
    pub missing_stacks: u64,
    /// Unwind tables: loaded, evicted, processes using them.
    pub unwind: UnwindStats,
    /// Stack walks since start and what they cost, by kind and depth.
    pub walk_cost: Vec<WalkCostRow>,
    /// The same by kind, all depths together.
    pub walk_cost_by_kind: Vec<WalkCostRow>,
    /// Drained batches dropped (its queue holds `pipeline::BATCH_QUEUE`,
    /// and one more batch waits in the collector, its rows summed by key;
    /// a batch past what the others leave of `pipeline::max_batch_bytes`,
    /// the symbolizer behind or not, loses its stacks, and only if that is
    /// not enough is it dropped).
    pub batches_dropped: u64,
    /// Rows of the dropped batches.
    pub rows_dropped: u64,
    /// Drains merged into the next one because the symbolizer's queue was
    /// full (nothing lost; the slice covers several seconds).
    pub batches_merged: u64,
    /// Times the waiting batch outgrew its bound and its rows lost their
    /// stacks (thread time by state stays exact).
    pub batches_stripped: u64,
    /// Processes folded into one merged thread in a batch still past its
    /// bound once stripped (their time by state stays exact, summed).
    pub batch_processes_folded: u64,
    /// JVM sightings dropped because the JVM agent was busy.
    pub jvm_sightings_dropped: u64,
    /// Bytes of frame names the symbolizer holds.
    pub frame_name_bytes: u64,
    /// ELF files the symbolizer holds open.
    pub elf_files_open: u64,
    /// The native frame cache (hits, misses, evictions, bytes) and the
    /// ELF files parsed and looked up for what it missed.
    pub frame_cache: crate::symbolize::FrameCacheStats,
    /// The process table: processes and images held, events applied.
    pub processes: TableStats,
    /// Unwind registrations skipped because the registry was still busy
    /// with the previous drain's processes (they come again next drain).
    pub unwind_updates_skipped: u64,
    /// How the off-CPU engine runs on this kernel.
    pub engine: Option<bpf::Engine>,
    /// OpenTelemetry contexts found, and what was refused.
    pub otel: crate::otelctx::OtelStats,
}

/// State that the API reads.
pub struct Shared {
    pub store: RwLock<Store>,
    pub health: Mutex<Health>,
    pub started: Instant,
    /// Attached programs with their number of links.
    pub attached: Vec<(String, usize)>,
    /// The JVMs seen, their thread names and attach status.
    pub jvms: Arc<Jvms>,
    /// The Pyroscope pusher's counters, once it runs (`--push-url`).
    pub push: OnceLock<Arc<PushStats>>,
    /// The OTLP sink's counters, once it runs (`--otlp-url`).
    pub otlp: OnceLock<Arc<PushStats>>,
    /// The processes of the host, as the kernel's lifecycle events keep
    /// them: every stage asks it (and subscribes to its changes) rather
    /// than `/proc`.
    pub processes: Arc<ProcessTable>,
    /// `/trace` recordings, once the programs are loaded.
    pub trace: OnceLock<Arc<Recorder>>,
}

impl Shared {
    /// The daemon's health figures, locked for a short update or read.
    pub fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Shared state around an existing store (also used by tests).
    pub fn new(store: Store, attached: Vec<(String, usize)>) -> Arc<Self> {
        Arc::new(Shared {
            store: RwLock::new(store),
            health: Mutex::new(Health::default()),
            started: Instant::now(),
            attached,
            jvms: Arc::new(Jvms::default()),
            push: OnceLock::new(),
            otlp: OnceLock::new(),
            processes: Arc::new(ProcessTable::default()),
            trace: OnceLock::new(),
        })
    }
}
