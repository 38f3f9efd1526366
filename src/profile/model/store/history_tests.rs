//! The store with a disk history: windows read back across a restart, and
//! answers that say which slices their edges cut.
use std::{collections::BTreeMap, sync::Arc};

use super::*;
use crate::{
    profile::model::state::State,
    profile::{
        history::{History, HistoryConfig},
        model::{
            counters::{RawThread, ThreadCounters},
            Sample, ThreadInfo,
        },
    },
};

/// A busy second of three threads: thread totals that fill it, stack rows
/// that change with `i`, named threads and process.
fn second(start: SystemTime, i: u64) -> Slice {
    let end = start + Duration::from_millis(1_003);
    let mut s = Slice::empty(start, end);
    for tid in 10..13u32 {
        let mut ns = [0; State::COUNT];
        ns[State::Cpu as usize] = 400_000_000 + i * 1_000 + u64::from(tid);
        ns[State::Sleep as usize] = 1_003_000_000 - ns[State::Cpu as usize];
        s.thread_totals.push(RawThread {
            tid,
            pid: 10,
            comm: format!("worker-{tid}"),
            counters: ThreadCounters {
                ns,
                switches_voluntary: i + 1,
                ..Default::default()
            },
        });
        s.threads.insert(
            tid,
            ThreadInfo {
                pid: 10,
                name: Arc::from(format!("worker-{tid}")),
            },
        );
        let stack: Stack = [
            "main",
            "run",
            if i.is_multiple_of(3) { "parse" } else { "send" },
        ]
        .iter()
        .map(|f| Arc::<str>::from(*f))
        .collect();
        s.samples.push(Sample {
            pid: 10,
            tid,
            state: State::Cpu,
            stack,
            ns: 10_101_010 * (i % 7 + 1),
            count: i % 7 + 1,
        });
    }
    s.processes.insert(10, Arc::from("server"));
    s
}

/// Nanoseconds by (tid, state) of thread totals, and by (tid, leaf) of
/// samples, over what `window` holds.
fn sums(snapshot: &Snapshot, window: Window) -> BTreeMap<(u32, String), u64> {
    let mut out = BTreeMap::new();
    for slice in snapshot.within(window) {
        for t in &slice.thread_totals {
            for state in State::ALL {
                *out.entry((t.tid, format!("{state:?}"))).or_default() += t.counters.ns_in(state);
            }
        }
        for s in &slice.samples {
            let leaf = s.stack.last().map_or("", |f| f);
            *out.entry((s.tid, leaf.to_string())).or_default() += s.ns;
        }
    }
    out
}

fn open(dir: &std::path::Path) -> Store {
    let history = History::open(HistoryConfig {
        dir: dir.to_path_buf(),
        max_bytes: 64 << 20,
    })
    .unwrap();
    Store::new(Duration::from_secs(600)).with_history(Feed::start(history).unwrap())
}

#[test]
fn a_window_read_before_a_restart_reads_the_same_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = SystemTime::now() - Duration::from_secs(120);
    let window = Window::between(
        t0 + Duration::from_millis(3_300),
        t0 + Duration::from_millis(17_800),
    );
    let before = {
        let mut store = open(dir.path());
        let mut start = t0;
        for i in 0..30 {
            let s = second(start, i);
            start = s.end;
            store.push(s);
            // A second each in the daemon: here the encoder's queue
            // (a few slices) must not overflow.
            assert!(store.flush_history(Duration::from_secs(10)));
        }
        let HistoryState::On {
            encoder_dropped, ..
        } = store.history()
        else {
            panic!("no history");
        };
        assert_eq!(encoder_dropped, 0);
        let snapshot = store.snapshot();
        let recorded = snapshot.recorded(window, SystemTime::now());
        (sums(&snapshot, window), recorded.covered)
    };
    assert!(!before.0.is_empty());
    // Restarted: memory holds nothing of it, the disk all of it.
    let store = open(dir.path());
    assert_eq!(store.all().count(), 0);
    let snapshot = store.snapshot();
    assert_eq!(sums(&snapshot, window), before.0);
    let covered = snapshot.recorded(window, SystemTime::now()).covered;
    assert_eq!(covered, before.1);
    let covered = covered.unwrap();
    // The edges fell inside seconds: cut, and said so.
    assert_eq!(
        covered.from_unix_ns,
        super::super::window::unix_nanos(window.from)
    );
    assert_eq!(
        covered.until_unix_ns,
        super::super::window::unix_nanos(window.until)
    );
    let edges: Vec<_> = covered.prorated.iter().map(|c| c.edge).collect();
    assert_eq!(edges, ["start", "end"]);
    // An always-busy thread's wall time is the window's length.
    let wall: u64 = ["Cpu", "Sleep"]
        .iter()
        .map(|s| before.0[&(10, s.to_string())])
        .sum();
    let length = window.length().as_nanos() as u64;
    assert!(length.abs_diff(wall) <= 2, "{wall} ns in {length} ns");
}

#[test]
fn an_absolute_range_inside_a_merged_block_says_it_was_cut() {
    let mut store = Store::new(Duration::from_secs(600));
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let mut start = t0;
    for i in 0..300 {
        let s = second(start, i);
        start = s.end;
        store.push(s);
    }
    let snapshot = store.snapshot();
    // 2 s in the middle of the oldest part, merged into 10 s blocks.
    let window = Window::between(t0 + Duration::from_secs(23), t0 + Duration::from_secs(25));
    let recorded = snapshot.recorded(window, start);
    let covered = recorded.covered.unwrap();
    assert_eq!(covered.prorated.len(), 1, "{covered:?}");
    let cut = &covered.prorated[0];
    assert_eq!(cut.edge, "both");
    assert!(cut.slice_ms >= 9_000 && cut.kept_ms == 2_000, "{cut:?}");
    assert!(covered.prorated_line().unwrap().contains("of a 1"));
    assert!(!window.describe().contains("last"));
    // Its figures are the block's, pro rata: 2 s of wall per thread.
    let sums = sums(&snapshot, window);
    let wall = sums[&(10, "Cpu".to_string())] + sums[&(10, "Sleep".to_string())];
    assert!(wall.abs_diff(2_000_000_000) <= 2, "{wall}");
    // The resolution runs oldest first, steps never finer toward the past.
    let parts = snapshot.resolution(Window::last(600, start), start);
    assert!(
        parts.windows(2).all(|w| w[0].step_s >= w[1].step_s),
        "{parts:?}"
    );
    assert_eq!(parts.last().unwrap().step_s, 1);
}

#[test]
fn a_snapshot_narrowed_to_a_process_reports_it_as_the_whole_does() {
    let mut store = Store::new(Duration::from_secs(600));
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000);
    let mut start = t0;
    for i in 0..200 {
        let mut s = second(start, i);
        // Another process beside it, with its own rows and a wakeup to it.
        let other = second(start, i + 1);
        for mut t in other.thread_totals {
            (t.pid, t.tid) = (20, t.tid + 10);
            s.thread_totals.push(t);
        }
        for mut r in other.samples {
            (r.pid, r.tid) = (20, r.tid + 10);
            s.samples.push(r);
        }
        start = s.end;
        store.push(s);
    }
    let snapshot = store.snapshot();
    let window = Window::between(t0 + Duration::from_millis(7_500), start);
    let narrowed = snapshot.narrowed(10, window).unwrap();
    let whole = crate::profile::report::threads::report(&snapshot, 10, window);
    assert!(whole.is_some());
    assert_eq!(
        crate::profile::report::threads::report(&narrowed, 10, window),
        whole
    );
    assert_eq!(
        narrowed.recorded(window, start),
        snapshot.recorded(window, start)
    );
    assert!(narrowed
        .within(window)
        .all(|s| s.samples.iter().all(|r| r.pid == 10)));
    // Kept for the next query, which reads the same; and right after more
    // seconds were sealed and merged.
    assert!(store.narrowed.bytes() > 0);
    let again = store.snapshot().narrowed(10, window).unwrap();
    let report = |s: &Snapshot, w| crate::profile::report::threads::report(s, 10, w);
    assert_eq!(report(&again, window), whole);
    for i in 200..400 {
        let s = second(start, i);
        start = s.end;
        store.push(s);
    }
    let snapshot = store.snapshot();
    let window = Window::between(t0 + Duration::from_millis(7_500), start);
    let narrowed = snapshot.narrowed(10, window).unwrap();
    assert_eq!(report(&narrowed, window), report(&snapshot, window));
}
