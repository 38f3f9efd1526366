//! Per-process perf maps for JIT frames, re-read when the file changes
//! (checked at most once per batch per process). Each entry's frame is
//! made once per map read: a busy JVM's stacks are mostly JIT frames.

use rustc_hash::FxHashMap;

use super::perfmap::{self, PerfMap};
use crate::profile::Frame;

/// Batches after which a process with no JIT lookup is forgotten.
const FORGET_AFTER_BATCHES: u64 = 120;

struct Entry {
    map: PerfMap,
    /// Frames of the map's entries, made on first use.
    frames: Vec<Option<Frame>>,
    path: std::path::PathBuf,
    checked: u64,
    used: u64,
}

/// Perf maps by pid.
#[derive(Default)]
pub struct JitMaps {
    maps: FxHashMap<u32, Entry>,
    batch: u64,
}

impl JitMaps {
    /// Starts a batch; forgets processes not looked up for a while.
    pub fn begin_batch(&mut self) {
        self.batch += 1;
        let batch = self.batch;
        self.maps
            .retain(|_, e| batch - e.used < FORGET_AFTER_BATCHES);
    }

    /// The frame for `addr` in `pid`, if its perf map names it; `make`
    /// turns an entry's name into its frame (once per entry and map read).
    pub fn find(&mut self, pid: u32, addr: u64, make: impl FnOnce(&str) -> Frame) -> Option<Frame> {
        let batch = self.batch;
        let entry = self.maps.entry(pid).or_insert_with(|| Entry {
            map: PerfMap::default(),
            frames: Vec::new(),
            path: perfmap::path_for(pid, perfmap::ns_pid(pid)),
            checked: 0,
            used: batch,
        });
        entry.used = batch;
        if entry.checked != batch {
            entry.checked = batch;
            if entry.map.is_stale(&entry.path) {
                // A process without a perf map (or a gone one) keeps what it had.
                if let Ok(map) = PerfMap::read(&entry.path) {
                    entry.frames = vec![None; map.entry_count()];
                    entry.map = map;
                }
            }
        }
        let i = entry.map.index_of(addr)?;
        let slot = &mut entry.frames[i];
        Some(slot.get_or_insert_with(|| make(entry.map.name(i))).clone())
    }
}
