//! The model's own vocabulary for thread time: the states time is spent
//! in, the histograms of waits, the counter array, and the thread ids that
//! stand for something other than a thread. The collector converts the BPF
//! contract's types into these, once (`collect::convert`); values and
//! order are those of the contract, so stored blocks keep their bytes.

/// Where a thread's time went. Stored in blocks by value: the order and
/// values never change.
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
    /// Number of states.
    pub const COUNT: usize = 6;
    /// Every state, in value order.
    pub const ALL: [State; State::COUNT] = [
        State::Cpu,
        State::Runqueue,
        State::Futex,
        State::Io,
        State::Sleep,
        State::Throttled,
    ];

    /// Decodes a stored value.
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

// `from_raw` indexes ALL by value: the states are 0..COUNT in order.
const _: () = {
    let mut i = 0;
    while i < State::COUNT {
        assert!(State::ALL[i] as usize == i);
        i += 1;
    }
};

/// log2 microsecond buckets of a [`Hist`].
pub const HIST_SLOTS: usize = 32;

/// A histogram of wait lengths: slot 0 under 1 us, slot i (i > 0)
/// [2^(i-1), 2^i) us; `ns` the total time of the intervals counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hist {
    pub slots: [u64; HIST_SLOTS],
    pub ns: u64,
}

/// Slots of a thread's blocked intervals ([`super::Sleeps`]).
pub const SLEEP_SLOTS: usize = 24;

/// Counters of the collector's health per drain ([`super::StatDeltas`]),
/// in the order the daemon names them.
pub const STAT_COUNTERS: usize = 48;

/// Tid of the waker of a wakeup raised in interrupt context (pid 0):
/// never the interrupted thread.
pub const INTERRUPT_TID: u32 = 1 << 30;

/// Flag of the tid of a process's merged row: the rows of threads whose
/// buffer was nearly full, tid `MERGED_TID | pid`.
pub const MERGED_TID: u32 = 1 << 31;

/// Whether `tid` is a process's merged row rather than a thread.
pub fn is_merged_tid(tid: u32) -> bool {
    tid & MERGED_TID != 0
}
