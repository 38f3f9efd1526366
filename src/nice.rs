//! A thread's nice value, raised for a while: queries and the pusher's
//! rounds run below the profiled workloads and the daemon's pipeline.

/// Nice value of a thread while it runs a query.
pub const QUERY_NICE: libc::c_int = 5;

/// This thread's nice value, raised for a while: the pool's threads run
/// other work after, so it is restored when dropped.
pub struct Nice(Option<libc::c_int>);

impl Nice {
    /// Raises this thread's nice value to `nice` (never lowers it) until
    /// dropped.
    pub fn set(nice: libc::c_int) -> Nice {
        // SAFETY: plain syscalls on this thread; errno is checked because
        // -1 is also a valid nice value.
        unsafe {
            let tid = libc::gettid() as libc::id_t;
            *libc::__errno_location() = 0;
            let before = libc::getpriority(libc::PRIO_PROCESS, tid);
            if *libc::__errno_location() != 0 || before >= nice {
                return Nice(None);
            }
            let set = libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0;
            Nice(set.then_some(before))
        }
    }
}

impl Drop for Nice {
    fn drop(&mut self) {
        if let Some(before) = self.0 {
            // Lowering it back needs CAP_SYS_NICE, which the daemon (root)
            // has; without it the thread stays at QUERY_NICE, which is safe.
            // SAFETY: as in `Nice::set`.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, before);
            }
        }
    }
}
