//! Writing a table's rows into the row array with one `bpf()` call
//! (`BPF_MAP_UPDATE_BATCH`) instead of one per row: libjvm's 190k rows
//! took about a second one by one, during which the registry did nothing
//! else.

use std::os::fd::{AsFd, AsRawFd};

use aya::maps::{Array, IterableMap, MapData};

use crate::bpf::{
    abi::UnwindRow,
    batch::{self, BatchAttr},
};

/// Writes `slots` at `start..` of `rows`, in one call where the kernel
/// supports it, else one row at a time.
pub(super) fn set_rows(
    rows: &mut Array<MapData, UnwindRow>,
    start: u32,
    slots: &[UnwindRow],
) -> Result<(), aya::maps::MapError> {
    let keys: Vec<u32> = (start..).take(slots.len()).collect();
    let fd = rows.map().fd().as_fd().as_raw_fd();
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: slots.as_ptr() as u64,
        count: slots.len() as u32,
        map_fd: fd as u32,
        ..BatchAttr::default()
    };
    // SAFETY: `attr` points at `keys` and `slots`, which live across the
    // call and hold `count` keys and values of the map's key and value
    // sizes (u32, and the 12-byte `UnwindRow` the map was created with).
    let result = unsafe { batch::call(batch::MAP_UPDATE_BATCH, &mut attr) };
    let Err(err) = result else {
        return Ok(());
    };
    // Older kernels: one by one (all of them: after an error, the count
    // the kernel wrote back, if any, is not worth trusting).
    tracing::debug!("batch write of unwind rows: {err}");
    for (i, slot) in slots.iter().enumerate() {
        rows.set(start + i as u32, slot, 0)?;
    }
    Ok(())
}
