//! A slice as the store keeps it: columnar rows compressed into a block
//! (see [`crate::profile::model::block`]), its stacks as indices into the
//! block's own list of the store's interned stacks. A block costs what
//! its rows compress to, not what they take decoded, and is decoded only
//! when a query reads it (or compaction merges it).

use std::{mem::size_of, time::SystemTime};

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::{size, Held};

use super::super::{
    block::{self, CodecError, StackIds, StackSource},
    Slice, Stack,
};

/// One sealed slice.
pub struct Block {
    pub start: SystemTime,
    pub end: SystemTime,
    /// Stack rows (samples and wakeups) it holds.
    pub rows: usize,
    bytes: Box<[u8]>,
    /// The distinct stacks its rows name, by index: each an `Arc` shared
    /// with the store's table (16 bytes here), so that equal stacks stay
    /// one allocation whichever block or query holds them.
    stacks: Box<[Stack]>,
}

/// The block's stacks, each given the next index the first time it is met.
#[derive(Default)]
struct LocalIds {
    index: FxHashMap<*const [super::super::Frame], u32>,
    stacks: Vec<Stack>,
}

impl StackIds for LocalIds {
    fn id_of(&mut self, stack: &Stack) -> u32 {
        let next = self.stacks.len() as u32;
        *self
            .index
            .entry(std::sync::Arc::as_ptr(stack))
            .or_insert_with(|| {
                self.stacks.push(stack.clone());
                next
            })
    }
}

struct Stacks<'a>(&'a [Stack]);

impl StackSource for Stacks<'_> {
    fn stack(&self, id: u32) -> Option<Stack> {
        self.0.get(id as usize).cloned()
    }
}

impl Block {
    /// Compresses `slice`, whose stacks the store has interned (equal
    /// stacks are one `Arc`).
    pub fn seal(slice: &Slice) -> Block {
        let mut ids = LocalIds::default();
        let bytes = block::encode(slice, &mut ids).into_boxed_slice();
        Block {
            start: slice.start,
            end: slice.end,
            rows: slice.samples.len() + slice.wakeups.len(),
            bytes,
            stacks: ids.stacks.into_boxed_slice(),
        }
    }

    /// The slice back, exactly as sealed: the rows `keep` keeps of it.
    pub fn open_keeping(&self, keep: block::Keep) -> Result<Slice, CodecError> {
        block::decode_keeping(&self.bytes, &Stacks(&self.stacks), keep)
    }

    /// Heap bytes it holds (the stacks themselves are the table's).
    pub fn bytes(&self) -> usize {
        size_of::<Block>() + self.bytes.len() + self.stacks.len() * size_of::<Stack>()
    }
}

impl Held {
    /// `slice` sealed; each process's share of the block by its rows'
    /// share of the decoded slice, plus what it `brought`.
    pub(super) fn seal(
        slice: &Slice,
        brought: FxHashMap<u32, usize>,
        step_s: u32,
        folded: super::merge::FoldedPids,
    ) -> Held {
        let block = Block::seal(slice);
        let bytes = size::ARC_HEADER + block.bytes();
        let rows = size::bytes_by_pid(slice);
        let raw = rows.values().sum::<usize>().max(1);
        let mut by_pid = brought.clone();
        for (pid, b) in rows {
            *by_pid.entry(pid).or_default() += b * bytes / raw;
        }
        Held {
            block: Arc::new(block),
            bytes,
            by_pid,
            brought,
            step_s,
            folded,
        }
    }
}

/// `block` decoded (see [`Store::open`]).
pub(super) fn open_block(block: &Block) -> Slice {
    open_block_keeping(block, block::Keep::All)
}

/// The rows `keep` keeps of `block`, decoded.
pub(super) fn open_block_keeping(block: &Block, keep: block::Keep) -> Slice {
    block.open_keeping(keep).unwrap_or_else(|e| {
        tracing::error!("a block of the store did not decode ({e}): its span reads as empty");
        Slice::empty(block.start, block.end)
    })
}
