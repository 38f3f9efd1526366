//! The stacks a block's rows refer to: a table of the block's distinct
//! stacks, which rows index. In memory it holds ids into the store's
//! interned table; standalone (on disk) it holds the frames' names and each
//! stack as frame indices, sharing its outer frames with the stack before.

use std::{mem::size_of, sync::Arc};

use rustc_hash::FxHashMap;

use super::{
    columns::{finish_all, put_columns, Budget, Col, Reader},
    names::{count, Names, Strings},
    CodecError, StackIds, StackSource,
};
use crate::profile::model::{Frame, Slice, Stack};

type Result<T> = std::result::Result<T, CodecError>;

/// Most frames a decoded stack may have (BPF keeps 127 native frames; the
/// rest is room for interpreted and synthetic ones): bounds the scratch
/// space of a hostile block.
const MAX_FRAMES: usize = 1 << 14;

/// A stack's allocation: rows of the store share one per distinct stack.
fn key(s: &Stack) -> usize {
    Arc::as_ptr(s) as *const Frame as usize
}

/// Each row's index into the block's stack table.
pub struct Table {
    by_ptr: FxHashMap<usize, u64>,
}

impl Table {
    pub fn local(&self, s: &Stack) -> u64 {
        // Every stack of the slice was entered by `distinct`.
        self.by_ptr.get(&key(s)).copied().unwrap_or(0)
    }
}

/// The slice's distinct stack allocations, by first use.
fn distinct(s: &Slice) -> Vec<&Stack> {
    let mut seen = rustc_hash::FxHashSet::default();
    let samples = s.samples.iter().map(|r| &r.stack);
    let wakeups = s.wakeups.iter().map(|r| &r.stack);
    samples
        .chain(wakeups)
        .filter(|st| seen.insert(key(st)))
        .collect()
}

/// The table of an in-memory block: `id_of` once per distinct stack
/// allocation; returns the distinct ids, sorted (a table slot each).
pub fn by_ids(s: &Slice, ids: &mut dyn StackIds) -> (Table, Vec<u32>) {
    let stacks = distinct(s);
    let got: Vec<u32> = stacks.iter().map(|st| ids.id_of(st)).collect();
    let mut sorted = got.clone();
    sorted.sort_unstable();
    sorted.dedup();
    let by_ptr = stacks
        .iter()
        .zip(got)
        .map(|(st, id)| (key(st), sorted.partition_point(|&x| x < id) as u64))
        .collect();
    (Table { by_ptr }, sorted)
}

/// Sorted ids as deltas (the header's list).
pub fn put_ids(ids: &[u32], out: &mut Col) {
    out.u64(ids.len() as u64);
    let mut prev = 0;
    for &id in ids {
        out.u64(u64::from(id - prev));
        prev = id;
    }
}

/// Reads back what [`put_ids`] wrote: strictly increasing ids.
pub fn get_ids(r: &mut Reader, budget: &mut Budget) -> Result<Vec<u32>> {
    let n = count(r.u64()?)?;
    let mut ids: Vec<u32> = budget.vec(n, r)?;
    let mut prev = 0u32;
    for i in 0..n {
        let delta = r.u32()?;
        if i > 0 && delta == 0 {
            return Err(CodecError::Corrupt("stack ids not increasing"));
        }
        prev = prev
            .checked_add(delta)
            .ok_or(CodecError::Corrupt("stack id over u32"))?;
        ids.push(prev);
    }
    Ok(ids)
}

/// The stacks of the ids, from the store's table.
pub fn resolve(ids: &[u32], source: &dyn StackSource, budget: &mut Budget) -> Result<Vec<Stack>> {
    budget.charge(ids.len() * size_of::<Stack>())?;
    ids.iter()
        .map(|&id| source.stack(id).ok_or(CodecError::UnknownStack(id)))
        .collect()
}

/// The table of a standalone block, its frames' names entered in
/// `frames`: returns the table, the number of distinct stacks and the
/// section to write after the frames.
pub fn standalone<'s>(s: &'s Slice, frames: &mut Strings<'s>) -> (Table, usize, Col) {
    let mut stacks = distinct(s);
    // Sorted by their frames, neighbours share their outer frames.
    stacks.sort_by(|a, b| a.iter().map(|f| &**f).cmp(b.iter().map(|f| &**f)));
    let same = |a: &Frame, b: &Frame| Arc::ptr_eq(a, b) || a == b;
    let mut cols: [Col; 3] = Default::default();
    let (mut by_ptr, mut n, mut prev) = (FxHashMap::default(), 0u64, None::<&Stack>);
    for st in stacks {
        let shared = prev.map_or(0, |p| {
            p.iter()
                .zip(st.iter())
                .take_while(|(a, b)| same(a, b))
                .count()
        });
        if prev.is_some_and(|p| shared == p.len() && shared == st.len()) {
            by_ptr.insert(key(st), n - 1);
            continue;
        }
        let [prefix, suffix, names] = &mut cols;
        prefix.u64(shared as u64);
        suffix.u64((st.len() - shared) as u64);
        for f in &st[shared..] {
            names.u64(frames.id(f));
        }
        by_ptr.insert(key(st), n);
        (n, prev) = (n + 1, Some(st));
    }
    let mut out = Col::default();
    put_columns(&mut out, &cols);
    (Table { by_ptr }, n as usize, out)
}

/// Reads back the `n` stacks [`standalone`] wrote.
pub fn get_standalone(
    r: &mut Reader,
    n: usize,
    frames: &Names,
    budget: &mut Budget,
) -> Result<Vec<Stack>> {
    let [mut prefix, mut suffix, mut names] = r.columns()?;
    let mut out: Vec<Stack> = budget.vec(n, &prefix)?;
    let mut scratch: Vec<Frame> = Vec::new();
    for _ in 0..n {
        let shared = count(prefix.u64()?)?;
        let more = count(suffix.u64()?)?;
        if shared > scratch.len() || more > MAX_FRAMES.saturating_sub(shared) {
            return Err(CodecError::Corrupt("stack length"));
        }
        budget.charge(2 * size_of::<usize>() + (shared + more) * size_of::<Frame>())?;
        scratch.truncate(shared);
        for _ in 0..more {
            scratch.push(frames.get(names.index(frames.len())?, budget)?);
        }
        out.push(Stack::from(scratch.as_slice()));
    }
    finish_all(&[prefix, suffix, names])?;
    Ok(out)
}
