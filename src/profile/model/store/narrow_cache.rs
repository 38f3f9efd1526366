//! Slices of memory blocks narrowed to one process (see
//! [`super::Snapshot::narrowed`]), kept across queries: a dashboard or an
//! SRE's loop asking about one process every few seconds then decodes only
//! the blocks sealed (or merged) since its last answer. Blocks are never
//! changed once sealed, so a block's narrowed slice stays right as long as
//! the block lives; a merged or dropped block's entry is never met again
//! and leaves first-in, first-out.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, Weak},
};

use rustc_hash::FxHashMap;

use super::{super::Slice, sealed::Block};

/// Most the cache holds (estimated bytes of its slices).
pub const MAX_BYTES: usize = 16 << 20;

type Key = (u32, usize);

#[derive(Default)]
struct Inner {
    slices: FxHashMap<Key, (Weak<Block>, Arc<Slice>, usize)>,
    order: VecDeque<Key>,
    bytes: usize,
}

/// The cache, shared by the store's snapshots.
#[derive(Default)]
pub struct NarrowCache(Mutex<Inner>);

fn key(pid: u32, block: &Arc<Block>) -> Key {
    (pid, Arc::as_ptr(block) as usize)
}

impl NarrowCache {
    /// `block` narrowed to `pid`, if kept.
    pub fn get(&self, pid: u32, block: &Arc<Block>) -> Option<Arc<Slice>> {
        let inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (weak, slice, _) = inner.slices.get(&key(pid, block))?;
        // The address of a block dropped since may be another's now.
        weak.upgrade()
            .filter(|b| Arc::ptr_eq(b, block))
            .map(|_| slice.clone())
    }

    /// Keeps `slice` (`bytes` estimated) as `block` narrowed to `pid`,
    /// letting the oldest go to stay within [`MAX_BYTES`].
    pub fn put(&self, pid: u32, block: &Arc<Block>, slice: Arc<Slice>, bytes: usize) {
        if bytes > MAX_BYTES / 4 {
            return;
        }
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let k = key(pid, block);
        if let Some((_, _, old)) = inner
            .slices
            .insert(k, (Arc::downgrade(block), slice, bytes))
        {
            inner.bytes -= old;
        } else {
            inner.order.push_back(k);
        }
        inner.bytes += bytes;
        while inner.bytes > MAX_BYTES {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            if let Some((_, _, b)) = inner.slices.remove(&oldest) {
                inner.bytes -= b;
            }
        }
    }

    /// Estimated bytes held.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }
}
