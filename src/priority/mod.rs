//! Thread priorities, in one place: which of the daemon's threads run
//! above the others and which below the profiled workloads.
//!
//! - [`raise`]: the collector runs ahead of everything (`SCHED_FIFO`, else
//!   nice -10, else every other thread niced), the symbolizer, the HTTP
//!   runtime and the pusher's builder above the workloads.
//! - [`crew`]: a query's threads compute at the workloads' nice, then below
//!   them once the query has used its grace of CPU.

pub mod crew;
pub mod raise;

/// The calling thread's id.
fn gettid() -> libc::id_t {
    // SAFETY: no preconditions.
    unsafe { libc::gettid() as libc::id_t }
}

/// Sets thread `tid`'s nice value; true on success.
fn set_nice(tid: libc::id_t, nice: libc::c_int) -> bool {
    // SAFETY: setpriority on a thread id; a thread gone is an error.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0 }
}
