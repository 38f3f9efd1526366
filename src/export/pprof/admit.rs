//! Which rows a profile can hold within its memory budget. A profile
//! copies each distinct frame name into its string and location tables and
//! gives each sample its list of location ids: a process whose every
//! sample is a new stack of 2 KiB frames would make that a copy of the
//! store's names per query. The heaviest rows are admitted while their
//! estimated cost fits; the others are merged into `[truncated]` samples.

use std::{cmp::Ordering, mem::size_of};

use rustc_hash::FxHashSet;

use crate::profile::{
    report::budget::{table_slot, Budget},
    report::rows::{Names, Row},
};

use super::proto::{Function, Label, Location, Sample};

/// Bytes one profile's tables may hold (an estimate that errs high).
pub const MAX_TABLE_BYTES: usize = 16 << 20;

/// Estimated bytes of one new frame: its name in the string table and as
/// the key of the string and location indexes, a function, a location.
fn frame_bytes(name: &str) -> usize {
    3 * (name.len() + size_of::<String>())
        + size_of::<Function>()
        + size_of::<Location>()
        + 3 * table_slot::<(String, u64)>()
        + table_slot::<usize>()
}

/// Estimated bytes of one sample beyond its frames: itself, its location
/// ids and labels (twice: the sample and its key in the dedup index).
fn sample_bytes(frames: usize) -> usize {
    const LABELS: usize = 12;
    size_of::<Sample>()
        + table_slot::<(Vec<u64>, Vec<Label>, usize)>()
        + 2 * (frames * size_of::<u64>() + LABELS * size_of::<Label>())
}

/// Estimated bytes of the names a new thread brings to the labels.
fn thread_bytes(names: &Names, row: &Row) -> usize {
    let text = names.thread(row.tid).len() + names.process_of(row).len();
    4 * (text + size_of::<String>()) + table_slot::<(u32, u32)>()
}

/// Rows, heaviest first, admitted while their cost fits `bytes`: `true`
/// for each kept row. `rows` keep their order (the profile's).
pub fn admit(rows: &[Row], names: &Names, bytes: usize) -> (Vec<bool>, Budget) {
    let mut budget = Budget::new(bytes);
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| rows[b].ns.cmp(&rows[a].ns).then(a.cmp(&b)));
    // Frames by address: the symbolizer interns them (an equal name at
    // another address costs twice here, erring high).
    let mut frames: FxHashSet<usize> = FxHashSet::default();
    let mut threads: FxHashSet<(u32, u32)> = FxHashSet::default();
    let mut kept = vec![false; rows.len()];
    for i in order {
        let row = &rows[i];
        let all = row.stack.iter().chain(row.leaf.as_ref());
        let new: Vec<&str> = all
            .filter(|f| !frames.contains(&(f.as_ptr() as usize)))
            .map(|f| &**f)
            .collect();
        let new_thread = !threads.contains(&(row.pid, row.tid));
        let cost = new.iter().map(|f| frame_bytes(f)).sum::<usize>()
            + sample_bytes(row.stack.len() + 2)
            + if new_thread {
                thread_bytes(names, row)
            } else {
                0
            };
        if !budget.take(cost) {
            // One row too many: the lighter ones are not looked at.
            break;
        }
        frames.extend(new.iter().map(|f| f.as_ptr() as usize));
        threads.insert((row.pid, row.tid));
        kept[i] = true;
    }
    (kept, budget)
}

/// The order of two stacks' frames (as `Ord` on them), interned frames
/// equal by address not compared byte by byte: stacks that share most of
/// their frames cost a pointer compare per frame.
pub fn stack_order(
    a: &[crate::profile::model::Frame],
    b: &[crate::profile::model::Frame],
) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        if std::sync::Arc::ptr_eq(x, y) {
            continue;
        }
        match x.cmp(y) {
            Ordering::Equal => continue,
            other => return other,
        }
    }
    a.len().cmp(&b.len())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::profile::model::Frame;

    fn row(frames: &[&Frame], ns: u64) -> Row {
        Row {
            pid: 1,
            process: Some(Arc::from("p")),
            tid: 1,
            state: None,
            interrupt: None,
            stack: frames.iter().map(|f| (*f).clone()).collect(),
            leaf: None,
            ns,
            count: 1,
        }
    }

    #[test]
    fn the_heaviest_rows_are_admitted_and_shared_frames_cost_once() {
        let names = Names::default();
        let big: Vec<Frame> = (0..4)
            .map(|i| Arc::from(format!("{i}{}", "x".repeat(2000))))
            .collect();
        let rows = [
            row(&[&big[0], &big[1]], 1),
            row(&[&big[0], &big[2]], 5),
            row(&[&big[0], &big[3]], 3),
        ];
        let one = sample_bytes(4) + thread_bytes(&names, &rows[0]) + 2 * frame_bytes(&big[0]);
        let (kept, budget) = admit(&rows, &names, one);
        assert_eq!(kept, [false, true, false]);
        assert!(budget.exhausted());
        let two = one + sample_bytes(4) + frame_bytes(&big[3]);
        assert_eq!(
            admit(&rows, &names, two).0,
            [false, true, true],
            "big[0] again is free"
        );
        assert!(!admit(&rows, &names, usize::MAX).1.exhausted());
    }

    #[test]
    fn stacks_order_as_their_frames_do() {
        let f = |s: &str| -> Frame { Arc::from(s) };
        // `a` and `c` are equal text at two addresses.
        let ab = [f("a"), f("b")];
        let cb = [f("a"), ab[1].clone()];
        let ba = [ab[1].clone(), ab[0].clone()];
        assert_eq!(stack_order(&ab, &ab[..1]), Ordering::Greater);
        assert_eq!(
            stack_order(&ab[..1], &cb[..1]),
            Ordering::Equal,
            "equal text"
        );
        assert_eq!(stack_order(&cb, &ba), Ordering::Less);
    }
}
