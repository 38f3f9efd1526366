//! Loading the index at open, and the writer thread: appends queued blocks
//! to the newest segment, rotates, deletes the oldest segments before the
//! bound would be passed, syncs on a cadence, and degrades on failure.

use std::{
    fs::File,
    io::{self, Write},
    sync::{atomic::Ordering::Relaxed, mpsc, Arc},
    thread::JoinHandle,
    time::Instant,
};

use super::{
    charged,
    index::{Entry, Index, Segment},
    segment::{self, Header, HEADER_LEN, SEGMENT_MAGIC},
    HistoryDir, HistoryError, Job, Pending, Shared, SEGMENT_MAX,
};

/// Reads what the directory holds, newest segment first, keeping what fits
/// in the bounds (deleting older segments past them, and empty ones).
/// Returns the index, the torn records counted and the next segment id.
pub(super) fn load(
    dir: &HistoryDir,
    max_bytes: u64,
    max_entries: usize,
) -> Result<(Index, u64, u64), HistoryError> {
    let ids = dir.segment_ids().map_err(|source| HistoryError::Io {
        what: "listing",
        path: dir.path().to_path_buf(),
        source,
    })?;
    let next_id = ids.last().map_or(0, |id| id.saturating_add(1));
    let (mut kept, mut bytes, mut entries, mut torn) = (Vec::new(), 0u64, 0usize, 0u64);
    for (i, &id) in ids.iter().rev().enumerate() {
        let Some((seg, t)) = load_segment(dir, id, i == 0, max_entries - entries) else {
            torn += 1;
            continue;
        };
        torn += t;
        if seg.entries.is_empty() || bytes + seg.charged > max_bytes || entries >= max_entries {
            // Best effort: a read-only directory keeps them, unindexed.
            let _ = dir.remove(id);
            continue;
        }
        bytes += seg.charged;
        entries += seg.entries.len();
        kept.push(seg);
    }
    let mut index = Index::default();
    for seg in kept.into_iter().rev() {
        index.push_segment(seg);
    }
    Ok((index, torn, next_id))
}

/// Scans one segment; the newest has its payloads checked and a torn tail
/// cut off. `None` if it could not be read at all.
fn load_segment(dir: &HistoryDir, id: u64, newest: bool, room: usize) -> Option<(Segment, u64)> {
    let warn = |e: io::Error| {
        tracing::warn!(
            "history: skipping {}: {e}",
            dir.shown(&super::dir::segment_name(id)).display()
        );
    };
    let file = dir.open_read(id).map_err(warn).ok()?;
    let mut len = file.metadata().map_err(warn).ok()?.len();
    let scan = segment::scan(&file, len, newest, room).map_err(warn).ok()?;
    if newest && scan.valid_end < len && !scan.entries.is_empty() {
        // Cut so the count is not repeated at the next open; appends go to
        // a new segment anyway.
        let cut = dir.open_write(id).and_then(|f| {
            f.set_len(scan.valid_end)?;
            f.sync_data()
        });
        if cut.is_ok() {
            len = scan.valid_end;
        }
    }
    let seg = Segment {
        id,
        charged: charged(len),
        entries: scan.entries,
    };
    Some((seg, scan.torn))
}

/// Starts the writer thread.
pub(super) fn spawn(
    shared: Arc<Shared>,
    jobs: mpsc::Receiver<Job>,
    next_id: u64,
) -> io::Result<JoinHandle<()>> {
    let seg_target = (shared.max_bytes / 8).clamp(64 << 10, SEGMENT_MAX);
    let mut writer = Writer {
        shared,
        active: None,
        next_id,
        seg_target,
        dirty: false,
        dir_dirty: false,
        last_sync: Instant::now(),
        buf: Vec::new(),
    };
    std::thread::Builder::new()
        .name("ws-history".into())
        .spawn(move || writer.run(jobs))
}

/// The segment being appended to.
struct Active {
    id: u64,
    file: File,
    len: u64,
}

struct Writer {
    shared: Arc<Shared>,
    active: Option<Active>,
    next_id: u64,
    seg_target: u64,
    /// Data written since the last sync.
    dirty: bool,
    /// Names created or deleted since the last sync.
    dir_dirty: bool,
    last_sync: Instant,
    /// Header and payload, joined so a record is one `write`.
    buf: Vec<u8>,
}

/// A failed step: what was being done and the error.
type Failure = (String, io::Error);

impl Writer {
    fn run(&mut self, jobs: mpsc::Receiver<Job>) {
        let every = self.shared.tuning.sync_every;
        loop {
            let job = if self.dirty || self.dir_dirty {
                let left = every.saturating_sub(self.last_sync.elapsed());
                jobs.recv_timeout(left)
            } else {
                jobs.recv()
                    .map_err(|_| mpsc::RecvTimeoutError::Disconnected)
            };
            match job {
                Ok(Job::Write(p)) => {
                    let c = &self.shared.counters;
                    c.queue_bytes.fetch_sub(p.payload.len() as u64, Relaxed);
                    self.write(p);
                    if self.last_sync.elapsed() >= every {
                        self.sync();
                    }
                }
                Ok(Job::Flush(done)) => {
                    self.sync();
                    let _ = done.send(());
                }
                Err(mpsc::RecvTimeoutError::Timeout) => self.sync(),
                Ok(Job::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.sync();
                    return;
                }
            }
        }
    }

    /// Writes one block, or drops it (counted) while degraded.
    fn write(&mut self, p: Pending) {
        let shared = self.shared.clone();
        let c = &shared.counters;
        let record = HEADER_LEN as u64 + p.payload.len() as u64;
        if self.shared.waiting_to_retry()
            || charged(SEGMENT_MAGIC.len() as u64 + record) > self.shared.max_bytes
        {
            c.dropped_blocks.fetch_add(1, Relaxed);
            return;
        }
        match self.append(&p, record) {
            Ok(()) => {
                c.blocks_written.fetch_add(1, Relaxed);
                self.recovered();
            }
            Err((what, e)) => {
                c.dropped_blocks.fetch_add(1, Relaxed);
                self.fail(what, e);
            }
        }
    }

    fn append(&mut self, p: &Pending, record: u64) -> Result<(), Failure> {
        if self
            .active
            .as_ref()
            .is_some_and(|a| a.len + record > self.seg_target)
        {
            self.seal()?;
        }
        self.make_room(record)?;
        if self.active.is_none() {
            self.start_segment()?;
        }
        let header = Header::of(&p.payload, p.start_ns, p.end_ns, p.step_s);
        self.buf.clear();
        self.buf.extend_from_slice(&header.encode());
        self.buf.extend_from_slice(&p.payload);
        let Some(a) = self.active.as_mut() else {
            return Ok(()); // start_segment set it
        };
        let (id, offset) = (a.id, a.len);
        if let Err(e) = a.file.write_all(&self.buf) {
            let what = format!("writing {}", self.shown(id));
            self.abandon_active(offset);
            return Err((what, e));
        }
        a.len += record;
        let len = a.len;
        self.dirty = true;
        let entry = Entry::new(&header, offset);
        self.shared.index().append(id, entry, charged(len));
        Ok(())
    }

    /// Deletes the oldest segments until the record fits in the bounds.
    fn make_room(&mut self, record: u64) -> Result<(), Failure> {
        loop {
            let oldest = {
                let ix = self.shared.index();
                let growth = match &self.active {
                    Some(a) => charged(a.len + record) - charged(a.len),
                    None => charged(SEGMENT_MAGIC.len() as u64 + record),
                };
                let fits = ix.bytes + growth <= self.shared.max_bytes
                    && ix.blocks < self.shared.max_entries;
                match ix.segments.front() {
                    Some(seg) if !fits => seg.id,
                    _ => return Ok(()),
                }
            };
            if self.active.as_ref().is_some_and(|a| a.id == oldest) {
                self.seal()?;
            }
            self.shared.index().pop_oldest();
            self.shared.forget_reader(oldest);
            match self.shared.dir.remove(oldest) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err((format!("deleting {}", self.shown(oldest)), e))
                }
                _ => self.dir_dirty = true,
            }
        }
    }

    fn start_segment(&mut self) -> Result<(), Failure> {
        let id = self.next_id;
        self.next_id += 1;
        let what = format!("creating {}", self.shown(id));
        let mut file = match self.shared.dir.create(id) {
            Ok(file) => file,
            Err(e) => return Err((what, e)),
        };
        self.dir_dirty = true;
        let len = SEGMENT_MAGIC.len() as u64;
        self.shared.index().push_segment(Segment {
            id,
            charged: charged(len),
            entries: Vec::new(),
        });
        if let Err(e) = file.write_all(&SEGMENT_MAGIC) {
            self.active = Some(Active { id, file, len: 0 });
            self.abandon_active(0);
            return Err((what, e));
        }
        self.active = Some(Active { id, file, len });
        Ok(())
    }

    /// Syncs and closes the active segment: it is complete.
    fn seal(&mut self) -> Result<(), Failure> {
        self.sync_active()?;
        self.active = None;
        Ok(())
    }

    /// After a failed write: cuts the partial record off (or, failing that,
    /// charges the segment's real size) and stops appending to it.
    fn abandon_active(&mut self, good_len: u64) {
        let Some(a) = self.active.take() else { return };
        let len = match a.file.set_len(good_len) {
            Ok(()) => good_len,
            Err(_) => a.file.metadata().map_or(a.len, |m| m.len()),
        };
        self.shared.index().set_charged(a.id, charged(len));
    }

    fn sync_active(&mut self) -> Result<(), Failure> {
        if let (true, Some(a)) = (self.dirty, &self.active) {
            a.file
                .sync_data()
                .map_err(|e| (format!("syncing {}", self.shown(a.id)), e))?;
        }
        self.dirty = false;
        Ok(())
    }

    /// Syncs written data and directory changes.
    fn sync(&mut self) {
        self.last_sync = Instant::now();
        let mut done = self.sync_active();
        if done.is_ok() && self.dir_dirty {
            done = self.shared.dir.sync().map_err(|e| {
                let what = format!("syncing {}", self.shared.dir.path().display());
                (what, e)
            });
            self.dir_dirty = false;
        }
        if let Err((what, e)) = done {
            self.active = None;
            self.fail(what, e);
        }
    }

    /// Counts a failure, logs it once per stretch of failures, drops the
    /// block and waits a while before trying again.
    fn fail(&mut self, what: String, e: io::Error) {
        let c = &self.shared.counters;
        c.write_errors.fetch_add(1, Relaxed);
        let retry = self.shared.tuning.retry_every.as_millis() as u64;
        c.retry_at_ms.store(self.shared.now_ms() + retry, Relaxed);
        let reason = format!("{what}: {e}");
        let mut degraded = self.shared.degraded();
        if degraded.is_none() {
            tracing::warn!(
                "history: {reason}; keeping history in memory only, retrying every {} s",
                retry / 1000
            );
        }
        *degraded = Some(reason);
    }

    /// Clears the degraded state after a write succeeded.
    fn recovered(&mut self) {
        if self.shared.counters.retry_at_ms.swap(0, Relaxed) != 0 {
            *self.shared.degraded() = None;
            tracing::info!("history: writing to disk again");
        }
    }

    fn shown(&self, id: u64) -> String {
        let name = super::dir::segment_name(id);
        self.shared.dir.shown(&name).display().to_string()
    }
}
