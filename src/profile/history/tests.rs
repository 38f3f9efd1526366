//! The history through its public API: round trips across reopen, the disk
//! bound, the queue bound, degraded writing.

use std::{os::unix::fs::MetadataExt, path::Path, process::Command};

use super::*;

/// Quick syncs and retries, so tests do not wait.
pub(super) const FAST: Tuning = Tuning {
    sync_every: Duration::from_millis(50),
    retry_every: Duration::from_millis(500),
};
const WAIT: Duration = Duration::from_secs(10);

pub(super) fn open(dir: &Path, max_bytes: u64) -> Arc<History> {
    let cfg = HistoryConfig {
        dir: dir.to_path_buf(),
        max_bytes,
    };
    History::open_tuned(cfg, FAST).unwrap()
}

/// Block `i`: second `i` after a fixed instant, with a payload of `len`
/// bytes that only block `i` has.
pub(super) fn block(i: u64, len: usize) -> (BlockMeta, Vec<u8>) {
    let start = UNIX_EPOCH + Duration::new(1_700_000_000 + i, 123_456_789);
    let meta = BlockMeta {
        start,
        end: start + Duration::from_secs(1),
        step_s: 1,
    };
    // Eight bytes a step: megabyte blocks are quick to make, even unoptimized.
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut payload = Vec::with_capacity(len + 8);
    while payload.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        payload.extend_from_slice(&x.to_le_bytes());
    }
    payload.truncate(len);
    (meta, payload)
}

pub(super) fn submit_range(h: &History, range: std::ops::Range<u64>, len: usize) {
    for i in range {
        let (meta, payload) = block(i, len);
        h.submit(meta, payload);
    }
    assert!(h.flush(WAIT));
}

/// The ids of the blocks held (by their start second), checking each
/// block's payload is the one submitted.
pub(super) fn held(h: &History) -> Vec<u64> {
    let all = h.blocks(
        UNIX_EPOCH,
        UNIX_EPOCH + Duration::from_secs(u32::MAX.into()),
    );
    all.iter()
        .map(|b| {
            let i = b.meta.start.duration_since(UNIX_EPOCH).unwrap().as_secs() - 1_700_000_000;
            let (meta, payload) = block(i, b.payload_len() as usize);
            assert_eq!(b.meta, meta);
            assert_eq!(h.read(b).unwrap(), payload, "block {i}");
            i
        })
        .collect()
}

#[test]
fn history_is_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<History>();
    send_sync::<HistoryStats>();
}

#[test]
fn blocks_round_trip_across_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let h = open(tmp.path(), 64 << 20);
    submit_range(&h, 0..50, 5000);
    assert_eq!(held(&h), (0..50).collect::<Vec<_>>());
    let before = h.stats();
    assert_eq!(
        (before.blocks, before.blocks_written, before.segments),
        (50, 50, 1)
    );
    assert_eq!(before.seconds, 50);
    assert_eq!(before.oldest, Some(1_700_000_000));
    assert_eq!(before.newest, Some(1_700_000_051));
    drop(h);

    let h = open(tmp.path(), 64 << 20);
    let after = h.stats();
    assert_eq!(
        (after.blocks, after.bytes, after.torn_blocks),
        (50, before.bytes, 0)
    );
    submit_range(&h, 50..60, 5000);
    drop(h);
    let h = open(tmp.path(), 64 << 20);
    assert_eq!(held(&h), (0..60).collect::<Vec<_>>());
    assert_eq!(h.stats().segments, 2, "each open appends to a new segment");
}

#[test]
fn blocks_selects_the_overlapping_range_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let h = open(tmp.path(), 64 << 20);
    submit_range(&h, 0..10, 100);
    let (m3, _) = block(3, 0);
    let (m6, _) = block(6, 0);
    // [start of 3, start of 6): blocks 3, 4, 5; plus 2, which ends after 3
    // starts (the blocks are offset by 123 ms from whole seconds).
    let got: Vec<SystemTime> = h
        .blocks(m3.start, m6.start)
        .iter()
        .map(|b| b.meta.start)
        .collect();
    let want: Vec<SystemTime> = (3..6).map(|i| block(i, 0).0.start).collect();
    assert_eq!(got, want);
    assert_eq!(h.blocks(m3.end, m3.end).len(), 0);
    assert_eq!(h.blocks(m3.end - Duration::from_nanos(1), m3.end).len(), 1);
}

/// Bytes the directory's files take on disk, and their lengths.
fn dir_usage(dir: &Path) -> (u64, u64) {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap())
        .fold((0, 0), |(used, len), m| {
            (used + m.blocks() * 512, len + m.len())
        })
}

#[test]
fn the_disk_bound_holds_while_writing_far_past_it() {
    let tmp = tempfile::tempdir().unwrap();
    let max = 2 << 20;
    let h = open(tmp.path(), max);
    for round in 0..16u64 {
        // 40 blocks of 16 KiB: 640 KiB a round, 10 MiB in all.
        submit_range(&h, round * 40..(round + 1) * 40, 16 << 10);
        // A segment kept open for reading must not outlive its deletion.
        let newest = h.blocks(UNIX_EPOCH, SystemTime::now()).pop().unwrap();
        h.read(&newest).unwrap();
        let (used, len) = dir_usage(tmp.path());
        let st = h.stats();
        assert!(
            used <= max && len <= max,
            "round {round}: {used} / {len} > {max}"
        );
        assert!(st.bytes <= max && st.bytes >= len, "{st:?} vs {len}");
    }
    let ids = held(&h);
    assert_eq!(ids.last(), Some(&639));
    assert!(
        ids.len() > 40,
        "at least most of the bound is used: {}",
        ids.len()
    );
    assert_eq!(ids, (640 - ids.len() as u64..640).collect::<Vec<_>>());
    let st = h.stats();
    assert_eq!((st.write_errors, st.dropped_blocks), (0, 0));
    drop(h);
    // A smaller bound at the next open deletes the oldest to fit.
    let h = History::open_tuned(
        HistoryConfig {
            dir: tmp.path().to_path_buf(),
            max_bytes: MIN_MAX_BYTES,
        },
        FAST,
    )
    .unwrap();
    assert!(dir_usage(tmp.path()).0 <= MIN_MAX_BYTES);
    assert_eq!(held(&h).last(), Some(&639));
}

#[test]
fn a_read_of_a_block_deleted_by_the_bound_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let h = open(tmp.path(), MIN_MAX_BYTES);
    submit_range(&h, 0..4, 16 << 10);
    let first = h.blocks(UNIX_EPOCH, SystemTime::now()).remove(0);
    // Read once: its segment is kept open for reading, until deleted.
    assert!(h.read(&first).is_ok());
    submit_range(&h, 4..200, 16 << 10);
    assert!(matches!(h.read(&first), Err(HistoryError::Gone { .. })));
    assert_eq!(h.stats().read_errors, 1);
}

#[test]
fn a_full_queue_drops_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let h = open(tmp.path(), 64 << 20);
    let mib = 1 << 20;
    {
        // The writer stalls on the index while this is held.
        let _stall = h.shared.index();
        for i in 0..20 {
            let (meta, payload) = block(i, mib);
            h.submit(meta, payload);
        }
        let st = h.stats_unlocked();
        assert!(st.1 <= QUEUE_MAX_BYTES, "{st:?}");
        assert!(st.0 >= 11, "dropped {st:?}");
    }
    assert!(h.flush(WAIT));
    let st = h.stats();
    assert_eq!(st.blocks_written + st.dropped_blocks, 20);
    assert_eq!(st.queue_bytes, 0);
    let (meta, payload) = block(99, MAX_PAYLOAD as usize + 1);
    h.submit(meta, payload);
    assert_eq!(h.stats().dropped_blocks, st.dropped_blocks + 1);
}

impl History {
    /// (dropped, queued bytes) without the index lock.
    fn stats_unlocked(&self) -> (u64, u64) {
        let c = &self.shared.counters;
        (c.dropped_blocks.load(Relaxed), c.queue_bytes.load(Relaxed))
    }
}

#[test]
fn open_refuses_a_bound_too_small_and_a_bad_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = |dir: &Path, max_bytes| HistoryConfig {
        dir: dir.to_path_buf(),
        max_bytes,
    };
    let err = History::open(cfg(tmp.path(), 1000)).err().unwrap();
    assert!(matches!(err, HistoryError::TooSmall { .. }), "{err}");
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
    let err = History::open(cfg(&link, 64 << 20)).err().unwrap();
    assert!(err.to_string().contains("symbolic link"), "{err}");
}

#[test]
fn the_writer_thread_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let h = open(tmp.path(), 64 << 20);
    let names = || -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .collect()
    };
    // A new thread names itself once it runs.
    let named = |names: &[String]| names.iter().any(|n| n.trim() == "ws-history");
    let until = Instant::now() + WAIT;
    while !named(&names()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(named(&names()), "{:?}", names());
    drop(h);
}

/// A tmpfs of `size` mounted (mode 0700) on `at`, unmounted on drop.
struct Tmpfs<'a>(&'a Path);

impl<'a> Tmpfs<'a> {
    fn mount(at: &'a Path, size: &str) -> Option<Tmpfs<'a>> {
        let opts = format!("size={size},mode=0700");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs(at))
    }

    fn remount(&self, opts: &str) {
        let st = Command::new("mount")
            .args(["-o", opts])
            .arg(self.0)
            .status();
        assert!(st.unwrap().success());
    }
}

impl Drop for Tmpfs<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0).status();
    }
}

#[test]
fn a_full_or_read_only_disk_degrades_and_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::mount(tmp.path(), "1m") else {
        eprintln!("skipped: cannot mount a tmpfs here (not root?)");
        return;
    };
    let dir = tmp.path().join("history");
    // No retry unless the test makes one due (by time it would be flaky).
    let no_retry = Tuning {
        retry_every: Duration::from_secs(3600),
        ..FAST
    };
    let cfg = HistoryConfig {
        dir: dir.clone(),
        max_bytes: 64 << 20,
    };
    let h = History::open_tuned(cfg.clone(), no_retry).unwrap();
    let filler = tmp.path().join("filler");
    std::fs::write(&filler, vec![1u8; 900 << 10]).unwrap();
    // 16 KiB blocks until the file system is full.
    submit_range(&h, 0..20, 16 << 10);
    let st = h.stats();
    assert_eq!(
        st.write_errors, 1,
        "one failure, then no tries until the retry: {st:?}"
    );
    let reason = st.degraded.clone().unwrap();
    assert!(reason.contains("No space left"), "{reason}");
    assert!(st.blocks_written > 0 && st.dropped_blocks > 0, "{st:?}");
    let held_before = held(&h);
    assert_eq!(held_before, (0..st.blocks_written).collect::<Vec<_>>());

    // While waiting to retry, submit drops at once, counted.
    let (meta, payload) = block(100, 100);
    h.submit(meta, payload);
    assert_eq!(h.stats().dropped_blocks, st.dropped_blocks + 1);
    assert_eq!(h.stats().queue_bytes, 0);

    std::fs::remove_file(&filler).unwrap();
    h.shared.counters.retry_at_ms.store(1, Relaxed); // the retry is due
    submit_range(&h, 200..203, 16 << 10);
    let st = h.stats();
    assert_eq!((st.degraded, st.write_errors), (None, 1), "writing resumed");
    assert_eq!(held(&h).len() as u64, held_before.len() as u64 + 3);

    // Read-only: the next segment cannot be created.
    drop(h);
    fs.remount("remount,ro");
    let h = History::open_tuned(cfg, no_retry).unwrap();
    assert_eq!(
        h.stats().blocks as usize,
        held_before.len() + 3,
        "still readable"
    );
    submit_range(&h, 300..302, 100);
    let st = h.stats();
    assert!(
        st.degraded.as_deref().unwrap_or("").contains("Read-only"),
        "{st:?}"
    );
    assert_eq!((st.write_errors, st.blocks_written), (1, 0));
    drop(h);
    fs.remount("remount,rw");
}
