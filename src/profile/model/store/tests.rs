//! The store's tests: retention, the memory bound, snapshots.
use std::{collections::HashMap, sync::Arc};

use super::*;
use crate::profile::model::counters::ThreadCounters;
use crate::{profile::model::state::State, profile::model::Sample};

fn slice(end_s: u64, frames: &[&str]) -> Slice {
    let stack: Stack = frames.iter().map(|f| Arc::<str>::from(*f)).collect();
    Slice {
        start: SystemTime::UNIX_EPOCH + Duration::from_secs(end_s - 1),
        end: SystemTime::UNIX_EPOCH + Duration::from_secs(end_s),
        samples: vec![Sample {
            pid: 1,
            tid: 1,
            state: State::Cpu,
            stack,
            ns: 10,
            count: 1,
        }],
        wakeups: Vec::new(),
        threads: HashMap::new(),
        thread_totals: Vec::new(),
        runq_hists: Vec::new(),
        processes: HashMap::new(),
        containers: Default::default(),
        origins: Default::default(),
        kept_off: Default::default(),
        sleeps: Default::default(),
        stats: [1; STAT_COUNTERS],
        spans: Default::default(),
    }
}

#[test]
fn retention_drops_old_slices_and_windows_select_recent_ones() {
    let mut store = Store::new(Duration::from_secs(10));
    for t in 1..=30 {
        store.push(slice(t, &["main", "work"]));
    }
    assert_eq!(store.all().count(), 11, "slices ending in [20, 30]");
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(30);
    let snapshot = store.snapshot();
    assert_eq!(snapshot.within(Window::last(3, now)).count(), 3);
    assert_eq!(snapshot.within(Window::last(1000, now)).count(), 11);
    assert_eq!(store.totals()[0], 30);
}

#[test]
fn process_totals_only_grow_while_slices_expire() {
    let mut store = Store::new(Duration::from_secs(5));
    let mut last = 0;
    for t in 1..=20 {
        let mut s = slice(t, &["main"]);
        s.thread_totals
            .push(crate::profile::model::counters::RawThread {
                tid: 1,
                pid: 1,
                comm: "app".into(),
                counters: ThreadCounters {
                    ns: [1_000, 0, 0, 0, 0, 0],
                    switches_voluntary: 1,
                    switches_involuntary: 0,
                    wakeups_sent: 0,
                    wakeups_received: 2,
                },
            });
        store.push(s);
        let p = &store.process_totals()[&1];
        assert!(p.counters.ns[0] > last, "counter grows");
        last = p.counters.ns[0];
    }
    let p = &store.process_totals()[&1];
    assert_eq!(
        (p.counters.ns[0], p.counters.wakeups_received, &*p.comm),
        (20_000, 40, "app")
    );
    store.push(slice(100, &["main"]));
    assert!(
        store.process_totals().get(&1).is_none(),
        "no totals for longer than the retention: forgotten"
    );
}

#[test]
fn equal_stacks_are_shared_and_unused_ones_swept() {
    let mut store = Store::new(Duration::from_secs(5));
    store.push(slice(1, &["main", "old"]));
    for t in 2..=(COMPACT_EVERY + 1) {
        store.push(slice(t, &["main", "new"]));
    }
    let stacks: Vec<_> = store.all().map(|s| s.samples[0].stack.clone()).collect();
    assert!(stacks.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
    assert_eq!(
        store.stack_count(),
        1,
        "the stack of the evicted slice is gone"
    );
}

/// A slice ending at `end_s` with `rows` distinct stacks of its own.
fn wide_slice(end_s: u64, rows: usize) -> Slice {
    let mut s = slice(end_s, &["main"]);
    s.samples = (0..rows)
        .map(|i| Sample {
            stack: [Arc::<str>::from("main"), Arc::from(format!("f{end_s}_{i}"))]
                .into_iter()
                .collect(),
            ..s.samples[0].clone()
        })
        .collect();
    s
}

#[test]
fn memory_bound_drops_oldest_slices_and_counts_them() {
    let one = {
        let mut probe = Store::new(Duration::from_secs(600));
        probe.push(wide_slice(1, 100));
        probe.bytes()
    };
    // Room for about ten slices, well within the retention.
    let mut store = Store::new(Duration::from_secs(600)).with_max_bytes(one * 10);
    for t in 1..=40 {
        store.push(wide_slice(t, 100));
        assert!(store.bytes() <= one * 10, "within the bound after push {t}");
    }
    let stats = store.stats();
    // The name table grows by doubling: a slice or two less than ten.
    assert!((6..=10).contains(&stats.slices), "{stats:?}");
    assert_eq!(stats.evicted_slices, 40 - stats.slices as u64);
    assert_eq!(stats.evicted_rows, stats.evicted_slices * 100);
    let ends: Vec<u64> = store
        .all()
        .map(|s| {
            s.end
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        })
        .collect();
    assert_eq!(*ends.last().unwrap(), 40, "the newest is kept");
    assert!(
        ends.windows(2).all(|w| w[1] == w[0] + 1),
        "oldest went first: {ends:?}"
    );
    assert_eq!(stats.stacks, stats.slices * 100, "evicted stacks swept");
    assert_eq!(stats.history_s, stats.slices as u64);
    let published = store.published().lock().unwrap().clone();
    assert_eq!(published.stats, stats, "published after each push");
}

#[test]
fn estimate_follows_pushes_and_evictions_without_drift() {
    let mut store = Store::new(Duration::from_secs(5));
    for t in 1..=200 {
        store.push(wide_slice(t, 3 + (t as usize % 7)));
    }
    // Recompute from scratch what was kept incrementally.
    store.sweep_stacks();
    let slices: usize = store.slices.iter().map(|h| h.bytes).sum();
    let stacks: usize = store.stacks.iter().map(size::stack_bytes).sum();
    assert_eq!((store.slice_bytes, store.stack_bytes), (slices, stacks));
    assert_eq!(store.stats().evicted_slices, 0, "retention, not the bound");
}

#[test]
fn the_live_view_is_replaced_counted_and_snapshotted() {
    use crate::profile::model::live::LiveView;
    let mut store = Store::new(Duration::from_secs(5));
    store.push(slice(1, &["main"]));
    let before = store.stats();
    let snapshot = store.snapshot();
    assert!(snapshot.live().as_of.is_none(), "no drain yet");
    let view = |s| LiveView {
        as_of: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(s)),
        left_out: 3,
        ..LiveView::default()
    };
    store.set_live(view(1));
    store.set_live(view(2));
    assert_eq!(store.snapshot().live().as_of, view(2).as_of);
    assert!(snapshot.live().as_of.is_none(), "a snapshot keeps its view");
    let after = store.published().lock().unwrap().clone();
    assert_eq!(after.stats.live_bytes, size::live_bytes(&view(2)));
    assert_eq!(after.stats.bytes, before.bytes, "an empty view either way");
    assert_eq!(after.stats, store.stats(), "published");
}

#[test]
fn a_snapshot_outlives_eviction_and_does_not_block_pushes() {
    let mut store = Store::new(Duration::from_secs(3));
    store.push(slice(1, &["main", "old"]));
    let snapshot = store.snapshot();
    for t in 2..=(COMPACT_EVERY + 2) {
        store.push(slice(t, &["main", "new"]));
    }
    assert_eq!(snapshot.all().count(), 1);
    assert_eq!(&*snapshot.all().next().unwrap().samples[0].stack[1], "old");
    assert_eq!(store.all().count(), 4);
}
