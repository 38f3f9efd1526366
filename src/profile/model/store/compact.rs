//! Compaction: how the store keeps its whole retention within its byte
//! bound. Recent slices stay at full resolution (one per drain); older
//! ones are merged in time into slices aligned on wall-clock multiples of
//! their step:
//!
//! | age        | step |
//! |------------|------|
//! | < 120 s    | 1 s  |
//! | 120-600 s  | 10 s |
//! | >= 600 s   | 60 s |
//!
//! Slices merge two at a time, a couple of merges per push (the steady
//! state needs about one a push). Under pressure (estimate past
//! [`PRESSURE_PERCENT`] of the bound) compaction reaches further, oldest
//! first, a few steps per push: the tiers shift to 1 s for the newest
//! [`KEEP_FINE_S`], 10 s to a minute, 60 s past it; when no merge is due
//! or fits, the largest part one process holds of a slice (never the
//! newest) is folded into per-pool rows (see [`super::merge`]), so a
//! process of thousands of threads pays for the room it takes and every
//! smaller one keeps its per-thread rows. Only past the bound itself do
//! the fair-share shedding and, last, eviction of whole slices run.
//!
//! Every merge checks before it allocates that the merged slice fits:
//! its size is at most the sum of its two parts', so that sum must fit
//! beside what the store holds.

use std::{ops::Range, time::SystemTime};

use rustc_hash::{FxHashMap, FxHashSet};

use super::{merge, Held, Store};
use crate::profile::model::Slice;

/// Merges by the age rule per push: a bucket of ten slices takes nine,
/// so the steady state needs about one a push.
const AGE_STEPS: usize = 2;
/// Past this share of the bound, compaction reaches beyond the age rule.
const PRESSURE_PERCENT: usize = 80;
/// Merges or folds at most this many groups per push under pressure
/// (below the bound itself), so that a push stays short.
const PRESSURE_STEPS: usize = 4;
/// Under pressure, the newest this many seconds are still never merged in
/// time (they may be folded into pools, after everything older).
pub const KEEP_FINE_S: u64 = 10;
/// A process's part of a slice is folded under pressure only from this
/// many compressed bytes: folding a few threads' rows frees next to
/// nothing and costs them their per-thread history.
const MIN_FOLD_BYTES: usize = 4 << 10;

/// The step the age rule gives a slice that ended `age_s` seconds before
/// the newest one.
pub fn step_for(age_s: u64) -> u32 {
    match age_s {
        0..120 => 1,
        120..600 => 10,
        _ => 60,
    }
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The aligned bucket of `step` seconds that a slice ending at `end` falls
/// in (a slice ending exactly on a multiple belongs to the bucket before).
fn bucket(end: SystemTime, step: u32) -> u64 {
    let nanos = end
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos.saturating_sub(1) / (u128::from(step) * 1_000_000_000)) as u64
}

impl Store {
    /// Seconds from the end of slice `i` to the end of the newest.
    fn age(&self, i: usize) -> u64 {
        let newest = self.slices.back().map_or(0, |h| secs(h.block.end));
        newest.saturating_sub(secs(self.slices[i].block.end))
    }

    /// The step slice `i` is due for: by the age rule; under `pressure`,
    /// 10 s past [`KEEP_FINE_S`] and 60 s past a minute.
    fn due_step(&self, i: usize, pressure: bool) -> u32 {
        let age = self.age(i);
        match (pressure, age) {
            (true, 60..) => 60,
            (true, a) if a >= KEEP_FINE_S => 10,
            _ => step_for(age),
        }
    }

    /// The oldest slices due for a merge (the first two of a bucket, or
    /// one to relabel), with their step. A bucket is merged once it is
    /// whole (a slice of a later bucket follows it, so the newest slice
    /// never merges) and its newest slice is due for that step too.
    /// Buckets merge two slices at a time: a merge needs room for its two
    /// parts only, and a push does a bounded amount of work. Strictly
    /// oldest first: while the oldest slice not at its due step waits, no
    /// newer one is merged, so steps never get finer toward the past (what
    /// answers say of their resolution stays monotonic).
    fn due(&self, pressure: bool) -> Option<(Range<usize>, u32)> {
        let n = self.slices.len();
        let mut i = 0;
        while i + 1 < n {
            let step = self.due_step(i, pressure);
            let held = &self.slices[i];
            let key = bucket(held.block.end, step);
            let mut j = i + 1;
            while j < n && bucket(self.slices[j].block.end, step) == key {
                j += 1;
            }
            let behind = j - i > 1 || held.step_s < step;
            if behind {
                let whole = j < n && self.due_step(j - 1, pressure) >= step;
                return whole.then(|| (i..(i + 2).min(j), step));
            }
            i = j;
        }
        None
    }

    /// Merges what the age rule makes due (two steps), then, while over
    /// [`PRESSURE_PERCENT`] of the bound, merges and folds oldest first: a
    /// few steps, or as many as it takes while over the bound itself.
    pub(super) fn compact(&mut self) {
        for _ in 0..AGE_STEPS {
            match self.due(false) {
                Some((range, step)) => self.merge_range(range, step),
                None => break,
            };
        }
        let pressure = self.max_bytes / 100 * PRESSURE_PERCENT;
        let (mut steps, mut counted) = (0, FxHashSet::default());
        while self.bytes() > pressure && (steps < PRESSURE_STEPS || self.bytes() > self.max_bytes) {
            steps += 1;
            let done = match self.due(true) {
                Some((range, step)) => self.merge_range(range, step),
                None => false,
            };
            if !done && !self.fold_largest(&mut counted) {
                break;
            }
        }
    }

    /// Folds into pools the largest part a process holds of a slice (any
    /// but the newest) and has not had folded there yet: the oldest of
    /// equal ones. False when no part is worth it (under
    /// [`MIN_FOLD_BYTES`]) or no room for the fold.
    /// The process folded pays as in the fair share (see
    /// [`Store::count_share`]).
    fn fold_largest(&mut self, counted: &mut FxHashSet<u32>) -> bool {
        let n = self.slices.len();
        let parts = (0..n.saturating_sub(1)).flat_map(|i| {
            let held = &self.slices[i];
            held.by_pid.iter().filter_map(move |(&pid, &bytes)| {
                // What its rows cost: the stacks and names it brought stay.
                let rows = bytes.saturating_sub(held.brought.get(&pid).copied().unwrap_or(0));
                let worth = pid != 0 && rows >= MIN_FOLD_BYTES && !held.folded.contains(pid);
                worth.then_some((rows, std::cmp::Reverse(i), pid))
            })
        });
        let Some((_, std::cmp::Reverse(i), pid)) = parts.max() else {
            return false;
        };
        if !self.room_for(self.slices[i].bytes) {
            return false;
        }
        self.count_share(pid, counted);
        self.fold_part(i, pid);
        true
    }

    /// Whether a slice of at most `bytes` can be built beside what is
    /// held: in a working space of a quarter of the bound past it.
    fn room_for(&self, bytes: usize) -> bool {
        self.bytes() + bytes <= self.max_bytes + self.max_bytes / 4
    }

    /// Replaces the slices in `range` with one merged slice of `step`
    /// (the processes any part holds folded, folded in all); false,
    /// changing nothing, when the merge could not fit within the bound.
    fn merge_range(&mut self, range: Range<usize>, step: u32) -> bool {
        let parts: Vec<&Held> = self.slices.range(range.clone()).collect();
        if parts.len() == 1 {
            // A bucket of one slice: nothing to merge, only its label.
            self.slices[range.start].step_s = step;
            return true;
        }
        // The merged slice is at most the sum of its parts (fewer rows,
        // names united) and replaces them at once: it is built in a
        // working space of at most a quarter of the bound beside what is
        // held, checked before it is built. (Asking for room within the
        // bound itself stopped every merge once the store was full, and
        // left only shedding.)
        let estimate: usize = parts.iter().map(|h| h.bytes).sum();
        if !self.room_for(estimate) {
            return false;
        }
        let fold = merge::FoldedPids::of(parts.iter().flat_map(|h| h.folded.pids()));
        let slices: Vec<Slice> = range.clone().map(|i| self.open(i)).collect();
        let merged = merge::merge(&slices.iter().collect::<Vec<_>>(), &fold);
        drop(slices);
        // What each process brought into the store stays charged to it.
        let mut brought: FxHashMap<u32, usize> = FxHashMap::default();
        for h in self.slices.range(range.clone()) {
            for (pid, b) in &h.brought {
                *brought.entry(*pid).or_default() += b;
            }
        }
        let old: Vec<Held> = self.slices.drain(range.clone()).collect();
        old.iter().for_each(|h| self.forget(h));
        self.compacted_slices += old.len() as u64;
        self.hold(Held::seal(&merged, brought, step, fold), range.start);
        true
    }
}
