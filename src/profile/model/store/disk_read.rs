//! Blocks of the disk history back into slices for a query. Equal stacks
//! of different blocks are made one `Arc` (reports fold rows by a stack's
//! address, as the store interns its own).

use rustc_hash::FxHashSet;

use crate::profile::{
    history::{History, StoredBlock},
    model::{block, Slice, Stack},
};

/// The stacks of one query's disk blocks, each once.
#[derive(Default)]
pub struct Interner(FxHashSet<Stack>);

impl Interner {
    /// Makes the stacks of `slice`'s rows the ones already met.
    pub fn intern_slice(&mut self, slice: &mut Slice) {
        for s in &mut slice.samples {
            self.intern(&mut s.stack);
        }
        for w in &mut slice.wakeups {
            self.intern(&mut w.stack);
        }
    }

    fn intern(&mut self, stack: &mut Stack) {
        match self.0.get(&*stack) {
            Some(shared) => *stack = shared.clone(),
            None => {
                self.0.insert(stack.clone());
            }
        }
    }
}

/// The slice `stored` holds; `None` (counted by the history, or logged)
/// when it cannot be read or decoded: a query reads around a damaged
/// block.
pub fn slice_of(
    history: &History,
    stored: &StoredBlock,
    stacks: &mut Interner,
    keep: block::Keep,
) -> Option<Slice> {
    let bytes = history.read(stored).ok()?;
    let mut slice = match block::decode_standalone_keeping(&bytes, keep) {
        Ok(slice) => slice,
        Err(e) => {
            tracing::warn!("a block of the disk history did not decode ({e}): left out");
            return None;
        }
    };
    stacks.intern_slice(&mut slice);
    Some(slice)
}
