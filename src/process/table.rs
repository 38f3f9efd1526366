//! Processes by pid, each with its recent images, newest last.
//!
//! Bounds: at most [`MAX_IMAGES`] images in all and [`IMAGES_PER_PID`] per
//! pid, and the budget's `process_table` part in bytes (see [`bytes`]); an
//! image that ended (its process exited or exec'd) is dropped
//! [`KEEP_ENDED`] after it ended, and past either bound the ones that
//! ended first go first, then the oldest live ones (counted as evicted).

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use rustc_hash::FxHashMap;
use serde::Serialize;

use super::changes::{ChangeKind, ProcKey, Publisher, Subscription};
use super::maps::ProcMaps;
use crate::bpf::abi::COMM_LEN;
use image::Image;

/// Most images held (live and recently ended, all pids).
pub const MAX_IMAGES: usize = 32_768;
/// How long an ended image is kept for the samples still being drained
/// and symbolized: the drain interval plus the symbolizer's queue, with
/// room to spare.
pub const KEEP_ENDED: Duration = Duration::from_secs(30);
/// Images kept per pid (a process that execs a few times in a row, or a
/// pid reused quickly).
const IMAGES_PER_PID: usize = 4;
/// Wait after an exec before reading the new image's maps: the dynamic
/// loader maps the libraries within the first milliseconds.
pub const SETTLE: Duration = Duration::from_millis(10);
/// A second read after an exec, for what the program loads itself.
const SECOND_LOOK: Duration = Duration::from_secs(1);
/// A live image's maps are re-read (after a lookup missed them) at most
/// this often: frame-pointer walks through code without frame pointers
/// give junk addresses that never resolve.
const REFRESH_EVERY: Duration = Duration::from_secs(10);
/// Live processes whose exit event was lost are found this often.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// How long after exec a `java` launcher is watched for its libjvm, and
/// how often.
const LAUNCHER_WATCH: Duration = Duration::from_secs(3);
const LAUNCHER_LOOK: Duration = Duration::from_millis(15);

/// The `java` launcher (it links libjli), before it has loaded libjvm.
fn is_java_launcher(maps: &ProcMaps) -> bool {
    maps.iter().any(|m| match &m.backing {
        super::maps::Backing::File { path, .. } => path.ends_with("libjli.so"),
        _ => false,
    })
}

/// Counters of the table, for `/healthz` and `/metrics`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableStats {
    /// Live processes known.
    pub processes: u64,
    /// Images held (live and recently ended).
    pub images: u64,
    pub forks: u64,
    pub execs: u64,
    pub exits: u64,
    pub renames: u64,
    /// Processes found in `/proc` without an event (running before the
    /// daemon started, or an event was lost).
    pub discovered: u64,
    /// Reads of a process's maps, and those that failed (the process
    /// exited while it was read, or before its exit event was applied).
    pub maps_reads: u64,
    pub maps_read_failures: u64,
    /// Reads not made: the process had exited (its event applied) before
    /// its maps were due.
    pub maps_reads_skipped: u64,
    /// Images dropped to stay within [`MAX_IMAGES`] or the table's bytes
    /// while still wanted.
    pub evicted: u64,
    /// Changes not delivered to a subscriber whose queue was full.
    pub changes_dropped: u64,
}

#[derive(Default)]
struct Inner {
    pids: FxHashMap<u32, Vec<Arc<Image>>>,
    images: usize,
    /// Bytes the images hold, kept as they come and go, and counted again
    /// once a batch ([`ProcessTable::stats`]).
    bytes: usize,
    /// Maps to read once the image has settled: (when, pid, start_ns).
    due: BinaryHeap<Reverse<(Instant, u32, u64)>>,
    stats: TableStats,
    last_sweep: Option<Instant>,
    publisher: Publisher,
}

/// The table every stage reads processes from. Cheap to query: readers get
/// `Arc<Image>`s and never hold the lock while reading `/proc`.
#[derive(Default)]
pub struct ProcessTable {
    inner: Mutex<Inner>,
}

impl ProcessTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A subscription to the table's changes, from now on.
    pub fn subscribe(self: &Arc<Self>) -> Subscription {
        let (rx, lost) = self.lock().publisher.add();
        Subscription::new(self.clone(), rx, lost)
    }

    /// Whether the table holds the process (alive, or ended less than
    /// [`KEEP_ENDED`] ago).
    pub fn knows(&self, key: ProcKey) -> bool {
        self.lock()
            .pids
            .get(&key.pid)
            .is_some_and(|images| images.iter().any(|i| i.key() == key))
    }

    /// The newest process with pid `pid` the table holds (alive, or ended
    /// less than [`KEEP_ENDED`] ago).
    pub fn newest(&self, pid: u32) -> Option<ProcKey> {
        Some(self.lock().pids.get(&pid)?.last()?.key())
    }

    /// `pid`'s live image, found in `/proc` if the table has none, its
    /// maps read if they were not yet.
    pub fn live(&self, pid: u32) -> Option<Arc<Image>> {
        self.lookup(pid, "", Instant::now())
            .filter(|i| i.ended.is_none())
    }

    /// Processes whose maps are due for a scheduled read, oldest first.
    pub fn due_reads(&self, now: Instant) -> Vec<(u32, u64)> {
        let mut inner = self.lock();
        let mut due = Vec::new();
        while inner
            .due
            .peek()
            .is_some_and(|Reverse((at, _, _))| *at <= now)
        {
            if let Some(Reverse((_, pid, start))) = inner.due.pop() {
                due.push((pid, start));
            }
        }
        due
    }

    /// When the next scheduled read is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.lock().due.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Reads the maps of `pid`'s live image started at `start_ns` (any
    /// live image when 0) and stores them; `None` when it is gone.
    pub fn read_maps(&self, pid: u32, start_ns: u64) -> Option<Arc<Image>> {
        let wanted = |i: &Image| start_ns == 0 || i.start_ns == start_ns || i.start_ns == 0;
        {
            let mut inner = self.lock();
            if !inner.live(pid).is_some_and(|i| wanted(i)) {
                // It exited (or exec'd) before its maps were due: most
                // processes of a busy host live a few ms (`/bin/true`).
                inner.stats.maps_reads_skipped += 1;
                return None;
            }
        }
        let read = ProcMaps::read(pid);
        let now = Instant::now();
        let mut inner = self.lock();
        inner.stats.maps_reads += 1;
        let Ok(maps) = read else {
            inner.stats.maps_read_failures += 1;
            return None;
        };
        let slot = inner.live_mut(pid).filter(|i| wanted(i))?;
        let was_jvm = slot.jvm;
        let launcher = is_java_launcher(&maps);
        *slot = Arc::new(slot.with_maps(maps, now));
        let image = slot.clone();
        if image.jvm && !was_jvm {
            inner.publisher.publish(image.key(), ChangeKind::JvmFound);
        } else if !image.jvm && launcher && now.duration_since(image.began) < LAUNCHER_WATCH {
            // The `java` launcher loads libjvm a few ms after exec: look
            // again soon, so the JVM is prepared (see `take_new_jvms`)
            // before it compiles anything.
            inner
                .due
                .push(Reverse((now + LAUNCHER_LOOK, pid, image.start_ns)));
        }
        Some(image)
    }

    /// The image `pid` ran under while the thread named `comm` was seen,
    /// at some time since `since`: when the pid changed program (exec) or
    /// owner (reuse) in that time, the image whose name is `comm`, else the
    /// newest. A pid not in the table is looked up in `/proc`; a live image
    /// whose maps were never read is read now.
    pub fn lookup(&self, pid: u32, comm: &str, since: Instant) -> Option<Arc<Image>> {
        Some(self.lookup_with_rivals(pid, comm, since)?.0)
    }

    /// [`ProcessTable::lookup`], also telling whether other images of the
    /// pid existed since `since` (when not, the thread name did not matter).
    pub fn lookup_with_rivals(
        &self,
        pid: u32,
        comm: &str,
        since: Instant,
    ) -> Option<(Arc<Image>, bool)> {
        let found = {
            let inner = self.lock();
            inner.pids.get(&pid).and_then(|images| {
                let mut alive = images.iter().filter(|i| i.alive_since(since));
                let rivals = alive.clone().count() > 1;
                let by_name = alive.clone().rev().find(|i| same_name(&i.name, comm));
                by_name
                    .or_else(|| alive.next_back())
                    .map(|i| (i.clone(), rivals))
            })
        };
        match found {
            Some((image, rivals)) if image.maps_read.is_some() || image.ended.is_some() => {
                Some((image, rivals))
            }
            Some((image, rivals)) => {
                Some((self.read_maps(pid, image.start_ns).unwrap_or(image), rivals))
            }
            None => Some((self.discover(pid)?, false)),
        }
    }

    /// Re-reads a live image's maps after a lookup missed an address in
    /// them (a library loaded since), at most every [`REFRESH_EVERY`].
    pub fn refresh(&self, image: &Image) -> Option<Arc<Image>> {
        let stale = image.ended.is_none()
            && image
                .maps_read
                .is_none_or(|at| at.elapsed() >= REFRESH_EVERY);
        if !stale {
            return None;
        }
        self.read_maps(image.pid, image.start_ns)
    }

    /// Drops images that ended more than [`KEEP_ENDED`] ago and, every
    /// [`SWEEP_EVERY`], ends live ones whose process is gone (their exit
    /// event was lost).
    pub fn expire(&self, now: Instant) {
        let sweep = {
            let mut inner = self.lock();
            inner.pids.retain(|_, images| {
                images.retain(|i| i.ended.is_none_or(|end| now - end < KEEP_ENDED));
                !images.is_empty()
            });
            inner.images = inner.pids.values().map(Vec::len).sum();
            let due = inner.last_sweep.is_none_or(|at| now - at >= SWEEP_EVERY);
            if due {
                inner.last_sweep = Some(now);
            }
            due.then(|| inner.live_pids())
        };
        let Some(pids) = sweep else {
            return;
        };
        let gone: Vec<u32> = pids
            .into_iter()
            .filter(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
            .collect();
        let mut inner = self.lock();
        for pid in gone {
            inner.end(pid, now);
        }
    }

    /// The table's counters.
    pub fn stats(&self) -> TableStats {
        let mut inner = self.lock();
        // Read once a batch (not by `/healthz`): the walk is of at most
        // MAX_IMAGES entries, which hold no lock but the table's.
        inner.bytes = inner.bytes();
        inner.make_room(0);
        crate::held::set(
            crate::held::Holder::ProcessTable,
            inner.bytes as u64,
            Some(bytes::max_bytes() as u64),
        );
        TableStats {
            changes_dropped: inner.publisher.dropped,
            images: inner.images as u64,
            processes: inner.live_pids().len() as u64,
            ..inner.stats.clone()
        }
    }

    /// Finds a process the table has no live image of in `/proc`.
    fn discover(&self, pid: u32) -> Option<Arc<Image>> {
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        let maps = ProcMaps::read(pid);
        let now = Instant::now();
        let mut inner = self.lock();
        inner.stats.discovered += 1;
        inner.stats.maps_reads += 1;
        if let Some(live) = inner.live(pid) {
            // An event came first.
            return Some(live.clone());
        }
        let image = Image::new(pid, 0, name.trim_end().to_string(), now);
        let image = match maps {
            Ok(maps) => image.with_maps(maps, now),
            Err(_) => {
                inner.stats.maps_read_failures += 1;
                image
            }
        };
        let image = inner.push(image, now);
        inner.publisher.publish(image.key(), ChangeKind::New);
        if image.jvm {
            inner.publisher.publish(image.key(), ChangeKind::JvmFound);
        }
        Some(image)
    }
}

impl Inner {
    fn live(&self, pid: u32) -> Option<&Arc<Image>> {
        self.pids
            .get(&pid)?
            .iter()
            .rev()
            .find(|i| i.ended.is_none())
    }

    fn live_mut(&mut self, pid: u32) -> Option<&mut Arc<Image>> {
        self.pids
            .get_mut(&pid)?
            .iter_mut()
            .rev()
            .find(|i| i.ended.is_none())
    }

    fn live_pids(&self) -> Vec<u32> {
        self.pids
            .iter()
            .filter(|(_, images)| images.iter().any(|i| i.ended.is_none()))
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// Ends `pid`'s live images (the process exited or exec'd, or its pid
    /// now names another), telling the subscribers.
    fn end(&mut self, pid: u32, now: Instant) {
        let Some(images) = self.pids.get_mut(&pid) else {
            return;
        };
        for slot in images.iter_mut().filter(|i| i.ended.is_none()) {
            *slot = Arc::new(Image {
                ended: Some(now),
                ..(**slot).clone()
            });
            self.publisher.publish(slot.key(), ChangeKind::Exit);
        }
    }

    /// Adds a new image for its pid, ending the previous one (the pid
    /// exec'd, or was reused after an exit whose event was lost).
    fn push(&mut self, image: Image, now: Instant) -> Arc<Image> {
        self.end(image.pid, now);
        if self.images >= MAX_IMAGES {
            self.evict();
        }
        let image = Arc::new(image);
        self.make_room(bytes::of_image(&image));
        self.bytes += bytes::of_image(&image);
        let images = self.pids.entry(image.pid).or_default();
        if images.len() >= IMAGES_PER_PID {
            let gone = images.remove(0);
            self.bytes = self.bytes.saturating_sub(bytes::of_image(&gone));
        } else {
            self.images += 1;
        }
        images.push(image.clone());
        image
    }

    /// Makes room for one image: the one that ended first, else the
    /// oldest live one; false if there was none.
    fn evict(&mut self) -> bool {
        let oldest = |want_ended: bool| {
            self.pids
                .iter()
                .flat_map(|(pid, images)| images.iter().enumerate().map(move |(k, i)| (*pid, k, i)))
                .filter(|(_, _, i)| i.ended.is_some() == want_ended)
                .min_by_key(|(_, _, i)| i.ended.unwrap_or(i.began))
                .map(|(pid, k, _)| (pid, k))
        };
        let Some((pid, k)) = oldest(true).or_else(|| oldest(false)) else {
            return false;
        };
        if let Some(images) = self.pids.get_mut(&pid) {
            let gone = images.remove(k);
            self.bytes = self.bytes.saturating_sub(bytes::of_image(&gone));
            if images.is_empty() {
                self.pids.remove(&pid);
            }
        }
        self.images -= 1;
        self.stats.evicted += 1;
        true
    }
}

/// Whether a process name matches a kernel thread name (cut to 15 bytes).
fn same_name(name: &str, comm: &str) -> bool {
    let cut = |s: &str| {
        let mut end = s.len().min(COMM_LEN - 1);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s[..end].to_string()
    };
    cut(name) == cut(comm)
}

#[cfg(test)]
mod tests;

mod ask;
mod bytes;
mod events;
pub(super) mod image;
