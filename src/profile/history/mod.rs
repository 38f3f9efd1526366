//! The on-disk history: a bounded, crash-safe store of opaque sealed blocks
//! (bytes another module encoded and compressed) with the time range each
//! covers, written by a background thread and read back by time range.
//!
//! **Format: append-only segment files with checksummed records**, chosen
//! over the embedded stores `redb` and `fjall` by measurement
//! (`bench/history_disk.rs`, `bench/results/history_disk.txt`: 3,600
//! blocks of 5–20 KB, one sync every 5 blocks, four runs, dev profile):
//! - write cost: 65–80 µs CPU per block (redb 135–180, fjall 62–74); bytes
//!   written 45 MB for 45 MB of blocks (redb 155 MB: copy-on-write pages;
//!   fjall 79 MB: journal, then tables);
//! - read of the 1-hour range, each payload copied out and checksummed:
//!   11–20 ms cold or warm (redb 170–260 ms cold / 4–8 ms warm, fjall
//!   57–88 / 3–7); reopening 50–150 ms (the newest segment is checksummed
//!   whole);
//! - kill -9: all three kept every synced block; here at most the record
//!   being written is torn, counted and cut off at the next open;
//! - weight: crc32fast (2 crates, already in the tree) against redb (21 k
//!   lines) or fjall (43 crates, 32 k lines);
//! - the bound: deleting the oldest data is unlinking whole files, so the
//!   disk bound is exact and immediate, where a B-tree reuses freed pages
//!   without shrinking and an LSM tree frees space only when it compacts.
//!
//! Layout: `DIR/seg-<id>.wsh` files (see [`segment`] for the record
//! framing). The writer appends to the newest segment and starts a new one
//! past [`SEGMENT_MAX`] (or an eighth of the bound if smaller) and at each
//! open. Before a record is written, the oldest segments are deleted until
//! the directory, counted in whole 4 KiB blocks per file, stays within
//! `max_bytes` with it. Data are `fdatasync`ed every [`SYNC_EVERY`] (a
//! sync per one-second block tripled the CPU per block, 200–230 against
//! 65–80 µs, and the write time), when a segment is finished, and on
//! [`History::flush`]: a killed daemon loses nothing (the page cache has
//! it), a power cut at most the last few seconds.
//!
//! At open, every segment's headers are read to rebuild the index; the
//! newest segment's payloads are checksummed too (the others were synced
//! whole before a newer one began; their payloads are checked on each
//! [`History::read`]). The index costs 32 bytes per block and is bounded
//! to one entry per 2 KiB of `max_bytes`.
//!
//! The directory is locked (`flock`) while open: a second daemon on it
//! gets [`HistoryError::InUse`].
//!
//! Failures to write (read-only or full disk) degrade, never stop: the
//! reason is logged once and shown in [`HistoryStats::degraded`], blocks
//! are dropped (counted) and writing is retried once a minute.

mod dir;
mod index;
mod segment;
mod writer;

#[cfg(test)]
mod damage_tests;
#[cfg(test)]
mod tests;

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        mpsc, Arc, Mutex, MutexGuard,
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use dir::{charged, HistoryDir};
use index::{Entry, Index};

pub use segment::MAX_PAYLOAD;

/// Size past which the writer starts a new segment.
pub const SEGMENT_MAX: u64 = 32 << 20;
/// Most payload bytes waiting for the writer; past it blocks are dropped.
pub const QUEUE_MAX_BYTES: u64 = 8 << 20;
/// How often written data are synced to the disk.
pub const SYNC_EVERY: Duration = Duration::from_secs(5);
/// How often writing is retried after a failure.
pub const RETRY_EVERY: Duration = Duration::from_secs(60);
/// The smallest bound accepted: a few segments' worth.
pub const MIN_MAX_BYTES: u64 = 1 << 20;
/// Bytes of `max_bytes` per index entry allowed (bounds the index's memory
/// to 1/64 of the disk bound).
const BYTES_PER_ENTRY: u64 = 2048;

/// Where the history lives and how large it may grow.
#[derive(Debug, Clone)]
pub struct HistoryConfig {
    pub dir: PathBuf,
    pub max_bytes: u64,
}

/// What time a block covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockMeta {
    pub start: SystemTime,
    pub end: SystemTime,
    /// The block's resolution.
    pub step_s: u32,
}

/// A block held on disk: its time and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlock {
    pub meta: BlockMeta,
    segment: u64,
    entry: Entry,
}

impl StoredBlock {
    /// Bytes of its payload.
    pub fn payload_len(&self) -> u32 {
        self.entry.len
    }
}

/// Why the history could not be opened or a block read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("history directory {0} is a symbolic link")]
    Symlink(PathBuf),
    #[error("history directory {0} is not a directory")]
    NotDir(PathBuf),
    #[error(
        "history directory {path} is writable by others (mode {mode:o}); it must be 0700 or 0755"
    )]
    Exposed { path: PathBuf, mode: u32 },
    #[error("history directory {path} is owned by uid {uid}, not by the daemon's uid {euid}")]
    Owner { path: PathBuf, uid: u32, euid: u32 },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("history directory {0} is in use by another process")]
    InUse(PathBuf),
    #[error("history bound {max_bytes} bytes is below the least accepted, {min}")]
    TooSmall { max_bytes: u64, min: u64 },
    #[error("starting the history writer: {0}")]
    Spawn(std::io::Error),
    #[error("block in segment {segment} is gone (deleted at the disk bound)")]
    Gone { segment: u64 },
    #[error("block at {offset} in segment {segment}: {why}")]
    Corrupt {
        segment: u64,
        offset: u64,
        why: String,
    },
}

/// The history's state, for `/healthz` and `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HistoryStats {
    pub dir: String,
    /// On-disk bytes of the segments (whole 4 KiB blocks per file).
    pub bytes: u64,
    pub max_bytes: u64,
    pub blocks: u64,
    pub segments: u64,
    /// Unix seconds of the oldest block's start and the newest's end.
    pub oldest: Option<u64>,
    pub newest: Option<u64>,
    /// Seconds of time the blocks cover (gaps not counted).
    pub seconds: u64,
    pub blocks_written: u64,
    pub write_errors: u64,
    /// Torn or corrupt records skipped by the scans at open.
    pub torn_blocks: u64,
    pub read_errors: u64,
    /// Blocks not written: queue full, writing degraded, or too large.
    pub dropped_blocks: u64,
    /// Why writing stopped, while it is stopped.
    pub degraded: Option<String>,
    pub queue_bytes: u64,
}

/// Timing the tests shorten.
#[derive(Debug, Clone, Copy)]
struct Tuning {
    sync_every: Duration,
    retry_every: Duration,
}

const TUNING: Tuning = Tuning {
    sync_every: SYNC_EVERY,
    retry_every: RETRY_EVERY,
};

/// Counters, shared by the callers and the writer.
#[derive(Debug, Default)]
struct Counters {
    blocks_written: AtomicU64,
    write_errors: AtomicU64,
    torn_blocks: AtomicU64,
    read_errors: AtomicU64,
    dropped_blocks: AtomicU64,
    queue_bytes: AtomicU64,
    /// While degraded: when (ms after `Shared::epoch`, at least 1) the next
    /// write may be tried; 0 when writing works.
    retry_at_ms: AtomicU64,
}

/// What the callers and the writer thread share.
struct Shared {
    dir: HistoryDir,
    max_bytes: u64,
    max_entries: usize,
    index: Mutex<Index>,
    counters: Counters,
    degraded: Mutex<Option<String>>,
    /// The segment read last, kept open: a range read is thousands of
    /// blocks from a few segments (opening each time was half its cost).
    reading: Mutex<Option<(u64, Arc<std::fs::File>)>>,
    epoch: Instant,
    tuning: Tuning,
}

impl Shared {
    fn index(&self) -> MutexGuard<'_, Index> {
        // A panic elsewhere while holding it leaves the index consistent
        // enough to read (every update is a few field writes).
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn degraded(&self) -> MutexGuard<'_, Option<String>> {
        self.degraded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Segment `id`, open for reading.
    fn reader(&self, id: u64) -> std::io::Result<Arc<std::fs::File>> {
        let mut reading = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        match &*reading {
            Some((open, file)) if *open == id => Ok(file.clone()),
            _ => {
                let file = Arc::new(self.dir.open_read(id)?);
                *reading = Some((id, file.clone()));
                Ok(file)
            }
        }
    }

    /// Closes segment `id` if it is open for reading: it is being deleted,
    /// and an open descriptor would keep its bytes on the disk.
    fn forget_reader(&self, id: u64) {
        let mut reading = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        if reading.as_ref().is_some_and(|(open, _)| *open == id) {
            *reading = None;
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Whether writing is stopped and not yet due for a retry.
    fn waiting_to_retry(&self) -> bool {
        let at = self.counters.retry_at_ms.load(Relaxed);
        at != 0 && self.now_ms() < at
    }
}

/// A block for the writer.
struct Pending {
    start_ns: u64,
    end_ns: u64,
    step_s: u32,
    payload: Vec<u8>,
}

/// What the writer thread is asked.
enum Job {
    Write(Pending),
    /// Sync, then answer.
    Flush(mpsc::SyncSender<()>),
    Stop,
}

/// The on-disk history (see the module's doc). Share it as `Arc<History>`.
pub struct History {
    shared: Arc<Shared>,
    jobs: mpsc::Sender<Job>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl History {
    /// Opens (creating 0700 if missing) and scans what is there: rebuilds
    /// the index, counts torn or corrupt records (skipped, never fatal),
    /// cuts a torn tail off the newest segment and starts the writer thread
    /// (`ws-history`).
    pub fn open(cfg: HistoryConfig) -> Result<Arc<History>, HistoryError> {
        History::open_tuned(cfg, TUNING)
    }

    fn open_tuned(cfg: HistoryConfig, tuning: Tuning) -> Result<Arc<History>, HistoryError> {
        if cfg.max_bytes < MIN_MAX_BYTES {
            return Err(HistoryError::TooSmall {
                max_bytes: cfg.max_bytes,
                min: MIN_MAX_BYTES,
            });
        }
        let dir = HistoryDir::open(&cfg.dir)?;
        let max_entries = (cfg.max_bytes / BYTES_PER_ENTRY) as usize;
        let (index, torn, next_id) = writer::load(&dir, cfg.max_bytes, max_entries)?;
        let shared = Arc::new(Shared {
            dir,
            max_bytes: cfg.max_bytes,
            max_entries,
            index: Mutex::new(index),
            counters: Counters::default(),
            degraded: Mutex::new(None),
            reading: Mutex::new(None),
            epoch: Instant::now(),
            tuning,
        });
        shared.counters.torn_blocks.store(torn, Relaxed);
        let (jobs, rx) = mpsc::channel();
        let writer = writer::spawn(shared.clone(), rx, next_id).map_err(HistoryError::Spawn)?;
        Ok(Arc::new(History {
            shared,
            jobs,
            writer: Mutex::new(Some(writer)),
        }))
    }

    /// Queues a block for the writer and returns at once: never blocks the
    /// caller. Dropped (counted) when the queue holds [`QUEUE_MAX_BYTES`],
    /// while writing is degraded and not due for a retry, or when larger
    /// than [`MAX_PAYLOAD`].
    pub fn submit(&self, meta: BlockMeta, payload: Vec<u8>) {
        let c = &self.shared.counters;
        let len = payload.len() as u64;
        if len > u64::from(MAX_PAYLOAD) || self.shared.waiting_to_retry() {
            c.dropped_blocks.fetch_add(1, Relaxed);
            return;
        }
        if c.queue_bytes.fetch_add(len, Relaxed) + len > QUEUE_MAX_BYTES {
            c.queue_bytes.fetch_sub(len, Relaxed);
            c.dropped_blocks.fetch_add(1, Relaxed);
            return;
        }
        let start_ns = to_ns(meta.start);
        let pending = Pending {
            start_ns,
            end_ns: to_ns(meta.end).max(start_ns),
            step_s: meta.step_s,
            payload,
        };
        if self.jobs.send(Job::Write(pending)).is_err() {
            c.queue_bytes.fetch_sub(len, Relaxed);
            c.dropped_blocks.fetch_add(1, Relaxed);
        }
    }

    /// Blocks overlapping `[from, until)`, oldest first, from the in-memory
    /// index (no disk I/O).
    pub fn blocks(&self, from: SystemTime, until: SystemTime) -> Vec<StoredBlock> {
        let found = self.shared.index().overlapping(to_ns(from), to_ns(until));
        found
            .into_iter()
            .map(|(segment, entry)| StoredBlock {
                meta: BlockMeta {
                    start: from_ns(entry.start_ns),
                    end: from_ns(entry.end_ns),
                    step_s: entry.step_s,
                },
                segment,
                entry,
            })
            .collect()
    }

    /// Reads one block and checks its checksum. A block deleted at the disk
    /// bound since [`History::blocks`] listed it, or corrupt, is an error
    /// (counted in `read_errors`).
    pub fn read(&self, block: &StoredBlock) -> Result<Vec<u8>, HistoryError> {
        let got = match self.shared.reader(block.segment) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(HistoryError::Gone {
                segment: block.segment,
            }),
            Err(e) => Err(corrupt(block, e.to_string())),
            Ok(file) => {
                segment::read_record(&file, &block.entry).map_err(|why| corrupt(block, why))
            }
        };
        if got.is_err() {
            self.shared.counters.read_errors.fetch_add(1, Relaxed);
        }
        got
    }

    /// The history's state.
    pub fn stats(&self) -> HistoryStats {
        let (bytes, blocks, segments, held_ns, span) = {
            let ix = self.shared.index();
            (
                ix.bytes,
                ix.blocks,
                ix.segments.len(),
                ix.held_ns,
                ix.span(),
            )
        };
        let c = &self.shared.counters;
        HistoryStats {
            dir: self.shared.dir.path().display().to_string(),
            bytes,
            max_bytes: self.shared.max_bytes,
            blocks: blocks as u64,
            segments: segments as u64,
            oldest: span.oldest_ns.map(|ns| ns / 1_000_000_000),
            newest: span.newest_ns.map(|ns| ns.div_ceil(1_000_000_000)),
            seconds: held_ns / 1_000_000_000,
            blocks_written: c.blocks_written.load(Relaxed),
            write_errors: c.write_errors.load(Relaxed),
            torn_blocks: c.torn_blocks.load(Relaxed),
            read_errors: c.read_errors.load(Relaxed),
            dropped_blocks: c.dropped_blocks.load(Relaxed),
            degraded: self.shared.degraded().clone(),
            queue_bytes: c.queue_bytes.load(Relaxed),
        }
    }

    /// Waits up to `timeout` until everything submitted before the call is
    /// written and synced (or dropped); false if it was not in time.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (tx, rx) = mpsc::sync_channel(1);
        self.jobs.send(Job::Flush(tx)).is_ok() && rx.recv_timeout(timeout).is_ok()
    }
}

impl Drop for History {
    /// Stops the writer after it has written and synced what was queued.
    fn drop(&mut self) {
        let _ = self.jobs.send(Job::Stop);
        let handle = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }
}

fn corrupt(block: &StoredBlock, why: String) -> HistoryError {
    HistoryError::Corrupt {
        segment: block.segment,
        offset: block.entry.offset,
        why,
    }
}

/// Nanoseconds since the Unix epoch (0 before it; saturating in 2554).
fn to_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn from_ns(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}
