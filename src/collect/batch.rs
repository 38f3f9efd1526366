//! Emptying a BPF hash map in a few system calls.
//!
//! aya reads a hash map one key at a time (next key, lookup, delete: three
//! system calls a row); with tens of thousands of rows a drain took most
//! of a second. `BPF_MAP_LOOKUP_AND_DELETE_BATCH` (Linux 5.6) moves
//! thousands of rows per call ([`crate::bpf::batch`]).

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
};

use aya::maps::{HashMap, IterableMap, MapData};

use crate::bpf::batch::{self, BatchAttr};

/// Rows asked for per call.
const ROWS_PER_CALL: usize = 4096;

/// Reads and deletes every row of `map`. Rows written while it runs are
/// either taken or left for the next call, never lost.
pub fn take_all<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
) -> io::Result<Vec<(K, V)>> {
    let fd = map.map().fd().as_fd().as_raw_fd();
    let mut rows = Vec::new();
    let mut keys: Vec<K> = Vec::with_capacity(ROWS_PER_CALL);
    let mut values: Vec<V> = Vec::with_capacity(ROWS_PER_CALL);
    // The kernel's cursor for hash maps is a bucket number (u32); room for
    // any cursor up to 8 bytes.
    let (mut cursor, mut next) = (0u64, 0u64);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &cursor as *const u64 as u64
            },
            out_batch: &mut next as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: keys.capacity().min(values.capacity()) as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at buffers of `count` keys and values of the
        // map's key and value sizes (the types aya checked at take time),
        // and at 8 bytes for each cursor; all outlive the call.
        let err = unsafe { batch::call(batch::MAP_LOOKUP_AND_DELETE_BATCH, &mut attr) }.err();
        let got = (attr.count as usize).min(keys.capacity());
        // SAFETY: the kernel filled `got` keys and values.
        unsafe {
            keys.set_len(got);
            values.set_len(got);
        }
        rows.extend(keys.drain(..).zip(values.drain(..)));
        match err {
            None => {}
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(rows),
            // One bucket holds more rows than asked for: ask for more.
            Some(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                keys.reserve(keys.capacity() * 2);
                values.reserve(values.capacity() * 2);
                continue;
            }
            Some(e) => return Err(e),
        }
        cursor = next;
        first = false;
    }
}
