//! The BPF <-> user-space contract, as generated from `bpf/wallscope.h`
//! (build.rs: bindgen for types and constants, WS_STATS for [`Stat`]).
//! Kept by hand here: the crate's names for the generated items, `Pod`
//! impls for what goes through maps, and domain types ([`State`]).

mod generated;
mod stat;

use std::mem::size_of;

use generated as c;
pub use stat::Stat;

/// Length of a kernel task name (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = c::WS_COMM_LEN as usize;
/// Frames kept per stack.
pub const MAX_STACK_DEPTH: usize = c::WS_MAX_STACK_DEPTH as usize;
/// Stack id stored when a stack could not be captured.
pub const NO_STACK: i32 = c::WS_NO_STACK;
/// Culprits of a runqueue wait that are no process (see `ws_culprit_key`).
pub const CULPRIT_UNSEEN: u32 = c::WS_CULPRIT_UNSEEN;
pub const CULPRIT_OTHERS: u32 = c::WS_CULPRIT_OTHERS;
/// Stack maps rotate through this many generations.
pub const STACK_GENERATIONS: u32 = c::WS_STACK_GENERATIONS;
/// Entries of each stack map (`WS_STACKS_ENTRIES`).
pub const STACKS_ENTRIES: u32 = c::WS_STACKS_ENTRIES;
/// Mappings with unwind tables per process (`WS_UNWIND_MAX_MAPPINGS`).
pub const UNWIND_MAX_MAPPINGS: usize = c::WS_UNWIND_MAX_MAPPINGS as usize;
/// Processes with unwind tables: the capacity of `unwind_procs`.
pub const UNWIND_PROCS: usize = c::WS_UNWIND_PROCS as usize;
/// Rows of the largest table BPF's binary search reaches.
pub const UNWIND_MAX_TABLE_ROWS: u32 = c::WS_UNWIND_MAX_TABLE_ROWS;
/// Code heaps of a JVM the walk steps through.
pub const UNWIND_JAVA_HEAPS: usize = c::WS_JAVA_MAX_HEAPS as usize;
/// Bytes of a code blob's header the walk reads.
pub const JAVA_BLOB_HEADER: u64 = c::WS_JAVA_BLOB_HEADER as u64;
/// log2 microsecond buckets of the runqueue histograms.
pub const HIST_SLOTS: usize = c::WS_HIST_SLOTS as usize;
/// Slots of a thread's blocked intervals (`WS_SLEEP_SLOTS`).
pub const SLEEP_SLOTS: usize = c::WS_SLEEP_SLOTS as usize;
/// `state` of a key that records a wakeup sent, not a thread state.
pub const WAKEUP_STATE: u32 = c::ws_state::WS_STATE_WAKEUP as u32;
/// Tid of the waker of a wakeup raised in interrupt context (pid 0;
/// `WS_INTERRUPT_TID`): never the interrupted thread.
pub const INTERRUPT_TID: u32 = c::WS_INTERRUPT_TID;
/// Flag of the tid of a process's merged row (`WS_MERGED_TID`): rows of
/// threads that found their buffer nearly full, tid `MERGED_TID | pid`.
pub const MERGED_TID: u32 = c::WS_MERGED_TID;
/// `WS_JAVA_METHOD_TAG`: a user stack entry that is an interpreted Java
/// frame's `Method*`, not a pc.
pub const JAVA_METHOD_TAG: u64 = c::WS_JAVA_METHOD_TAG;
/// `WS_UNWIND_PENDING_FRAME`: where a walk met code whose table was
/// pending: the last native entry when the walk ended there (its callers
/// unknown), or the second when the innermost frame could not be vouched
/// for (a frame may be missing there; the frame pointers above it were
/// walked).
pub const UNWIND_PENDING_FRAME: u64 = c::WS_UNWIND_PENDING_FRAME;
/// `WS_PY_FRAME_TAG`: a user stack entry that is a Python frame's code
/// object (or one of the markers below), appended after the native frames.
pub const PY_FRAME_TAG: u64 = c::WS_PY_FRAME_TAG;
/// `WS_PY_EVAL_END`: the Python frames of one eval-loop call end here.
pub const PY_EVAL_END: u64 = c::WS_PY_EVAL_END;
/// `WS_PY_GIL`: the thread waits for the GIL.
pub const PY_GIL: u64 = c::WS_PY_GIL;
/// `WS_PY_CUT`: the Python chain went on past what was recorded.
pub const PY_CUT: u64 = c::WS_PY_CUT;
/// A layout field the interpreter does not have (`WS_PY_NO_FIELD`).
pub const PY_NO_FIELD: u16 = c::WS_PY_NO_FIELD as u16;
/// Python frames a stack keeps at most (`WS_PY_MAX_FRAMES`).
pub const PY_MAX_FRAMES: usize = c::WS_PY_MAX_FRAMES as usize;
/// Bytes of a Python frame the walk reads at once (`WS_PY_FRAME_READ`).
pub const PY_FRAME_READ: u16 = c::WS_PY_FRAME_READ as u16;
/// Entries of `python_threads` (`WS_PY_THREADS`).
pub const PY_THREADS: usize = c::WS_PY_THREADS as usize;

/// Key of the aggregation maps (`struct ws_stack_key`).
pub type StackKey = c::ws_stack_key;
/// Value of the aggregation maps (`struct ws_stack_value`).
pub type StackValue = c::ws_stack_value;
/// Per-thread totals (`struct ws_thread_totals`).
pub type ThreadTotals = c::ws_thread_totals;
/// Key of the runqueue histograms (`struct ws_hist_key`).
pub type HistKey = c::ws_hist_key;
pub type CulpritKey = c::ws_culprit_key;
/// A runqueue histogram (`struct ws_hist`): slot 0 under 1 us, slot i
/// (i > 0) [2^(i-1), 2^i) us; `ns` the total time of the intervals counted.
pub type Hist = c::ws_hist;
/// One stored stack (`struct ws_stack`): its id is the low 31 bits of `hash`.
pub type StoredStack = c::ws_stack;
/// One unwind table row (`struct ws_unwind_row`); see `bpf/wallscope.h`.
pub type UnwindRow = c::ws_unwind_row;
/// An executable mapping with an unwind table (`struct ws_unwind_mapping`).
pub type UnwindMapping = c::ws_unwind_mapping;
/// A process's mappings with tables (`struct ws_unwind_proc`).
pub type UnwindProc = c::ws_unwind_proc;
/// A JVM's code as the walk steps through it (`struct ws_java_code`).
pub type UnwindJava = c::ws_java_code;
/// A code heap of it (`struct ws_java_heap`).
pub type UnwindJavaHeap = c::ws_java_heap;
/// A CPython interpreter's frame layout as the walk reads it
/// (`struct ws_python_code`).
pub type UnwindPython = c::ws_python_code;
/// How a Python frame marks the start of an eval-loop call
/// (`enum ws_py_entry`).
pub use c::ws_py_entry as PyEntry;
/// Key of `python_threads` (`struct ws_py_thread_key`): a thread by its
/// process and TLS base (`pthread_self()`).
pub type PyThreadKey = c::ws_py_thread_key;
/// One CPU's walk-cost histogram (`struct ws_walk_cost`): walks by kind,
/// frames / 8 and time slot, counters that wrap.
pub type WalkCost = c::ws_walk_cost;
/// A thread off-CPU when the drain looked (`struct ws_live_thread`),
/// written by the `live_threads` task iterator.
pub type LiveThread = c::ws_live_thread;
/// A process lifecycle event from the `proc_events` ring buffer
/// (`struct ws_proc_event`).
pub type ProcEvent = c::ws_proc_event;
/// A state change of a traced thread from the `trace_events` ring buffer
/// (`struct ws_trace_event`).
pub type TraceEvent = c::ws_trace_event;
/// How a process's thread pointer leads to its OpenTelemetry thread
/// context (`otel_procs` values).
pub type OtelProc = c::ws_otel_proc;
/// `enum ws_otel_tls`, the values of [`OtelProc::kind`].
pub mod otel_tls {
    pub const STATIC: u32 = super::c::ws_otel_tls_WS_OTEL_TLS_STATIC;
    pub const DTV: u32 = super::c::ws_otel_tls_WS_OTEL_TLS_DTV;
}
/// Entries of `otel_procs`.
pub const OTEL_PROCS: u32 = c::WS_OTEL_PROCS;
/// A thread's time under one span (`span_times_N`).
pub type SpanKey = c::ws_span_key;
pub type SpanTimes = c::ws_span_times;
/// A span's record as BPF read it (`span_records`).
pub type SpanRecordKey = c::ws_span_record_key;
pub type SpanRecord = c::ws_span_record;
/// Attribute bytes a [`SpanRecord`] keeps (`WS_SPAN_ATTR_BYTES`).
pub const SPAN_ATTR_BYTES: usize = c::WS_SPAN_ATTR_BYTES as usize;
/// Bytes of the `trace_events` ring buffer (`WS_TRACE_RING_BYTES`).
pub const TRACE_RING_BYTES: u32 = c::WS_TRACE_RING_BYTES;

// SAFETY: plain-old-data, `repr(C)`, explicit padding fields only (the
// sizes are pinned by _Static_assert in the header and bindgen's layout
// assertions here).
unsafe impl aya::Pod for WalkCost {}
// SAFETY: as above.
unsafe impl aya::Pod for StoredStack {}
// SAFETY: as above.
unsafe impl aya::Pod for UnwindRow {}
// SAFETY: as above.
unsafe impl aya::Pod for UnwindProc {}
// SAFETY: as above.
unsafe impl aya::Pod for StackKey {}
// SAFETY: as above.
unsafe impl aya::Pod for StackValue {}
// SAFETY: as above.
unsafe impl aya::Pod for ThreadTotals {}
// SAFETY: as above.
unsafe impl aya::Pod for HistKey {}
// SAFETY: a plain C struct of integers, as the others.
unsafe impl aya::Pod for CulpritKey {}
// SAFETY: as above.
unsafe impl aya::Pod for Hist {}
// SAFETY: as above.
unsafe impl aya::Pod for PyThreadKey {}
// SAFETY: as above.
unsafe impl aya::Pod for OtelProc {}
// SAFETY: as above.
unsafe impl aya::Pod for SpanKey {}
// SAFETY: as above.
unsafe impl aya::Pod for SpanTimes {}
// SAFETY: as above.
unsafe impl aya::Pod for SpanRecordKey {}
// SAFETY: as above.
unsafe impl aya::Pod for SpanRecord {}

/// Where a thread's time went (`enum ws_state`), as BPF stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum State {
    Cpu = c::ws_state::WS_STATE_CPU as u32,
    Runqueue = c::ws_state::WS_STATE_RUNQUEUE as u32,
    Futex = c::ws_state::WS_STATE_FUTEX as u32,
    Io = c::ws_state::WS_STATE_IO as u32,
    Sleep = c::ws_state::WS_STATE_SLEEP as u32,
    /// Runnable, but its cgroup's CPU quota is spent (CFS bandwidth).
    Throttled = c::ws_state::WS_STATE_THROTTLED as u32,
}

impl State {
    /// Number of states (`WS_STATE_COUNT`).
    pub const COUNT: usize = c::ws_state::WS_STATE_COUNT as usize;
    /// Every state, in enum order.
    pub const ALL: [State; State::COUNT] = [
        State::Cpu,
        State::Runqueue,
        State::Futex,
        State::Io,
        State::Sleep,
        State::Throttled,
    ];

    /// Decodes the raw value stored by BPF (`collect::convert` turns it
    /// into the model's state).
    pub fn from_raw(raw: u32) -> Option<State> {
        State::ALL.get(raw as usize).copied()
    }
}

// `from_raw` indexes ALL by value: the states are 0..COUNT in order.
const _: () = {
    let mut i = 0;
    while i < State::COUNT {
        assert!(State::ALL[i] as usize == i);
        i += 1;
    }
};

/// Indexes of the `control` array (`enum ws_control`).
#[derive(Debug, Clone, Copy)]
#[repr(u32)]
pub enum Control {
    Buffer = c::ws_control::WS_CONTROL_BUFFER as u32,
    Generation = c::ws_control::WS_CONTROL_GENERATION as u32,
}

/// Whether `tid` is a process's merged row rather than a thread.
pub fn is_merged_tid(tid: u32) -> bool {
    tid & MERGED_TID != 0
}

/// `enum ws_hist_kind`.
pub const HIST_PROCESS: u32 = c::ws_hist_kind::WS_HIST_PROCESS as u32;
/// `enum ws_hist_kind`.
pub const HIST_CGROUP: u32 = c::ws_hist_kind::WS_HIST_CGROUP as u32;
/// `enum ws_hist_kind`: a process's time throttled.
pub const HIST_PROCESS_THROTTLED: u32 = c::ws_hist_kind::WS_HIST_PROCESS_THROTTLED as u32;
/// `enum ws_hist_kind`: a cgroup's time throttled.
pub const HIST_CGROUP_THROTTLED: u32 = c::ws_hist_kind::WS_HIST_CGROUP_THROTTLED as u32;

impl StoredStack {
    /// The captured frames.
    pub fn frames(&self) -> &[u64] {
        &self.ips[..(self.len as usize).min(MAX_STACK_DEPTH)]
    }
}

/// `enum ws_cfa_reg`, the values of [`UnwindRow::cfa_reg`].
pub mod cfa {
    use super::c::ws_cfa_reg;
    pub const RSP: u8 = ws_cfa_reg::WS_CFA_RSP as u8;
    pub const RBP: u8 = ws_cfa_reg::WS_CFA_RBP as u8;
    pub const NONE: u8 = ws_cfa_reg::WS_CFA_NONE as u8;
    pub const END: u8 = ws_cfa_reg::WS_CFA_END as u8;
    pub const UNSUPPORTED: u8 = ws_cfa_reg::WS_CFA_UNSUPPORTED as u8;
}

/// `enum ws_rbp_rule`, the values of [`UnwindRow::rbp_rule`].
pub mod rbp {
    use super::c::ws_rbp_rule;
    pub const SAME: u8 = ws_rbp_rule::WS_RBP_SAME as u8;
    pub const AT_CFA: u8 = ws_rbp_rule::WS_RBP_AT_CFA as u8;
    pub const UNSUPPORTED: u8 = ws_rbp_rule::WS_RBP_UNSUPPORTED as u8;
}

/// `WS_WALK_KINDS`: what a walk walked (see [`walk_kind`]).
pub const WALK_KINDS: usize = c::ws_walk_kind::WS_WALK_KINDS as usize;
/// `WS_WALK_DEPTHS`: frames / 8, the last bucket holding deeper stacks.
pub const WALK_DEPTHS: usize = c::WS_WALK_DEPTHS as usize;
/// `WS_WALK_TIME_SLOTS`: 4 slots per power of two of nanoseconds.
pub const WALK_TIME_SLOTS: usize = c::WS_WALK_TIME_SLOTS as usize;
/// Entries of [`WalkCost`].
pub const WALK_COST_ENTRIES: usize = WALK_KINDS * WALK_DEPTHS * WALK_TIME_SLOTS;
const _: () = assert!(size_of::<WalkCost>() == 4 * WALK_COST_ENTRIES);

/// `enum ws_walk_kind`.
pub mod walk_kind {
    use super::c::ws_walk_kind;
    pub const USER_TABLES: usize = ws_walk_kind::WS_WALK_USER_TABLES as usize;
    pub const USER_FP: usize = ws_walk_kind::WS_WALK_USER_FP as usize;
    pub const KERNEL: usize = ws_walk_kind::WS_WALK_KERNEL as usize;
    pub const LIVE: usize = ws_walk_kind::WS_WALK_LIVE as usize;
}

/// `enum ws_proc_event_kind`, the values of [`ProcEvent::kind`].
pub mod proc_event {
    use super::c::ws_proc_event_kind;
    pub const FORK: u32 = ws_proc_event_kind::WS_PROC_FORK as u32;
    pub const EXEC: u32 = ws_proc_event_kind::WS_PROC_EXEC as u32;
    pub const EXIT: u32 = ws_proc_event_kind::WS_PROC_EXIT as u32;
    pub const RENAME: u32 = ws_proc_event_kind::WS_PROC_RENAME as u32;
}

/// `enum ws_trace_kind`, the values of [`TraceEvent::kind`].
pub mod trace_kind {
    use super::c::ws_trace_kind;
    pub const SWITCH_OUT: u32 = ws_trace_kind::WS_TRACE_SWITCH_OUT as u32;
    pub const SWITCH_IN: u32 = ws_trace_kind::WS_TRACE_SWITCH_IN as u32;
    pub const WAKEUP: u32 = ws_trace_kind::WS_TRACE_WAKEUP as u32;
    pub const NEW: u32 = ws_trace_kind::WS_TRACE_NEW as u32;
    pub const EXIT: u32 = ws_trace_kind::WS_TRACE_EXIT as u32;
    pub const SNAPSHOT: u32 = ws_trace_kind::WS_TRACE_SNAPSHOT as u32;
}

/// Indexes of the `trace_target` array (`enum ws_trace_target`).
pub mod trace_target {
    use super::c::ws_trace_target;
    /// The traced tgid (0: none).
    pub const TGID: u32 = ws_trace_target::WS_TRACE_TARGET_TGID as u32;
    /// Records of the running recording that found the ring full.
    pub const LOST: u32 = ws_trace_target::WS_TRACE_TARGET_LOST as u32;
}

/// Reads a plain-old-data record from bytes; `None` when too short.
/// Unaligned: ring-buffer and iterator records are only 8-aligned.
fn read_record<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: long enough, and every bit pattern is a valid `Pod`.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

// SAFETY: as for the map types above; read from the iterator and the ring
// buffer, never written.
unsafe impl aya::Pod for LiveThread {}
// SAFETY: as above.
unsafe impl aya::Pod for ProcEvent {}
// SAFETY: as above.
unsafe impl aya::Pod for TraceEvent {}

impl TraceEvent {
    /// Reads an event from ring-buffer bytes; `None` when too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<TraceEvent> {
        read_record(bytes)
    }
}

impl LiveThread {
    /// Reads one record from the iterator's output; `None` when too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<LiveThread> {
        read_record(bytes)
    }
}

impl ProcEvent {
    /// Reads an event from ring-buffer bytes; `None` when too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<ProcEvent> {
        read_record(bytes)
    }
}

/// Names of the maps, programs and globals in the BPF object.
pub mod names {
    pub const COUNTS: [&str; 2] = ["counts_0", "counts_1"];
    pub const THREADS: [&str; 2] = ["threads_0", "threads_1"];
    pub const RUNQ_HIST: [&str; 2] = ["runq_hist_0", "runq_hist_1"];
    pub const CULPRITS: [&str; 2] = ["culprits_0", "culprits_1"];
    pub const STACKS: [&str; 3] = ["stacks_0", "stacks_1", "stacks_2"];
    pub const CONTROL: &str = "control";
    pub const STATS: &str = "stats";
    pub const WALK_COST: &str = "walk_cost";
    pub const ON_CPU_PROGRAM: &str = "on_cpu_sample";
    /// tp_btf programs and the tracepoint each attaches to.
    pub const SCHED_PROGRAMS: [(&str, &str); 8] = [
        ("on_switch", "sched_switch"),
        ("on_waking", "sched_waking"),
        ("on_wakeup", "sched_wakeup"),
        ("on_wakeup_new", "sched_wakeup_new"),
        ("on_fork", "sched_process_fork"),
        ("on_exec", "sched_process_exec"),
        ("on_exit", "sched_process_exit"),
        ("on_rename", "task_rename"),
    ];
    pub const PROC_EVENTS: &str = "proc_events";
    pub const COUNTS_USED: &str = "counts_used";
    pub const COUNTS_MERGE_AT: &str = "counts_merge_at";
    pub const COUNTS_STRIP_AT: &str = "counts_strip_at";
    pub const INCLUDE_IDLE: &str = "include_idle";
    pub const OFFCPU_MIN_NS: &str = "offcpu_min_ns";
    pub const OFFCPU_SAMPLE_NS: &str = "offcpu_sample_ns";
    pub const STACKS_AT_SWITCH_IN: &str = "stacks_at_switch_in";
    pub const LIVE_MIN_NS: &str = "live_min_ns";
    pub const ATTRIBUTE_CULPRITS: &str = "attribute_culprits";
    /// The switch-in hook, loaded where the kernel has the tracepoint.
    pub const SWITCH_IN_PROGRAM: (&str, &str) = ("on_switched_in", "sched_exit_tp");
    /// Where it has not (or `--offcpu-stacks switch-out`): stacks walked
    /// at switch-out, after `on_switch`.
    pub const SWITCH_OUT_PROGRAM: (&str, &str) = ("on_switched_out", "sched_switch");
    /// The drain-time task iterator.
    pub const LIVE_PROGRAM: &str = "live_threads";
    /// `/trace` recordings: switches (after `on_switch`), the start-time
    /// snapshot iterator, the traced tgid and the events' ring buffer.
    pub const TRACE_SWITCH_PROGRAM: (&str, &str) = ("trace_switch", "sched_switch");
    pub const TRACE_THREADS_PROGRAM: &str = "trace_threads";
    pub const TRACE_TARGET: &str = "trace_target";
    pub const TRACE_EVENTS: &str = "trace_events";
    pub const UNWIND_TABLES: &str = "unwind_tables";
    pub const UNWIND_ROWS: &str = "unwind_rows";
    pub const UNWIND_PROCS: &str = "unwind_procs";
    pub const PYTHON_THREADS: &str = "python_threads";
    pub const OTEL_PROCS: &str = "otel_procs";
    pub const SPAN_TIMES: [&str; 2] = ["span_times_0", "span_times_1"];
    pub const SPAN_RECORDS: &str = "span_records";
}

/// Reads a NUL-padded kernel name.
pub fn comm_str(comm: &[u8; COMM_LEN]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests;
