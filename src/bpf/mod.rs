//! Loading and attaching the BPF programs with aya: one object, an on-CPU
//! sampler per CPU and the scheduler tracepoints of the off-CPU engine.

pub mod abi;
pub mod batch;
pub mod iter;
pub mod otel;

use std::{os::fd::AsFd, path::Path};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        BtfTracePoint, Iter, PerfEvent,
    },
    Btf, Ebpf, EbpfLoader,
};
use thiserror::Error;

use aya_obj::btf::BtfKind;

use abi::{names, Hist, HistKey, StackKey, StackValue, ThreadTotals};

/// The compiled object, built from `bpf/wallscope.bpf.c` by build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/wallscope.bpf.o"));

/// Why the programs could not be loaded or attached.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("wallscope needs root (or CAP_BPF + CAP_PERFMON) to load eBPF programs")]
    NotRoot,
    #[error(
        "kernel BTF not found at /sys/kernel/btf/vmlinux: the kernel needs CONFIG_DEBUG_INFO_BTF=y"
    )]
    NoBtf,
    #[error("loading the BPF object: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("BPF program `{name}` is missing from the object")]
    MissingProgram { name: &'static str },
    #[error("BPF map `{name}` is missing from the object")]
    MissingMap { name: &'static str },
    #[error("BPF program `{name}`: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("BPF map `{name}`: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("listing online CPUs: {0}")]
    Cpus(#[source] std::io::Error),
    #[error("reading kernel BTF: {0}")]
    Btf(#[source] aya::BtfError),
}

/// Options that shape what the programs record.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// On-CPU sampling frequency per CPU.
    pub frequency_hz: u64,
    /// Record samples of the idle task (pid 0).
    pub include_idle: bool,
    /// Off-CPU intervals shorter than this get no stack row (per-thread
    /// totals still count them).
    pub offcpu_min_ns: u64,
    /// Sampling scale of off-CPU and waker stacks: an interval of length
    /// d gets a stack with probability min(1, d / this); 0: every one.
    pub offcpu_sample_ns: u64,
    /// Threads off-CPU at least this long are listed in the live view.
    pub live_min_ns: u64,
    /// Walk off-CPU stacks at switch-in where the kernel allows (else at
    /// every switch-out).
    pub stacks_at_switch_in: bool,
    /// Walk user stacks with unwind tables where processes have them.
    pub unwind_tables: bool,
    /// Note every CPU's runs and split runqueue waits among them.
    pub culprits: bool,
    /// Capacity of the unwind row array (12 bytes a row).
    pub unwind_rows: u32,
    /// Threads on the host at start: the counts maps are sized for them.
    pub host_threads: u32,
}

impl ProbeOptions {
    /// Every off-CPU interval with its stack, no unwind tables and no
    /// culprits, sampling at `frequency_hz`: the programs alone, as tests
    /// and benchmarks that load them without the daemon want them.
    pub fn plain(frequency_hz: u64) -> Self {
        ProbeOptions {
            frequency_hz,
            include_idle: false,
            offcpu_min_ns: 0,
            offcpu_sample_ns: 0,
            live_min_ns: 100_000_000,
            stacks_at_switch_in: true,
            unwind_tables: false,
            culprits: false,
            unwind_rows: 1024,
            host_threads: 4096,
        }
    }
}

/// One of the two aggregation buffers.
pub struct Buffer {
    pub counts: HashMap<MapData, StackKey, StackValue>,
    pub threads: HashMap<MapData, u32, ThreadTotals>,
    pub runq_hist: HashMap<MapData, HistKey, Hist>,
    /// Who ran while each thread waited in a runqueue (ns).
    pub culprits: HashMap<MapData, abi::CulpritKey, u64>,
    /// Each thread's exact time per OpenTelemetry span.
    pub span_times: HashMap<MapData, abi::SpanKey, abi::SpanTimes>,
}

/// Stacks of one generation by id.
pub type StackMap = HashMap<MapData, u32, abi::StoredStack>;

/// The maps user space reads, taken out of the loaded object.
pub struct ProbeMaps {
    pub buffers: [Buffer; 2],
    /// One stack map per generation, stacks by id.
    pub stacks: [StackMap; 3],
    pub control: Array<MapData, u32>,
    /// Rows inserted per buffer since it was last emptied (reset by the
    /// drainer): past 7/8 of the buffer, new rows merge per process.
    pub counts_used: Array<MapData, u64>,
    /// Capacity of each counts buffer.
    pub counts_entries: u32,
    pub stats: PerCpuArray<MapData, u64>,
    /// What each stack walk cost (one entry, per CPU).
    pub walk_cost: PerCpuArray<MapData, abi::WalkCost>,
    /// Taken by the unwind registry (`None` once taken).
    pub unwind: Option<UnwindMaps>,
    /// Process lifecycle events, taken by the process table (`None` once
    /// taken).
    pub proc_events: Option<RingBuf<MapData>>,
    /// The drain-time task iterator (`None` where the kernel refused it).
    pub live: Option<iter::TaskIter>,
    /// Records of spans first seen (taken at every drain).
    pub span_records: HashMap<MapData, abi::SpanRecordKey, abi::SpanRecord>,
    /// Where processes keep their thread context, taken by discovery
    /// (`None` once taken).
    pub otel_procs: Option<otel::OtelProcs>,
    /// What `/trace` recordings use (`None` once taken, or where the
    /// kernel refused the snapshot iterator).
    pub trace: Option<TraceMaps>,
}

/// The maps and iterator of `/trace` recordings (see `bpf/trace.bpf.h`).
pub struct TraceMaps {
    /// The traced tgid at index 0 (0: none).
    pub target: Array<MapData, u32>,
    /// State changes of the traced process's threads.
    pub events: RingBuf<MapData>,
    /// Where each thread is when a recording starts.
    pub snapshot: iter::TaskIter,
    /// `trace_switch`, loaded, attached only while a recording runs
    /// ([`iter::attach_tp_btf`]): with none, context switches pay nothing
    /// for `/trace`.
    pub switch: aya::programs::ProgramFd,
}

/// How the off-CPU engine runs on this kernel (for `/healthz`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Engine {
    /// Off-CPU stacks are walked at switch-in (`sched_exit_tp`), only for
    /// the intervals drawn; otherwise at every switch-out.
    pub stacks_at_switch_in: bool,
    /// Ongoing intervals are accounted at each drain and blocked threads
    /// listed (a task iterator).
    pub live_threads: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_threads_error: Option<String>,
    /// Sampling scale of off-CPU and waker stacks, in microseconds.
    pub stack_sample_us: u64,
}

/// Unwind tables and the processes that use them (written by user space).
pub struct UnwindMaps {
    pub rows: Array<MapData, abi::UnwindRow>,
    pub procs: HashMap<MapData, u32, abi::UnwindProc>,
    /// Python threads' thread states (`python_threads`), taken by the
    /// registry's Python side (`crate::python::registry`).
    pub py_threads: Option<HashMap<MapData, abi::PyThreadKey, u64>>,
    /// Capacity of `rows`.
    pub capacity: u32,
}

/// Loaded and attached programs. Dropping it detaches everything.
pub struct Probes {
    /// Kept alive so the links stay attached.
    _ebpf: Ebpf,
    /// Names of the attached programs, with how many links each.
    pub attached: Vec<(String, usize)>,
    pub engine: Engine,
    /// Just before the first program was attached: nothing the maps hold
    /// is older, so the first drain's interval starts here.
    pub recording_since: std::time::SystemTime,
}

/// Loads the programs and attaches the on-CPU sampler to every online CPU
/// and the off-CPU engine to the scheduler tracepoints.
pub fn load(opts: &ProbeOptions) -> Result<(Probes, ProbeMaps), LoadError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(LoadError::NotRoot);
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(LoadError::NoBtf);
    }
    raise_memlock_limit();

    let include_idle = u8::from(opts.include_idle);
    let counts_entries = counts_entries(opts.host_threads).min(crate::budget::max_counts_rows());
    let merge_at = u64::from(counts_entries - counts_entries / 8);
    let strip_at = u64::from(counts_entries - counts_entries / 16);
    let unwind_tables = u8::from(opts.unwind_tables);
    let attribute_culprits = u8::from(opts.culprits);
    let unwind_rows = opts.unwind_rows.max(1);
    let btf = Btf::from_sys_fs().map_err(LoadError::Btf)?;
    // A bare tracepoint (no tracefs event) of recent kernels: at the end of
    // __schedule(), in the task that got the CPU.
    let switch_in_hook = opts.stacks_at_switch_in
        && btf
            .id_by_type_name_kind("btf_trace_sched_exit_tp", BtfKind::Typedef)
            .is_ok();
    let stacks_at_switch_in = u8::from(switch_in_hook);
    // The draw is u32 x T >> 32 in BPF: T below 2^32 ns.
    let sample_ns = opts.offcpu_sample_ns.min(u64::from(u32::MAX));
    let mut ebpf = EbpfLoader::new()
        // aya has no type for task storage; only BPF touches that map.
        .allow_unsupported_maps()
        .override_global(names::INCLUDE_IDLE, &include_idle, true)
        .override_global(names::OFFCPU_MIN_NS, &opts.offcpu_min_ns, true)
        .override_global(names::OFFCPU_SAMPLE_NS, &sample_ns, true)
        .override_global(names::STACKS_AT_SWITCH_IN, &stacks_at_switch_in, true)
        .override_global(names::LIVE_MIN_NS, &opts.live_min_ns, true)
        .override_global(names::UNWIND_TABLES, &unwind_tables, true)
        .override_global(names::ATTRIBUTE_CULPRITS, &attribute_culprits, true)
        .map_max_entries(names::UNWIND_ROWS, unwind_rows)
        .map_max_entries(names::COUNTS[0], counts_entries)
        .map_max_entries(names::COUNTS[1], counts_entries)
        .override_global(names::COUNTS_MERGE_AT, &merge_at, true)
        .override_global(names::COUNTS_STRIP_AT, &strip_at, true)
        .load(OBJECT)
        .map_err(LoadError::Load)?;

    let program: &mut PerfEvent = ebpf
        .program_mut(names::ON_CPU_PROGRAM)
        .ok_or(LoadError::MissingProgram {
            name: names::ON_CPU_PROGRAM,
        })?
        .try_into()
        .map_err(|source| LoadError::Program {
            name: names::ON_CPU_PROGRAM,
            source,
        })?;
    program.load().map_err(|source| LoadError::Program {
        name: names::ON_CPU_PROGRAM,
        source,
    })?;
    let cpus = aya::util::online_cpus().map_err(|(_, e)| LoadError::Cpus(e))?;
    // cpu-clock counts nanoseconds: a fixed period gives exactly `hz`
    // samples per second of CPU time, so samples x period is CPU time.
    let period_ns = 1_000_000_000 / opts.frequency_hz.max(1);
    let recording_since = std::time::SystemTime::now();
    for &cpu in &cpus {
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Period(period_ns),
                true,
            )
            .map_err(|source| LoadError::Program {
                name: names::ON_CPU_PROGRAM,
                source,
            })?;
    }
    let mut attached = vec![(names::ON_CPU_PROGRAM.to_string(), cpus.len())];

    let hooks = names::SCHED_PROGRAMS
        .iter()
        .chain(switch_in_hook.then_some(&names::SWITCH_IN_PROGRAM))
        .chain((!switch_in_hook).then_some(&names::SWITCH_OUT_PROGRAM));
    for &(name, tracepoint) in hooks {
        loaded_tp_btf(&mut ebpf, &btf, (name, tracepoint))?
            .attach()
            .map_err(|source| LoadError::Program { name, source })?;
        attached.push((name.to_string(), 1));
    }

    let live = attach_iter(&mut ebpf, &btf, names::LIVE_PROGRAM);
    if live.is_ok() {
        attached.push((names::LIVE_PROGRAM.to_string(), 1));
    }
    let trace_iter = attach_iter(&mut ebpf, &btf, names::TRACE_THREADS_PROGRAM);
    // Loaded now (verified once), attached by each recording after
    // on_switch's link, so it reports on_switch's classification.
    let trace_switch = load_tp_btf(&mut ebpf, &btf, names::TRACE_SWITCH_PROGRAM);
    match (&trace_iter, &trace_switch) {
        (Ok(_), Ok(_)) => {
            attached.push((names::TRACE_THREADS_PROGRAM.to_string(), 1));
            attached.push((names::TRACE_SWITCH_PROGRAM.0.to_string(), 0));
        }
        (Err(e), _) | (_, Err(e)) => tracing::warn!("no /trace recordings: {e}"),
    }
    let mut maps = take_maps(&mut ebpf, unwind_rows)?;
    if let (Ok(snapshot), Ok(switch)) = (trace_iter, trace_switch) {
        maps.trace = Some(TraceMaps {
            target: take(&mut ebpf, names::TRACE_TARGET)?,
            events: take(&mut ebpf, names::TRACE_EVENTS)?,
            snapshot,
            switch,
        });
    }
    maps.counts_entries = counts_entries;
    let engine = Engine {
        stacks_at_switch_in: switch_in_hook,
        live_threads: live.is_ok(),
        // The verifier's log can be megabytes: its first line says enough.
        live_threads_error: live
            .as_ref()
            .err()
            .map(|e| e.to_string().lines().next().unwrap_or_default().to_string()),
        stack_sample_us: sample_ns / 1000,
    };
    if let Err(e) = &live {
        tracing::warn!(
            "no drain-time task iterator ({e}): blocked threads show only once they wake"
        );
    }
    maps.live = live.ok();
    Ok((
        Probes {
            _ebpf: ebpf,
            attached,
            engine,
            recording_since,
        },
        maps,
    ))
}

/// Loads and attaches the task iterator `name` (the live one is sleepable:
/// Linux 5.18+ for `bpf_copy_from_user_task`).
fn attach_iter(
    ebpf: &mut Ebpf,
    btf: &Btf,
    name: &'static str,
) -> Result<iter::TaskIter, LoadError> {
    let err = |source| LoadError::Program { name, source };
    let program: &mut Iter = ebpf
        .program_mut(name)
        .ok_or(LoadError::MissingProgram { name })?
        .try_into()
        .map_err(err)?;
    program.load("task", btf).map_err(err)?;
    let fd = program.fd().map_err(err)?;
    iter::TaskIter::attach(fd.as_fd()).map_err(|e| syscall_error(name, "bpf_link_create", e))
}

/// Loads the `tp_btf` program `(name, tracepoint)`.
fn loaded_tp_btf<'a>(
    ebpf: &'a mut Ebpf,
    btf: &Btf,
    (name, tracepoint): (&'static str, &'static str),
) -> Result<&'a mut BtfTracePoint, LoadError> {
    let err = |source| LoadError::Program { name, source };
    let program: &mut BtfTracePoint = ebpf
        .program_mut(name)
        .ok_or(LoadError::MissingProgram { name })?
        .try_into()
        .map_err(err)?;
    program.load(tracepoint, btf).map_err(err)?;
    Ok(program)
}

/// Loads the `tp_btf` program `(name, tracepoint)` without attaching it;
/// a copy of its fd to attach it later.
fn load_tp_btf(
    ebpf: &mut Ebpf,
    btf: &Btf,
    (name, tracepoint): (&'static str, &'static str),
) -> Result<aya::programs::ProgramFd, LoadError> {
    let program = loaded_tp_btf(ebpf, btf, (name, tracepoint))?;
    let fd = program
        .fd()
        .map_err(|source| LoadError::Program { name, source })?;
    fd.try_clone().map_err(|e| syscall_error(name, "dup", e))
}

/// A failed syscall made here rather than through aya, as aya reports one.
fn syscall_error(name: &'static str, call: &'static str, io_error: std::io::Error) -> LoadError {
    LoadError::Program {
        name,
        source: aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
            call,
            io_error,
        }),
    }
}

/// Takes map `name` out of the object, typed.
fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, LoadError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(LoadError::MissingMap { name })?;
    T::try_from(map).map_err(|source| LoadError::Map { name, source })
}

fn take_maps(ebpf: &mut Ebpf, unwind_rows: u32) -> Result<ProbeMaps, LoadError> {
    let buffer = |ebpf: &mut Ebpf, i: usize| -> Result<Buffer, LoadError> {
        Ok(Buffer {
            counts: take(ebpf, names::COUNTS[i])?,
            threads: take(ebpf, names::THREADS[i])?,
            runq_hist: take(ebpf, names::RUNQ_HIST[i])?,
            culprits: take(ebpf, names::CULPRITS[i])?,
            span_times: take(ebpf, names::SPAN_TIMES[i])?,
        })
    };
    Ok(ProbeMaps {
        buffers: [buffer(ebpf, 0)?, buffer(ebpf, 1)?],
        stacks: [
            take(ebpf, names::STACKS[0])?,
            take(ebpf, names::STACKS[1])?,
            take(ebpf, names::STACKS[2])?,
        ],
        control: take(ebpf, names::CONTROL)?,
        counts_used: take(ebpf, names::COUNTS_USED)?,
        counts_entries: 0,
        stats: take(ebpf, names::STATS)?,
        walk_cost: take(ebpf, names::WALK_COST)?,
        unwind: Some(UnwindMaps {
            rows: take(ebpf, names::UNWIND_ROWS)?,
            procs: take(ebpf, names::UNWIND_PROCS)?,
            py_threads: Some(take(ebpf, names::PYTHON_THREADS)?),
            capacity: unwind_rows,
        }),
        proc_events: Some(take(ebpf, names::PROC_EVENTS)?),
        live: None,
        span_records: take(ebpf, names::SPAN_RECORDS)?,
        otel_procs: Some(otel::OtelProcs::new(take(ebpf, names::OTEL_PROCS)?)),
        trace: None,
    })
}

/// Rows each counts buffer holds, from the threads on the host when the
/// daemon starts: a thread that ran in a drain has a few rows (its CPU
/// stacks, its off-CPU states, the wakeups it sent). Between 32 Ki and
/// 256 Ki rows (~120 bytes each, preallocated, two buffers: 8–60 MB of
/// kernel memory); threads beyond that merge per process rather than drop.
pub fn counts_entries(threads: u32) -> u32 {
    (threads.saturating_mul(4))
        .checked_next_power_of_two()
        .unwrap_or(u32::MAX)
        .clamp(32 << 10, 256 << 10)
}

/// Older kernels charge BPF memory to RLIMIT_MEMLOCK; newer ones to the
/// memory cgroup, where raising the limit may be refused. Only warn.
fn raise_memlock_limit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: passing a valid pointer to a stack value.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        tracing::warn!(
            "could not raise RLIMIT_MEMLOCK ({}); fine on kernels that charge BPF memory to the memory cgroup",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_buffers_follow_the_host_within_bounds() {
        assert_eq!(counts_entries(0), 32 << 10);
        assert_eq!(counts_entries(10_000), 64 << 10);
        assert_eq!(counts_entries(u32::MAX), 256 << 10);
    }
}
