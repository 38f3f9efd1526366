//! Names of the x86-64 syscalls, used as the kernel-side frame of off-CPU
//! stacks that carry no kernel stack and in the live view of blocked
//! threads.

/// `[syscall NAME]` (or `[syscall NR]` for one not listed).
pub fn frame(nr: u32) -> String {
    match name(nr) {
        Some(name) => format!("[syscall {name}]"),
        None => format!("[syscall {nr}]"),
    }
}

/// The syscall's name, from the `syscalls` crate's x86-64 table (the
/// numbers the BPF programs read are x86-64's).
pub fn name(nr: u32) -> Option<&'static str> {
    syscalls::x86_64::Sysno::new(nr as usize).map(|s| s.name())
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_known_syscalls_and_numbers_the_rest() {
        assert_eq!(super::frame(202), "[syscall futex]");
        assert_eq!(super::frame(230), "[syscall clock_nanosleep]");
        // The ones the issue found shown as numbers (#28): every syscall
        // is named, not only the common blocking ones.
        assert_eq!(super::frame(56), "[syscall clone]");
        assert_eq!(super::frame(130), "[syscall rt_sigsuspend]");
        assert_eq!(super::frame(435), "[syscall clone3]");
        assert_eq!(super::frame(999), "[syscall 999]");
    }
}
