//! Rust mirror of `bpf/wallscope.h`, the BPF <-> user-space contract.
//! Keep the two in step: sizes are pinned here and in the header, and the
//! tests below check every field offset.

use std::mem::size_of;

/// Length of a kernel task name (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;
/// Frames kept per stack.
pub const MAX_STACK_DEPTH: usize = 127;
/// Stack id stored when a stack could not be captured.
pub const NO_STACK: i32 = -1;
/// Stack maps rotate through this many generations.
pub const STACK_GENERATIONS: u32 = 3;
/// Mappings with unwind tables per process (`WS_UNWIND_MAX_MAPPINGS`).
pub const UNWIND_MAX_MAPPINGS: usize = 16;
/// log2 microsecond buckets of the runqueue histograms.
pub const HIST_SLOTS: usize = 32;
/// `state` of a key that records a wakeup sent, not a thread state.
pub const WAKEUP_STATE: u32 = 6;
/// Tid of the waker of a wakeup raised in interrupt context (pid 0;
/// `WS_INTERRUPT_TID`): never the interrupted thread.
pub const INTERRUPT_TID: u32 = 0x4000_0000;

/// Where a thread's time went (`enum ws_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[repr(u32)]
pub enum State {
    Cpu = 0,
    Runqueue = 1,
    Futex = 2,
    Io = 3,
    Sleep = 4,
    /// Runnable, but its cgroup's CPU quota is spent (CFS bandwidth).
    Throttled = 5,
}

impl State {
    /// Every state, in enum order.
    pub const ALL: [State; 6] = [
        State::Cpu,
        State::Runqueue,
        State::Futex,
        State::Io,
        State::Sleep,
        State::Throttled,
    ];
    /// Number of states (`WS_STATE_COUNT`).
    pub const COUNT: usize = 6;

    /// Decodes the raw value stored by BPF.
    pub fn from_raw(raw: u32) -> Option<State> {
        State::ALL.get(raw as usize).copied()
    }

    /// Lower-case name as used in the API.
    pub fn name(self) -> &'static str {
        match self {
            State::Cpu => "cpu",
            State::Runqueue => "runqueue",
            State::Futex => "futex",
            State::Io => "io",
            State::Sleep => "sleep",
            State::Throttled => "throttled",
        }
    }
}

/// Indexes of the `control` array (`enum ws_control`).
#[derive(Debug, Clone, Copy)]
#[repr(u32)]
pub enum Control {
    Buffer = 0,
    Generation = 1,
}

/// Key of the aggregation maps (`struct ws_stack_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct StackKey {
    pub pid: u32,
    pub tid: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    pub state: u32,
    pub stack_gen: u32,
    pub peer_pid: u32,
    pub peer_tid: u32,
    pub syscall: u32,
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
}

/// Per-thread totals (`struct ws_thread_totals`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct ThreadTotals {
    pub pid: u32,
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
    pub ns: [u64; State::COUNT],
    pub switches_voluntary: u64,
    pub switches_involuntary: u64,
    pub wakeups_sent: u64,
    pub wakeups_received: u64,
}

/// Flag of the tid of a process's merged row (`WS_MERGED_TID`): rows of
/// threads that found their buffer nearly full, tid `MERGED_TID | pid`.
pub const MERGED_TID: u32 = 0x8000_0000;

/// Whether `tid` is a process's merged row rather than a thread.
pub fn is_merged_tid(tid: u32) -> bool {
    tid & MERGED_TID != 0
}

/// Key of the runqueue histograms (`struct ws_hist_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct HistKey {
    pub id: u64,
    pub kind: u32,
    pub _pad: u32,
}

/// `enum ws_hist_kind`.
pub const HIST_PROCESS: u32 = 0;
/// `enum ws_hist_kind`.
pub const HIST_CGROUP: u32 = 1;
/// `enum ws_hist_kind`: a process's time throttled.
pub const HIST_PROCESS_THROTTLED: u32 = 2;
/// `enum ws_hist_kind`: a cgroup's time throttled.
pub const HIST_CGROUP_THROTTLED: u32 = 3;

/// A runqueue histogram (`struct ws_hist`): slot 0 under 1 us, slot i
/// (i > 0) [2^(i-1), 2^i) us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Hist {
    pub slots: [u64; HIST_SLOTS],
    /// Total time of the intervals counted.
    pub ns: u64,
}

/// Value of the aggregation maps (`struct ws_stack_value`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct StackValue {
    pub ns: u64,
    pub count: u64,
}

/// One stored stack (`struct ws_stack`): its id is the low 31 bits of `hash`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct StoredStack {
    pub hash: u64,
    /// Frames used in `ips`, innermost first.
    pub len: u32,
    pub _pad: u32,
    pub ips: [u64; MAX_STACK_DEPTH],
}

impl StoredStack {
    /// The captured frames.
    pub fn frames(&self) -> &[u64] {
        &self.ips[..(self.len as usize).min(MAX_STACK_DEPTH)]
    }
}

/// One unwind table row (`struct ws_unwind_row`); see `bpf/wallscope.h`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct UnwindRow {
    /// First address covered, as a virtual address of the module.
    pub pc: u32,
    pub cfa_off: i32,
    pub rbp_off: i16,
    /// `enum ws_cfa_reg`, see [`cfa`].
    pub cfa_reg: u8,
    /// `enum ws_rbp_rule`, see [`rbp`].
    pub rbp_rule: u8,
}

/// `enum ws_cfa_reg`.
pub mod cfa {
    pub const RSP: u8 = 0;
    pub const RBP: u8 = 1;
    pub const NONE: u8 = 2;
    pub const END: u8 = 3;
    pub const UNSUPPORTED: u8 = 4;
}

/// `enum ws_rbp_rule`.
pub mod rbp {
    pub const SAME: u8 = 0;
    pub const AT_CFA: u8 = 1;
    pub const UNSUPPORTED: u8 = 2;
}

/// An executable mapping with an unwind table (`struct ws_unwind_mapping`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct UnwindMapping {
    pub start: u64,
    pub end: u64,
    /// Runtime address minus module virtual address.
    pub bias: u64,
    /// The table's page index, then its rows (see `bpf/wallscope.h`).
    pub index_start: u32,
    pub row_count: u32,
    pub page_base: u32,
    pub page_count: u32,
}

/// A process's mappings with tables (`struct ws_unwind_proc`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct UnwindProc {
    pub count: u32,
    /// Changes at every registration, so BPF's cached lookups expire.
    pub epoch: u32,
    pub mappings: [UnwindMapping; UNWIND_MAX_MAPPINGS],
    /// A HotSpot JVM's interpreter code, `[start, end)`, or zeros.
    pub interp_start: u64,
    pub interp_end: u64,
}

/// `WS_JAVA_METHOD_TAG`: a user stack entry that is an interpreted Java
/// frame's `Method*`, not a pc.
pub const JAVA_METHOD_TAG: u64 = 1 << 62;

/// `WS_WALK_KINDS`: what a walk walked (see [`walk_kind`]).
pub const WALK_KINDS: usize = 4;
/// `WS_WALK_DEPTHS`: frames / 8, the last bucket holding deeper stacks.
pub const WALK_DEPTHS: usize = 16;
/// `WS_WALK_TIME_SLOTS`: 4 slots per power of two of nanoseconds.
pub const WALK_TIME_SLOTS: usize = 80;
/// Entries of [`WalkCost`].
pub const WALK_COST_ENTRIES: usize = WALK_KINDS * WALK_DEPTHS * WALK_TIME_SLOTS;

/// `enum ws_walk_kind`.
pub mod walk_kind {
    pub const USER_TABLES: usize = 0;
    pub const USER_FP: usize = 1;
    pub const KERNEL: usize = 2;
    pub const LIVE: usize = 3;
}

/// One CPU's walk-cost histogram (`struct ws_walk_cost`): walks by kind,
/// frames / 8 and time slot, counters that wrap.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct WalkCost {
    pub n: [u32; WALK_COST_ENTRIES],
}

const _: () = assert!(size_of::<WalkCost>() == 4 * WALK_COST_ENTRIES);

// SAFETY: plain-old-data, `repr(C)`, no padding the kernel does not also see.
unsafe impl aya::Pod for WalkCost {}
// SAFETY: as above.
unsafe impl aya::Pod for StoredStack {}
// SAFETY: as above.
unsafe impl aya::Pod for UnwindRow {}
// SAFETY: as above.
unsafe impl aya::Pod for UnwindProc {}
// SAFETY: as below.
unsafe impl aya::Pod for StackKey {}
// SAFETY: as above.
unsafe impl aya::Pod for StackValue {}
// SAFETY: as above.
unsafe impl aya::Pod for ThreadTotals {}
// SAFETY: as above.
unsafe impl aya::Pod for HistKey {}
// SAFETY: as above.
unsafe impl aya::Pod for Hist {}

const _: () = assert!(size_of::<StackKey>() == 56);
const _: () = assert!(size_of::<StackValue>() == 16);
const _: () = assert!(size_of::<StoredStack>() == 16 + 8 * MAX_STACK_DEPTH);
const _: () = assert!(size_of::<UnwindRow>() == 12);
const _: () = assert!(size_of::<UnwindMapping>() == 40);
const _: () = assert!(size_of::<UnwindProc>() == 24 + 40 * UNWIND_MAX_MAPPINGS);
const _: () = assert!(size_of::<ThreadTotals>() == 104);
const _: () = assert!(size_of::<HistKey>() == 16);
const _: () = assert!(size_of::<Hist>() == 8 * HIST_SLOTS + 8);
const _: () = assert!(size_of::<LiveThread>() == 72);

/// A thread off-CPU when the drain looked (`struct ws_live_thread`),
/// written by the `live_threads` task iterator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct LiveThread {
    pub pid: u32,
    pub tid: u32,
    /// `enum ws_state` of the current phase.
    pub state: u32,
    /// Syscall nr + 1 at switch-out, 0 if none.
    pub syscall: u32,
    /// Phase start, `CLOCK_MONOTONIC` ns.
    pub since_ns: u64,
    /// When the iterator looked, `CLOCK_MONOTONIC` ns.
    pub now_ns: u64,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    pub stack_gen: u32,
    /// Who woke it last: 0 if none seen, pid 0 + [`INTERRUPT_TID`] for an
    /// interrupt.
    pub waker_pid: u32,
    pub waker_tid: u32,
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
}

impl LiveThread {
    /// Reads one record from the iterator's output; `None` when too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<LiveThread> {
        if bytes.len() < size_of::<LiveThread>() {
            return None;
        }
        // SAFETY: long enough, and every bit pattern is a valid LiveThread.
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<LiveThread>()) })
    }
}

/// `enum ws_proc_event_kind`.
pub mod proc_event {
    pub const FORK: u32 = 0;
    pub const EXEC: u32 = 1;
    pub const EXIT: u32 = 2;
    pub const RENAME: u32 = 3;
}

/// A process lifecycle event from the `proc_events` ring buffer
/// (`struct ws_proc_event`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct ProcEvent {
    /// See [`proc_event`].
    pub kind: u32,
    pub pid: u32,
    /// Fork: the parent's tgid.
    pub parent: u32,
    pub _pad: u32,
    /// The process's start, ns since boot.
    pub start_ns: u64,
    /// When it happened, ns since boot.
    pub time_ns: u64,
    pub comm: [u8; COMM_LEN],
}

impl ProcEvent {
    /// Reads an event from ring-buffer bytes; `None` when too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<ProcEvent> {
        if bytes.len() < size_of::<ProcEvent>() {
            return None;
        }
        // SAFETY: long enough, and every bit pattern is a valid ProcEvent;
        // read_unaligned because ring-buffer records are only 8-aligned.
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ProcEvent>()) })
    }
}

const _: () = assert!(size_of::<ProcEvent>() == 48);

/// Indexes of the per-CPU `stats` array (`enum ws_stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Stat {
    Samples = 0,
    CountsFull = 1,
    UserStackCollision = 2,
    UserStackFailed = 3,
    KernelStackCollision = 4,
    KernelStackFailed = 5,
    Switches = 6,
    Wakeups = 7,
    StackExpired = 8,
    TaskStorageFailed = 9,
    ThreadsFull = 10,
    HistFull = 11,
    BelowThreshold = 12,
    StacksStored = 13,
    StackStoreFailed = 14,
    UnwindWalks = 15,
    UnwindNoInfo = 16,
    UnwindUnsupported = 17,
    UnwindReadFailed = 18,
    UnwindTruncated = 19,
    ProcEventsLost = 20,
    CountsMerged = 21,
    OffcpuWalks = 22,
    WakerWalks = 23,
    LiveWalks = 24,
    SampledOut = 25,
    DeferredLost = 26,
    LiveWalksPutOff = 27,
    WalksReused = 28,
}

impl Stat {
    /// Number of counters (`WS_STAT_COUNT`).
    pub const COUNT: usize = 29;
    /// Every counter, in enum order.
    pub const ALL: [Stat; Stat::COUNT] = [
        Stat::Samples,
        Stat::CountsFull,
        Stat::UserStackCollision,
        Stat::UserStackFailed,
        Stat::KernelStackCollision,
        Stat::KernelStackFailed,
        Stat::Switches,
        Stat::Wakeups,
        Stat::StackExpired,
        Stat::TaskStorageFailed,
        Stat::ThreadsFull,
        Stat::HistFull,
        Stat::BelowThreshold,
        Stat::StacksStored,
        Stat::StackStoreFailed,
        Stat::UnwindWalks,
        Stat::UnwindNoInfo,
        Stat::UnwindUnsupported,
        Stat::UnwindReadFailed,
        Stat::UnwindTruncated,
        Stat::ProcEventsLost,
        Stat::CountsMerged,
        Stat::OffcpuWalks,
        Stat::WakerWalks,
        Stat::LiveWalks,
        Stat::SampledOut,
        Stat::DeferredLost,
        Stat::LiveWalksPutOff,
        Stat::WalksReused,
    ];

    /// snake_case name used in `/healthz` and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Stat::Samples => "samples",
            Stat::CountsFull => "counts_map_full",
            Stat::UserStackCollision => "user_stack_collision",
            Stat::UserStackFailed => "user_stack_failed",
            Stat::KernelStackCollision => "kernel_stack_collision",
            Stat::KernelStackFailed => "kernel_stack_failed",
            Stat::Switches => "switches",
            Stat::Wakeups => "wakeups",
            Stat::StackExpired => "stack_expired",
            Stat::TaskStorageFailed => "task_storage_failed",
            Stat::ThreadsFull => "threads_map_full",
            Stat::HistFull => "histogram_map_full",
            Stat::BelowThreshold => "intervals_below_threshold",
            Stat::StacksStored => "stacks_stored",
            Stat::StackStoreFailed => "stack_store_failed",
            Stat::UnwindWalks => "unwind_walks",
            Stat::UnwindNoInfo => "unwind_no_info",
            Stat::UnwindUnsupported => "unwind_unsupported_rule",
            Stat::UnwindReadFailed => "unwind_read_failed",
            Stat::UnwindTruncated => "unwind_truncated",
            Stat::ProcEventsLost => "proc_events_lost",
            Stat::CountsMerged => "counts_merged",
            Stat::OffcpuWalks => "offcpu_stack_walks",
            Stat::WakerWalks => "waker_stack_walks",
            Stat::LiveWalks => "blocked_stack_walks",
            Stat::SampledOut => "intervals_sampled_out",
            Stat::DeferredLost => "deferred_stack_lost",
            Stat::LiveWalksPutOff => "blocked_stack_walks_put_off",
            Stat::WalksReused => "stack_walks_reused",
        }
    }

    /// Whether the counter counts something lost or degraded (as opposed
    /// to events seen).
    pub fn is_loss(self) -> bool {
        !matches!(
            self,
            Stat::Samples
                | Stat::CountsMerged
                | Stat::Switches
                | Stat::Wakeups
                | Stat::BelowThreshold
                | Stat::StacksStored
                | Stat::UnwindWalks
                | Stat::OffcpuWalks
                | Stat::WakerWalks
                | Stat::LiveWalks
                | Stat::LiveWalksPutOff
                | Stat::WalksReused
                | Stat::SampledOut
        )
    }
}

/// Names of the maps, programs and globals in the BPF object.
pub mod names {
    pub const COUNTS: [&str; 2] = ["counts_0", "counts_1"];
    pub const THREADS: [&str; 2] = ["threads_0", "threads_1"];
    pub const RUNQ_HIST: [&str; 2] = ["runq_hist_0", "runq_hist_1"];
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
    /// The switch-in hook, loaded where the kernel has the tracepoint.
    pub const SWITCH_IN_PROGRAM: (&str, &str) = ("on_switched_in", "sched_exit_tp");
    /// The drain-time task iterator.
    pub const LIVE_PROGRAM: &str = "live_threads";
    pub const UNWIND_TABLES: &str = "unwind_tables";
    pub const UNWIND_ROWS: &str = "unwind_rows";
    pub const UNWIND_PROCS: &str = "unwind_procs";
}

/// Reads a NUL-padded kernel name.
pub fn comm_str(comm: &[u8; COMM_LEN]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests;
