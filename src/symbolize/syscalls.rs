//! Names of the x86-64 syscalls that threads commonly block in, used as the
//! kernel-side frame of off-CPU stacks that carry no kernel stack and in
//! the live view of blocked threads.

/// `[syscall NAME]` (or `[syscall NR]` for one not listed).
pub fn frame(nr: u32) -> String {
    match name(nr) {
        Some(name) => format!("[syscall {name}]"),
        None => format!("[syscall {nr}]"),
    }
}

/// The syscall's name, if it is one threads commonly block in.
pub fn name(nr: u32) -> Option<&'static str> {
    Some(match nr {
        0 => "read",
        1 => "write",
        7 => "poll",
        17 => "pread64",
        18 => "pwrite64",
        19 => "readv",
        20 => "writev",
        23 => "select",
        24 => "sched_yield",
        34 => "pause",
        35 => "nanosleep",
        43 => "accept",
        44 => "sendto",
        45 => "recvfrom",
        46 => "sendmsg",
        47 => "recvmsg",
        61 => "wait4",
        74 => "fsync",
        75 => "fdatasync",
        202 => "futex",
        228 => "clock_gettime",
        230 => "clock_nanosleep",
        232 => "epoll_wait",
        247 => "waitid",
        270 => "pselect6",
        271 => "ppoll",
        281 => "epoll_pwait",
        288 => "accept4",
        295 => "preadv",
        296 => "pwritev",
        299 => "recvmmsg",
        307 => "sendmmsg",
        426 => "io_uring_enter",
        441 => "epoll_pwait2",
        449 => "futex_waitv",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_known_syscalls_and_numbers_the_rest() {
        assert_eq!(super::frame(202), "[syscall futex]");
        assert_eq!(super::frame(230), "[syscall clock_nanosleep]");
        assert_eq!(super::frame(999), "[syscall 999]");
    }
}
