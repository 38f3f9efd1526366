//! The threads raised above the others. The drain runs ahead of
//! everything else in the daemon: on a saturated host, symbolization,
//! queries and push may wait, the drain may not (the BPF maps fill up and
//! rows are lost if it is late).
//!
//! Three steps, the first that works is kept and reported in `/healthz`
//! `pipeline.drain_priority`:
//! 1. `fifo 1`: `SCHED_FIFO` at the lowest real-time priority for the
//!    collector thread alone, with a time cap: `RLIMIT_RTTIME` (CPU time a
//!    real-time thread may use without blocking) at [`RT_SOFT_US`] sends
//!    `SIGXCPU`, which only sets a flag here; the collector then leaves
//!    `SCHED_FIFO` for step 2 for good. The drain is a short bounded read
//!    and the collector sleeps between drains, so it never comes near the
//!    cap unless something is wrong. Needs CAP_SYS_NICE and a kernel or
//!    unit that allows real-time (`RestrictRealtime=yes` in the systemd
//!    unit forbids it: there step 2 applies).
//! 2. `nice -10`: needs CAP_SYS_NICE.
//! 3. `others niced`: without privilege a thread may only lower its own
//!    priority, so every other thread of the daemon goes to nice
//!    [`OTHERS_NICE`] (re-applied now and then for threads started since).

use std::sync::atomic::{AtomicBool, Ordering};

use super::{gettid, set_nice};

/// Real-time priority of the collector (the lowest: above every normal
/// thread, below any real-time work the host has).
pub const FIFO_PRIORITY: i32 = 1;
/// CPU time (µs) the collector may use at real-time priority without
/// blocking before it is told (`SIGXCPU`) and leaves real-time. A drain
/// of full maps with 10,000 threads on the host took over 200 ms (the
/// soak, on a host at load 300): a second means something is wrong.
pub const RT_SOFT_US: u64 = 1_000_000;
/// Past this the kernel kills the daemon (the hard cap; it cannot be
/// reached unless the soft cap's signal is not handled).
pub const RT_HARD_US: u64 = 5_000_000;
/// Nice of the collector when it cannot run at real-time priority.
pub const DRAIN_NICE: i32 = -10;
/// Nice of the other threads when the collector cannot be raised.
pub const OTHERS_NICE: i32 = 5;
/// Nice of the symbolizer, which must keep up with the drains or their
/// rows wait (bounded, then stripped of stacks): at nice 0 beside a hundred
/// runnable threads on two CPUs it got 4 % of a CPU (the soak), at -15 it
/// gets up to some 40 % when it wants it. Its work is bounded per batch.
pub const SYMBOLIZE_NICE: i32 = -15;
/// Nice of the HTTP runtime's threads, so that `/healthz` and `/metrics`
/// answer on a saturated host; queries leave it for the workloads' nice,
/// then [`QUERY_NICE`](super::crew::QUERY_NICE) (see
/// [`Crew`](super::crew::Crew)) while they run.
pub const API_NICE: i32 = -10;

/// Nice of the pusher's builder, which must finish an interval's profiles
/// within the interval: at nice 5 beside 41 spinning processes on two
/// CPUs it built 4 of 18 five-second intervals (the others merged into
/// longer ones). Its work is bounded by `--push-top`.
pub const PUSH_NICE: i32 = -10;

/// Set by the `SIGXCPU` handler: the real-time cap was reached.
static RT_CAPPED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_xcpu(_: libc::c_int) {
    RT_CAPPED.store(true, Ordering::SeqCst);
}

/// What was applied to the collector thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Fifo,
    Nice,
    OthersNiced,
}

impl Applied {
    /// As `/healthz` reports it.
    pub fn label(self) -> String {
        match self {
            Applied::Fifo => format!("fifo {FIFO_PRIORITY}"),
            Applied::Nice => format!("nice {DRAIN_NICE}"),
            Applied::OthersNiced => "others niced".into(),
        }
    }
}

fn try_fifo() -> bool {
    // SAFETY: a handler that only stores to an atomic is async-signal-safe.
    let handled = unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_xcpu as *const () as usize;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGXCPU, &act, std::ptr::null_mut()) == 0
    };
    let cap = libc::rlimit {
        rlim_cur: RT_SOFT_US,
        rlim_max: RT_HARD_US,
    };
    // SAFETY: plain system calls on this process and thread.
    unsafe {
        if !handled || libc::setrlimit(libc::RLIMIT_RTTIME, &cap) != 0 {
            return false;
        }
        let param = libc::sched_param {
            sched_priority: FIFO_PRIORITY,
        };
        libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0
    }
}

/// Raises the calling (collector) thread as far as allowed.
pub fn collector() -> Applied {
    if try_fifo() {
        return Applied::Fifo;
    }
    if set_nice(gettid(), DRAIN_NICE) {
        return Applied::Nice;
    }
    lower_others();
    Applied::OthersNiced
}

/// Raises the calling thread to `nice` (a worker the drain's data flows
/// through); needs CAP_SYS_NICE, without it the thread stays as it is.
pub fn worker(nice: i32) -> bool {
    set_nice(gettid(), nice)
}

/// Called after each drain: leaves real-time for good once the cap was
/// hit, and re-lowers threads started since when step 3 applies.
pub fn keep(applied: &mut Applied, drains: u64) {
    if *applied == Applied::Fifo && RT_CAPPED.load(Ordering::SeqCst) {
        tracing::warn!("the drain reached its real-time cap: leaving SCHED_FIFO");
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: plain system call on this thread.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
        *applied = if set_nice(gettid(), DRAIN_NICE) {
            Applied::Nice
        } else {
            lower_others();
            Applied::OthersNiced
        };
    }
    if *applied == Applied::OthersNiced && drains.is_multiple_of(10) {
        lower_others();
    }
}

/// Every other thread of the daemon to nice [`OTHERS_NICE`] (allowed
/// without privilege: raising a nice lowers a priority).
fn lower_others() {
    let me = gettid();
    for other in crate::process::own::task_ids() {
        if other != me {
            set_nice(other, OTHERS_NICE);
        }
    }
}
