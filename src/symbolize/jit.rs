//! Per-process perf maps for JIT frames, re-read when the file changes
//! (checked at most once per batch per process).

use std::collections::HashMap;

use super::perfmap::{self, PerfMap};

/// Batches after which a process with no JIT lookup is forgotten.
const FORGET_AFTER_BATCHES: u64 = 120;

struct Entry {
    map: PerfMap,
    path: std::path::PathBuf,
    checked: u64,
    used: u64,
}

/// Perf maps by pid.
#[derive(Default)]
pub struct JitMaps {
    maps: HashMap<u32, Entry>,
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

    /// The JIT symbol at `addr` in `pid`, if its perf map names one.
    pub fn find(&mut self, pid: u32, addr: u64) -> Option<String> {
        let batch = self.batch;
        let entry = self.maps.entry(pid).or_insert_with(|| Entry {
            map: PerfMap::default(),
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
                    entry.map = map;
                }
            }
        }
        entry.map.find(addr).map(str::to_string)
    }
}
