//! Reading another process's memory (the JVM's and CPython's structures).
//!
//! `process_vm_readv` rather than `/proc/PID/mem`: no descriptor to keep
//! per process, and a read of unmapped memory fails instead of faulting.
//! Everything read this way is the target's to choose: callers bound every
//! size and loop by what a sane JVM holds, never by what they read.

use std::{
    io,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
};

/// Longest C string read (type and field names of the VM's tables, blob
/// names); longer ones are treated as not there.
pub const MAX_CSTR: usize = 256;

/// Reads allowed on one process's behalf: calls and bytes, each taken
/// before the read it pays for. Work done reading a process is its to
/// cause (a fake code heap can make every pc cost thousands of reads), so
/// each process gets its own and exhausting it degrades only its frames.
#[derive(Debug)]
pub struct Budget {
    calls: AtomicU64,
    bytes: AtomicU64,
    exhausted: AtomicBool,
}

impl Budget {
    /// `calls` reads of `bytes` bytes in all.
    pub fn new(calls: u64, bytes: u64) -> Arc<Budget> {
        Arc::new(Budget {
            calls: AtomicU64::new(calls),
            bytes: AtomicU64::new(bytes),
            exhausted: AtomicBool::new(false),
        })
    }

    /// Takes one call of `len` bytes; false (and exhausted from then on)
    /// when there is not that much left.
    fn take(&self, len: usize) -> bool {
        let take = |left: &AtomicU64, n: u64| {
            left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(n))
                .is_ok()
        };
        if self.exhausted() || !take(&self.calls, 1) || !take(&self.bytes, len as u64) {
            self.exhausted.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Whether a read was refused for want of budget.
    pub fn exhausted(&self) -> bool {
        self.exhausted.load(Ordering::Relaxed)
    }
}

/// The memory of one process, with the budget its reads are paid from.
#[derive(Debug, Clone)]
pub struct Remote {
    pid: u32,
    budget: Option<Arc<Budget>>,
}

impl Remote {
    /// Memory of process `pid` (needs ptrace access to it: root here),
    /// read without a budget: for callers that bound their reads.
    pub fn new(pid: u32) -> Remote {
        Remote { pid, budget: None }
    }

    /// Memory of process `pid`, read at most as `budget` allows.
    pub fn with_budget(pid: u32, budget: Arc<Budget>) -> Remote {
        Remote {
            pid,
            budget: Some(budget),
        }
    }

    /// The process read.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether its budget ran out.
    pub fn exhausted(&self) -> bool {
        self.budget.as_ref().is_some_and(|b| b.exhausted())
    }

    /// Fills `buf` from `addr`; fails unless every byte could be read, or
    /// when the budget does not allow the read.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if addr == 0 || addr.checked_add(buf.len() as u64).is_none() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad address"));
        }
        if self.budget.as_ref().is_some_and(|b| !b.take(buf.len())) {
            return Err(io::Error::other("read budget exhausted"));
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes `buf`, which outlives the call; the
        // remote side is only read by the kernel, on the target's behalf.
        let n = unsafe { libc::process_vm_readv(self.pid as i32, &local, 1, &remote, 1, 0) };
        match n {
            n if n < 0 => Err(io::Error::last_os_error()),
            n if n as usize == buf.len() => Ok(()),
            _ => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read")),
        }
    }

    /// Writes one byte at `addr` (a VM flag; see [`crate::jvm::flags`]).
    pub fn write_byte(&self, addr: u64, value: u8) -> io::Result<()> {
        let buf = [value];
        let local = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: 1,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: 1,
        };
        // SAFETY: `local` describes `buf`, which outlives the call.
        let n = unsafe { libc::process_vm_writev(self.pid as i32, &local, 1, &remote, 1, 0) };
        match n {
            1 => Ok(()),
            n if n < 0 => Err(io::Error::last_os_error()),
            _ => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short write")),
        }
    }

    /// `len` bytes at `addr`.
    pub fn bytes(&self, addr: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0; len];
        self.read(addr, &mut buf)?;
        Ok(buf)
    }

    /// The little-endian u64 at `addr`.
    pub fn u64(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// The NUL-terminated string at `addr`, at most [`MAX_CSTR`] bytes;
    /// `None` when it cannot be read, is longer, or is not UTF-8.
    pub fn cstr(&self, addr: u64) -> Option<String> {
        // Strings may end near the end of a mapping: read up to the page
        // end first, then the rest.
        let mut out = Vec::new();
        let mut at = addr;
        while out.len() < MAX_CSTR {
            let room = (4096 - (at % 4096) as usize).min(MAX_CSTR - out.len());
            let chunk = self.bytes(at, room).ok()?;
            if let Some(end) = chunk.iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..end]);
                return String::from_utf8(out).ok();
            }
            out.extend_from_slice(&chunk);
            at += room as u64;
        }
        None
    }
}

/// The unsigned little-endian integer of `width` bytes (1, 2, 4 or 8) at
/// `off` in `buf`; 0 outside it.
pub fn uint_at(buf: &[u8], off: usize, width: usize) -> u64 {
    let Some(b) = buf.get(off..off.saturating_add(width)) else {
        return 0;
    };
    match width {
        1 => u64::from(b[0]),
        2 => u64::from(u16::from_le_bytes([b[0], b[1]])),
        4 => u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        8 => u64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_refuses_bad_addresses() {
        let me = Remote::new(std::process::id());
        let value: u64 = 0x1122_3344_5566_7788;
        assert_eq!(me.u64(&value as *const u64 as u64).unwrap(), value);
        let text = b"nmethod\0";
        assert_eq!(me.cstr(text.as_ptr() as u64).as_deref(), Some("nmethod"));
        assert!(me.u64(0).is_err());
        assert!(me.u64(8).is_err());
        let long = vec![b'x'; MAX_CSTR + 10];
        assert_eq!(me.cstr(long.as_ptr() as u64), None);
    }

    #[test]
    fn a_budget_stops_reads_by_calls_and_by_bytes() {
        let value = [7u8; 64];
        let at = value.as_ptr() as u64;
        let me = Remote::with_budget(std::process::id(), Budget::new(3, 1 << 20));
        for _ in 0..3 {
            assert!(me.bytes(at, 8).is_ok());
        }
        assert!(me.bytes(at, 8).is_err());
        assert!(me.budget.as_ref().unwrap().exhausted());
        let me = Remote::with_budget(std::process::id(), Budget::new(100, 40));
        assert!(me.bytes(at, 32).is_ok());
        assert!(me.bytes(at, 16).is_err(), "40 bytes allowed, 48 asked");
        // Exhausted is for the rest of the batch, even for a small read.
        assert!(me.bytes(at, 1).is_err());
    }

    #[test]
    fn integers_of_each_width() {
        let buf = [1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(uint_at(&buf, 0, 1), 1);
        assert_eq!(uint_at(&buf, 0, 2), 0x0201);
        assert_eq!(uint_at(&buf, 4, 4), 0x0807_0605);
        assert_eq!(uint_at(&buf, 0, 8), 0x0807_0605_0403_0201);
        assert_eq!(uint_at(&buf, 6, 4), 0);
        assert_eq!(uint_at(&buf, 0, 3), 0);
    }
}
