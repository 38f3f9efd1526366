//! What the process table holds, in bytes, for the `process_table` holder
//! of `/healthz` `memory`.

use std::sync::Arc;

use super::{Image, Inner, ProcMaps};

/// Bytes of an image, its mappings aside.
fn image_bytes(image: &Image) -> usize {
    std::mem::size_of::<Image>()
        + 16
        + image.name.len()
        + image.cgroup.as_ref().map_or(0, |c| c.len())
        + image.cgroups_v1.as_ref().map_or(0, |c| c.bytes())
        + image.facts.as_ref().map_or(0, |f| f.bytes())
}

/// Bytes of a mapping list.
fn maps_bytes(maps: &ProcMaps) -> usize {
    maps.iter()
        .map(|m| std::mem::size_of::<super::super::maps::Mapping>() + m.backing.text_len())
        .sum()
}

/// The table's bound: the budget's `process_table` part. An image's maps
/// may run to [`super::super::maps::MAX_MAPPINGS`] mappings with paths of
/// `PATH_MAX` each, so the count of images alone ([`super::MAX_IMAGES`]) does not
/// bound the bytes: images are evicted past this too.
pub(super) fn max_bytes() -> usize {
    crate::budget::bytes(crate::budget::Part::ProcessTable)
}

/// What dropping `image` frees, its mapping list shared with others
/// (a fork's) counted by share.
pub(super) fn of_image(image: &Arc<Image>) -> usize {
    maps_bytes(&image.maps) / Arc::strong_count(&image.maps).max(1) + image_bytes(image)
}

impl Inner {
    /// Bytes the images hold, a mapping list shared by images (a fork's)
    /// counted once in all.
    pub(super) fn bytes(&self) -> usize {
        let images = self.pids.values().flatten();
        images.map(of_image).sum::<usize>()
            + self.pids.capacity() * std::mem::size_of::<(u32, Vec<Arc<Image>>)>()
    }

    /// Evicts images until `more` bytes fit within [`max_bytes`].
    pub(super) fn make_room(&mut self, more: usize) {
        while self.bytes + more > max_bytes() && self.evict() {}
    }
}
