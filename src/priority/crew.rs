//! A query's threads: they compute at the workloads' own nice until the
//! query has used [`QUERY_GRACE`] of CPU, then at [`QUERY_NICE`].

use std::{
    cell::RefCell,
    sync::{Arc, Mutex},
    time::Duration,
};

use super::{gettid, set_nice};

/// Nice value of a query's threads once it has computed for
/// [`QUERY_GRACE`].
pub const QUERY_NICE: libc::c_int = 5;

/// The profiled workloads' usual nice value, a query's until its grace is
/// spent.
const WORKLOAD_NICE: libc::c_int = 0;

/// CPU a query computes with at the workloads' own priority before it
/// yields to them at [`QUERY_NICE`]: an SRE's `/threads?pid=` during an
/// incident (10-30 ms) answers at once on a loaded host, where at nice 5
/// behind ten runnable threads a CPU it waited a second; a flame graph
/// over an hour of disk history still yields after this much.
pub const QUERY_GRACE: Duration = Duration::from_millis(50);

/// The threads computing one query (its own, and the workers it starts):
/// their summed CPU decides when they all move to [`QUERY_NICE`]. The
/// one place priority flows back from a query's progress to its threads.
#[derive(Clone, Default)]
pub struct Crew(Arc<Mutex<CrewState>>);

#[derive(Default)]
struct CrewState {
    members: Vec<Member>,
    /// CPU of members that left.
    spent: Duration,
    demoted: bool,
}

struct Member {
    tid: libc::id_t,
    clock: libc::clockid_t,
    /// Its nice value before it joined, when that was changed.
    before: Option<libc::c_int>,
}

thread_local! {
    static CREW: RefCell<Option<Crew>> = const { RefCell::new(None) };
}

/// This thread's membership of a [`Crew`], until dropped.
pub struct Membership(Crew);

impl Crew {
    /// The crew this thread computes for, if any.
    pub fn current() -> Option<Crew> {
        CREW.with(|c| c.borrow().clone())
    }

    /// Makes this thread a member until the membership drops: at the
    /// workloads' nice (0: the API's threads run below it), or at
    /// [`QUERY_NICE`] once the crew is demoted; its own nice value back
    /// when it leaves.
    pub fn join(&self) -> Membership {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: pthread_self is this live thread; clock is written.
        let found = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0;
        let mut state = self.lock();
        let mut member = Member {
            tid: gettid(),
            clock,
            before: None,
        };
        let nice = if state.demoted {
            QUERY_NICE
        } else {
            WORKLOAD_NICE
        };
        member.before = nice_at_least(member.tid, nice);
        if found {
            state.members.push(member);
        }
        drop(state);
        CREW.with(|c| *c.borrow_mut() = Some(self.clone()));
        Membership(self.clone())
    }

    /// CPU its members have used (those that left included).
    pub fn cpu(&self) -> Duration {
        let state = self.lock();
        state.spent
            + state
                .members
                .iter()
                .map(|m| cpu_of(m.clock))
                .sum::<Duration>()
    }

    /// Moves every member, and every later one, to [`QUERY_NICE`].
    pub fn demote(&self) {
        let mut state = self.lock();
        state.demoted = true;
        for m in state.members.iter_mut() {
            let before = nice_at_least(m.tid, QUERY_NICE);
            m.before = m.before.or(before);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CrewState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        CREW.with(|c| *c.borrow_mut() = None);
        let tid = gettid();
        let mut state = self.0.lock();
        if let Some(i) = state.members.iter().position(|m| m.tid == tid) {
            let m = state.members.swap_remove(i);
            state.spent += cpu_of(m.clock);
            if let Some(before) = m.before {
                // Lowering it back needs CAP_SYS_NICE, which the daemon
                // (root) has; without it the thread stays niced: safe.
                set_nice(tid, before);
            }
        }
    }
}

/// CPU used by the thread of `clock` (zero if it cannot be read).
fn cpu_of(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is written; a clock of a thread gone is an error.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Raises thread `tid`'s nice value to `nice` (never lowers it): the value
/// before, when it was raised.
fn nice_at_least(tid: libc::id_t, nice: libc::c_int) -> Option<libc::c_int> {
    // SAFETY: a plain syscall; errno is checked because -1 is also a valid
    // nice value.
    let before = unsafe {
        *libc::__errno_location() = 0;
        let before = libc::getpriority(libc::PRIO_PROCESS, tid);
        if *libc::__errno_location() != 0 {
            return None;
        }
        before
    };
    (before < nice && set_nice(tid, nice)).then_some(before)
}
