//! The profile model: symbolized stacks with their time, in time slices,
//! and the store that keeps them. It knows nothing of the OS, the API or
//! how it is filled: the collector and symbolizer convert into it, the
//! reports in [`super::report`] read it.

pub mod block;
pub mod counters;
pub mod kind;
pub mod live;
pub mod prorate;
pub mod size;
pub mod spans;
pub mod spans_store;
pub mod state;
pub mod store;
pub mod window;

use std::{collections::HashMap, sync::Arc, time::SystemTime};

use crate::{
    process::container::Container,
    profile::model::state::{Hist, State, STAT_COUNTERS},
};

/// Whose runqueue latency a histogram holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HistOwner {
    Process(u32),
    Cgroup(u64),
    /// Time a process's threads spent throttled (not runqueue latency).
    ProcessThrottled(u32),
    /// Time a cgroup's threads spent throttled.
    CgroupThrottled(u64),
}

/// Counter deltas since the previous drain, [`state::STAT_COUNTERS`] of them
/// in the collector's order.
pub type StatDeltas = [u64; STAT_COUNTERS];

/// A frame name, interned: equal names share one allocation.
pub type Frame = Arc<str>;

/// Symbolized frames, outermost (e.g. `main`) first, kernel frames after
/// user frames. The process and thread are not part of it.
pub type Stack = Arc<[Frame]>;

/// The frame a runtime puts innermost on the stack of a thread waiting for
/// its global interpreter lock (CPython's GIL): what the GIL report looks
/// for.
pub const GIL_FRAME: &str = "[GIL]";

/// Time one thread spent in one state with one stack.
#[derive(Debug, Clone)]
pub struct Sample {
    pub pid: u32,
    pub tid: u32,
    pub state: State,
    pub stack: Stack,
    pub ns: u64,
    pub count: u64,
}

/// The context a wakeup raised in interrupt context ran in, told apart by
/// its kernel stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// A hardware interrupt handler (timer, device).
    Hard,
    /// A softirq (network receive, timers, block completion, tasklets).
    Soft,
}

impl Interrupt {
    /// The frame that stands for the waker in place of a process: an
    /// interrupt belongs to no process, whatever thread it interrupted.
    pub fn frame(self) -> &'static str {
        match self {
            Interrupt::Hard => "[irq]",
            Interrupt::Soft => "[softirq]",
        }
    }
}

/// Wakeups one thread (or an interrupt) sent to another, from one stack.
#[derive(Debug, Clone)]
pub struct Wakeup {
    /// The waker; pid 0 and [`crate::profile::model::state::INTERRUPT_TID`] when
    /// `interrupt` is set.
    pub pid: u32,
    pub tid: u32,
    /// Set when the wakeup was raised in interrupt context.
    pub interrupt: Option<Interrupt>,
    pub peer_pid: u32,
    pub peer_tid: u32,
    pub stack: Stack,
    /// How long the woken threads had been asleep.
    pub ns: u64,
    pub count: u64,
}

impl Wakeup {
    /// The process whose share of the store's bound the row counts in: the
    /// waker's, but an interrupt's row is the wakee's (an interrupt is no
    /// process, and a process of many sleeping threads brings its timers'
    /// rows with it).
    pub fn charged_to(&self) -> u32 {
        match self.interrupt {
            Some(_) => self.peer_pid,
            None => self.pid,
        }
    }
}

/// Names known for a thread during a slice.
#[derive(Debug, Clone)]
pub struct ThreadInfo {
    pub pid: u32,
    pub name: Arc<str>,
}

/// Time process `by` ran on the CPU thread `tid` (of `pid`) got, while
/// that thread waited in its runqueue: what kept it off the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptOff {
    pub pid: u32,
    pub tid: u32,
    /// A pid; 0 the idle task; [`KeptOff::UNSEEN`] the part of the wait
    /// no run of that CPU covered (the thread waited on another CPU);
    /// [`KeptOff::OTHERS`] processes not told apart.
    pub by: u32,
    pub ns: u64,
}

impl KeptOff {
    pub const UNSEEN: u32 = u32::MAX;
    /// The processes past the thread's first few in one drain (the BPF
    /// side keeps eight per thread between drains, and a few more per wait).
    pub const OTHERS: u32 = u32::MAX - 1;
}

/// The blocked intervals (switch-out to the wakeup that ended it) of one
/// thread, counted by length: slot 0 under 1 us, slot k in
/// [2^(k-1), 2^k) us, the last one longer (see `WS_SLEEP_SLOTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sleeps {
    pub pid: u32,
    pub tid: u32,
    pub slots: [u32; crate::profile::model::state::SLEEP_SLOTS],
}

/// A process's parent, cgroups and identity, for grouping processes and
/// finding them by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// The parent's pid (0: not known).
    pub parent: u32,
    /// The cgroup v2 path, when known.
    pub cgroup: Option<Arc<str>>,
    /// Its cgroup v1 paths, one per hierarchy, when known.
    pub cgroups_v1: Option<Arc<crate::process::cgroups::V1Paths>>,
    /// Its command line, executable and program, when known (shared with
    /// the process table's facts, and with the other slices).
    pub identity: Option<Arc<crate::process::identity::Identity>>,
}

/// Everything recorded during one drain interval.
#[derive(Debug, Clone)]
pub struct Slice {
    pub start: SystemTime,
    pub end: SystemTime,
    pub samples: Vec<Sample>,
    pub wakeups: Vec<Wakeup>,
    pub threads: HashMap<u32, ThreadInfo>,
    /// Exact per-thread time by state, switches and wakeups.
    pub thread_totals: Vec<counters::RawThread>,
    pub runq_hists: Vec<(HistOwner, Hist)>,
    /// Process names by pid.
    pub processes: HashMap<u32, Arc<str>>,
    /// The containers of the processes that run in one, by pid.
    pub containers: HashMap<u32, Arc<Container>>,
    /// Where each process came from (parent, cgroup), by pid.
    pub origins: HashMap<u32, Origin>,
    /// Who kept each thread that waited in a runqueue off the CPU.
    pub kept_off: Vec<KeptOff>,
    /// Blocked intervals that ended, per thread that had any.
    pub sleeps: Vec<Sleeps>,
    /// BPF loss counters for this interval.
    pub stats: StatDeltas,
    /// The OpenTelemetry spans its threads ran under.
    pub spans: spans::SpanSlice,
}

impl Slice {
    /// A slice of `start..end` with nothing in it.
    pub fn empty(start: SystemTime, end: SystemTime) -> Slice {
        Slice {
            start,
            end,
            samples: Vec::new(),
            wakeups: Vec::new(),
            threads: HashMap::new(),
            thread_totals: Vec::new(),
            runq_hists: Vec::new(),
            processes: HashMap::new(),
            containers: HashMap::new(),
            origins: HashMap::new(),
            kept_off: Vec::new(),
            sleeps: Vec::new(),
            stats: [0; crate::profile::model::state::STAT_COUNTERS],
            spans: spans::SpanSlice::default(),
        }
    }
}
