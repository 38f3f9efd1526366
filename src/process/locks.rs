//! Who holds the glibc mutex a blocked thread waits for: the kernel says
//! which futex word the thread sleeps on (`/proc/PID/task/TID/syscall`),
//! and glibc keeps a locked mutex's owner tid two words after that word
//! (`struct __pthread_mutex_s`: `__lock`, `__count`, `__owner`). Only a
//! wait that looks exactly like glibc's lock wait (`FUTEX_WAIT` for the
//! value 2, "locked, with waiters") is read, and only an owner that is a
//! live thread of the same process is believed, so a process cannot point
//! the daemon at anything but its own threads.

use std::{fs::File, os::unix::fs::FileExt, path::Path};

/// x86-64's `futex` syscall number.
const SYS_FUTEX: u64 = 202;
/// `FUTEX_WAIT`, without `FUTEX_PRIVATE_FLAG` (128) and the clock flag.
const FUTEX_WAIT: u64 = 0;
const FUTEX_CMD_MASK: u64 = 0x7f;
/// What glibc's `__lll_lock_wait` waits for: locked, with waiters.
const LOCKED_WITH_WAITERS: u64 = 2;

/// The tid holding the glibc mutex thread `tid` of `pid` is blocked on,
/// read now; `None` if it is not blocked in a mutex lock, or the owner is
/// not one of `pid`'s live threads.
pub fn mutex_owner(pid: u32, tid: u32) -> Option<u32> {
    let syscall = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    let word = lock_word(&syscall)?;
    // The kernel's file (it reads the process's memory as ptrace would):
    // no link or FIFO another user could put there.
    let mem = File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut mutex = [0u8; 12];
    mem.read_exact_at(&mut mutex, word).ok()?;
    let owner = owner_in(&mutex)?;
    (owner != tid && Path::new(&format!("/proc/{pid}/task/{owner}")).exists()).then_some(owner)
}

/// The futex word of a `syscall` file's line, if it is a lock wait.
fn lock_word(line: &str) -> Option<u64> {
    let mut fields = line.split_whitespace();
    let nr: u64 = fields.next()?.parse().ok()?;
    let hex = |f: Option<&str>| u64::from_str_radix(f?.strip_prefix("0x")?, 16).ok();
    let (word, op, value) = (
        hex(fields.next())?,
        hex(fields.next())?,
        hex(fields.next())?,
    );
    let is_lock_wait =
        nr == SYS_FUTEX && op & FUTEX_CMD_MASK == FUTEX_WAIT && value == LOCKED_WITH_WAITERS;
    (is_lock_wait && word % 4 == 0).then_some(word)
}

/// The owner tid of a locked mutex's first 12 bytes.
fn owner_in(mutex: &[u8; 12]) -> Option<u32> {
    let lock = u32::from_le_bytes(mutex[0..4].try_into().ok()?);
    let owner = i32::from_le_bytes(mutex[8..12].try_into().ok()?);
    (lock != 0 && owner > 0).then_some(owner as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_glibcs_lock_wait_is_read() {
        let lock = "202 0x7f00aa10 0x80 0x2 0x0 0x7f00aa10 0x0 0x7ffc 0x7f01";
        assert_eq!(lock_word(lock), Some(0x7f00_aa10));
        // A condition variable's wait (FUTEX_WAIT_BITSET), another value,
        // another syscall, a running thread, a misaligned word.
        assert_eq!(lock_word("202 0x7f00aa10 0x89 0x0 0x0"), None);
        assert_eq!(lock_word("202 0x7f00aa10 0x80 0x1 0x0"), None);
        assert_eq!(lock_word("7 0x7f00aa10 0x0 0x2 0x0"), None);
        assert_eq!(lock_word("running"), None);
        assert_eq!(lock_word("202 0x7f00aa11 0x80 0x2 0x0"), None);
    }

    #[test]
    fn a_locked_mutex_names_its_owner() {
        let mut m = [0u8; 12];
        m[0] = 2;
        m[8..12].copy_from_slice(&4242i32.to_le_bytes());
        assert_eq!(owner_in(&m), Some(4242));
        m[0] = 0;
        assert_eq!(owner_in(&m), None);
        m[0] = 2;
        m[8..12].copy_from_slice(&(-1i32).to_le_bytes());
        assert_eq!(owner_in(&m), None);
    }
}
