//! Estimates of what the store's data costs in memory, computed once per
//! slice or stack when it enters the store (never by walking the store).
//!
//! The figures count the heap blocks the store owns: vectors and hash
//! tables by capacity, strings by capacity, `Arc` headers. Frame and thread
//! names are interned by the symbolizer and counted there
//! (`frame_name_bytes`), so a stack costs its array of pointers, not its
//! text. Allocator overhead is not counted: the estimate is a lower bound
//! of the resident memory, within a few tens of percent.

use std::{collections::HashMap, mem::size_of};

use super::{Frame, Sample, Slice, Stack, Wakeup};
use crate::{
    bpf::abi::Hist,
    collect::{HistOwner, RawThread},
};

/// Two reference counts ahead of every `Arc` allocation.
const ARC_HEADER: usize = 2 * size_of::<usize>();

/// A hash table of `capacity` entries of `T` (hashbrown: one control byte
/// per bucket, ~8/7 buckets per entry).
fn table<T>(capacity: usize) -> usize {
    capacity * (size_of::<T>() + 1) * 8 / 7
}

fn map<K, V>(m: &HashMap<K, V>) -> usize {
    table::<(K, V)>(m.capacity())
}

/// Bytes of one slice apart from the stacks it shares with the table.
pub fn slice_bytes(s: &Slice) -> usize {
    ARC_HEADER
        + size_of::<Slice>()
        + s.samples.capacity() * size_of::<Sample>()
        + s.wakeups.capacity() * size_of::<Wakeup>()
        + map(&s.threads)
        + s.thread_totals.capacity() * size_of::<RawThread>()
        + s.thread_totals
            .iter()
            .map(|t| t.comm.capacity())
            .sum::<usize>()
        + s.runq_hists.capacity() * size_of::<(HistOwner, Hist)>()
        + map(&s.processes)
}

/// Bytes of one distinct stack held in the store's stack table: its array
/// of frame pointers and its slot in the table.
pub fn stack_bytes(stack: &Stack) -> usize {
    ARC_HEADER + stack.len() * size_of::<Frame>() + table::<Stack>(1)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn deeper_stacks_cost_more() {
        let frames = |n: usize| -> Stack { (0..n).map(|i| Frame::from(i.to_string())).collect() };
        assert!(stack_bytes(&frames(10)) > stack_bytes(&frames(2)));
        assert_eq!(
            stack_bytes(&frames(3)) - stack_bytes(&frames(2)),
            size_of::<Arc<str>>()
        );
    }
}
