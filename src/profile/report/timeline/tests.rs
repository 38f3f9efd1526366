use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::*;
use crate::profile::model::counters::{RawThread, ThreadCounters};
use crate::profile::model::{store::Store, Slice};

fn thread(tid: u32, name: &str, ns: [u64; State::COUNT]) -> RawThread {
    RawThread {
        tid,
        pid: 7,
        comm: name.into(),
        counters: ThreadCounters {
            ns,
            switches_voluntary: 0,
            switches_involuntary: 0,
            wakeups_sent: 0,
            wakeups_received: 0,
        },
    }
}

const MS: u64 = 1_000_000;

/// `n` one-second slices ending at `end`, in each: a lock holder that
/// spins then parks, a worker pool asleep, and a thread of another pid.
fn store(n: u64, end: SystemTime) -> Store {
    let mut store = Store::new(Duration::from_secs(3600));
    for i in 0..n {
        let mut other = thread(99, "other", [1000 * MS, 0, 0, 0, 0, 0]);
        other.pid = 8;
        // The holder spins in the first half of the slices, parks after.
        let holder = if i < n / 2 {
            [900 * MS, 100 * MS, 0, 0, 0, 0]
        } else {
            [0, 0, 1000 * MS, 0, 0, 0]
        };
        store.push(Slice {
            thread_totals: vec![
                thread(10, "holder", holder),
                thread(11, "worker-1", [0, 0, 0, 0, 1000 * MS, 0]),
                thread(12, "worker-2", [0, 0, 0, 0, 1000 * MS, 0]),
                other,
            ],
            processes: HashMap::from([(7, Arc::from("app"))]),
            ..Slice::empty(
                end - Duration::from_secs(n - i),
                end - Duration::from_secs(n - i - 1),
            )
        });
    }
    store
}

#[test]
fn one_row_per_thread_one_column_per_slice() {
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let store = store(10, end);
    let t = timeline(
        &store.snapshot(),
        7,
        Window::last(30, end),
        Grouping::Thread,
        DEFAULT_ROWS,
    )
    .unwrap();
    assert_eq!(t.comm, "app");
    assert_eq!(
        t.states,
        ["cpu", "runqueue", "futex", "io", "sleep", "throttled"]
    );
    assert_eq!(t.columns.len(), 10);
    assert_eq!(t.columns[0].end_ms - t.columns[0].start_ms, 1000);
    assert_eq!(t.rows.len(), 3, "pid 8's thread is not in pid 7's timeline");
    let holder = t.rows.iter().find(|r| r.tid == Some(10)).unwrap();
    assert_eq!(holder.cells[0], [900, 100, 0, 0, 0, 0]);
    assert_eq!(holder.cells[9], [0, 0, 1000, 0, 0, 0]);
    assert_eq!(holder.wall_ms, 10_000);
    assert!(timeline(
        &store.snapshot(),
        9,
        Window::last(30, end),
        Grouping::Thread,
        10
    )
    .is_none());
}

#[test]
fn pools_sum_their_threads_and_rows_past_the_limit_are_counted() {
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let store = store(4, end);
    let snap = store.snapshot();
    let t = timeline(&snap, 7, Window::last(30, end), Grouping::Pool, 10).unwrap();
    let pool = t.rows.iter().find(|r| r.name == "worker-*").unwrap();
    assert_eq!((pool.tid, pool.threads), (None, 2));
    assert_eq!(pool.cells[1], [0, 0, 0, 0, 2000, 0]);
    let t = timeline(&snap, 7, Window::last(30, end), Grouping::Thread, 1).unwrap();
    assert_eq!(t.rows.len(), 1);
    assert_eq!((t.rows_left_out, t.left_out_wall_ms), (2, 8000));
}

#[test]
fn long_windows_merge_slices_into_at_most_max_columns() {
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
    let store = store(600, end);
    let t = timeline(
        &store.snapshot(),
        7,
        Window::last(600, end),
        Grouping::Thread,
        DEFAULT_ROWS,
    )
    .unwrap();
    // The newest minute five slices a column; older slices, merged by
    // the store into 10 s and 60 s, a column each.
    assert!(
        (40..=MAX_COLUMNS).contains(&t.columns.len()),
        "{}",
        t.columns.len()
    );
    let worker = t.rows.iter().find(|r| r.tid == Some(11)).unwrap();
    // Asleep throughout: each column's length of sleep. (The oldest may
    // be the part of a 60 s bucket the store recorded.)
    for (i, (cell, column)) in worker.cells.iter().zip(&t.columns).enumerate() {
        let ms = column.end_ms - column.start_ms;
        assert_eq!(u64::from(cell[4]), ms, "{:?}", t.columns);
        assert!(i == 0 || [5_000, 10_000, 60_000].contains(&ms), "{ms}");
    }
    assert_eq!(
        t.columns.last().unwrap().end_ms - t.columns[0].start_ms,
        600_000
    );
    let sum: u64 = worker.cells.iter().map(|c| u64::from(c[4])).sum();
    assert_eq!(sum, worker.wall_ms);
}

#[test]
fn a_columns_bounds_given_back_hold_exactly_its_time() {
    // Drains end between milliseconds: a column's bounds (whole
    // milliseconds) cut its slices by a fraction of a millisecond, and the
    // answer for them holds exactly their span.
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1000) + Duration::from_micros(400);
    let store = store(4, end);
    let snapshot = store.snapshot();
    let t = timeline(
        &snapshot,
        7,
        Window::last(30, end),
        Grouping::Thread,
        DEFAULT_ROWS,
    )
    .unwrap();
    assert_eq!(t.columns.len(), 4);
    let ms = |m: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(m);
    for c in &t.columns {
        let window = Window::between(ms(c.start_ms), ms(c.end_ms));
        let held: Vec<_> = snapshot.within(window).collect();
        let spans: Duration = held
            .iter()
            .map(|s| s.end.duration_since(s.start).unwrap())
            .sum();
        let (from, until) = snapshot.covered(window).unwrap();
        assert_eq!(spans, until.duration_since(from).unwrap(), "{c:?}");
        assert!(
            from == window.from && spans > Duration::from_millis(999),
            "{c:?}"
        );
        let main = held
            .iter()
            .max_by_key(|s| s.end.duration_since(s.start).unwrap());
        assert_eq!(unix_ms(main.unwrap().end), c.end_ms, "{c:?}");
    }
}
