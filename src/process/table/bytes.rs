//! What the process table holds, in bytes, for the `process_table` holder
//! of `/healthz` `memory`.

use std::sync::Arc;

use super::{Image, Inner, ProcMaps, MAX_IMAGES};

/// Bytes of an image, its mappings aside.
fn image_bytes(image: &Image) -> usize {
    std::mem::size_of::<Image>()
        + 16
        + image.name.len()
        + image.cgroup.as_ref().map_or(0, |c| c.len())
}

/// Bytes of a mapping list.
fn maps_bytes(maps: &ProcMaps) -> usize {
    maps.iter()
        .map(|m| std::mem::size_of::<super::super::maps::Mapping>() + m.backing.text_len())
        .sum()
}

/// The table's bound: [`MAX_IMAGES`] images of at most
/// [`super::super::maps::MAX_MAPPINGS`] mappings (names cut to 16 bytes, paths
/// to `PATH_MAX`), each with a cgroup path of at most `PATH_MAX`.
pub(super) fn max_bytes() -> usize {
    MAX_IMAGES
        * (std::mem::size_of::<Image>()
            + 32
            + crate::process::cgroups::MAX_PATH
            + super::super::maps::MAX_MAPPINGS
                * (std::mem::size_of::<super::super::maps::Mapping>() + 4096))
}

impl Inner {
    /// Bytes the images hold, a mapping list shared by images (a fork's)
    /// counted once in all.
    pub(super) fn bytes(&self) -> usize {
        let images = self.pids.values().flatten();
        let shared = |i: &Arc<Image>| {
            maps_bytes(&i.maps) / Arc::strong_count(&i.maps).max(1) + image_bytes(i)
        };
        images.map(shared).sum::<usize>()
            + self.pids.capacity() * std::mem::size_of::<(u32, Vec<Arc<Image>>)>()
    }
}
