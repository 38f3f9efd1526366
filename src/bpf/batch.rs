//! The `bpf(2)` batch commands (Linux 5.6), which aya 0.14 lacks: one call
//! moves thousands of map entries where aya makes one to three per entry.

use std::io;

/// `BPF_MAP_LOOKUP_AND_DELETE_BATCH` (`enum bpf_cmd`).
pub const MAP_LOOKUP_AND_DELETE_BATCH: libc::c_long = 25;
/// `BPF_MAP_UPDATE_BATCH` (`enum bpf_cmd`).
pub const MAP_UPDATE_BATCH: libc::c_long = 26;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct BatchAttr {
    /// Cursor to start from (address of it; 0: from the start).
    pub in_batch: u64,
    /// Where the kernel writes the cursor to continue from.
    pub out_batch: u64,
    /// Address of `count` keys.
    pub keys: u64,
    /// Address of `count` values.
    pub values: u64,
    /// Entries in the buffers; the kernel writes back how many it handled.
    pub count: u32,
    pub map_fd: u32,
    pub elem_flags: u64,
    pub flags: u64,
}

/// Runs batch command `cmd`.
///
/// # Safety
/// `attr` must point at live buffers of `count` keys and values of the
/// map's key and value sizes (and at 8-byte cursors where set), which the
/// kernel may read or write during the call.
pub unsafe fn call(cmd: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: as the caller promised.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
