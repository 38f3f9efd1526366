//! Reading another process's memory, for the JVM's own structures.
//!
//! `process_vm_readv` rather than `/proc/PID/mem`: no descriptor to keep
//! per process, and a read of unmapped memory fails instead of faulting.
//! Everything read this way is the target's to choose: callers bound every
//! size and loop by what a sane JVM holds, never by what they read.

use std::io;

/// Longest C string read (type and field names of the VM's tables, blob
/// names); longer ones are treated as not there.
pub const MAX_CSTR: usize = 256;

/// The memory of one process.
#[derive(Debug, Clone, Copy)]
pub struct Remote {
    pid: u32,
}

impl Remote {
    /// Memory of process `pid` (needs ptrace access to it: root here).
    pub fn new(pid: u32) -> Remote {
        Remote { pid }
    }

    /// Fills `buf` from `addr`; fails unless every byte could be read.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if addr == 0 || addr.checked_add(buf.len() as u64).is_none() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad address"));
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

    /// Writes one byte at `addr` (a VM flag; see [`super::flags`]).
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
