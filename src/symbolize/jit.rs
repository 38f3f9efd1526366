//! Per-process perf maps for JIT frames, re-read when the file changes
//! (checked at most once per batch per process). Each entry's frame is
//! made once per map read: a busy JVM's stacks are mostly JIT frames.
//!
//! Bounds: a map is forgotten after [`FORGET_AFTER_BATCHES`] batches
//! without a lookup, and all maps together hold at most
//! [`BUDGET_BYTES`] of names (least recently used maps are dropped first;
//! each is at most [`super::perfmap::MAX_BYTES`]).

use rustc_hash::FxHashMap;

use super::perfmap::{self, PerfMap, Stamp};
use crate::{procinfo, profile::Frame};

/// Batches after which a process with no JIT lookup is forgotten.
const FORGET_AFTER_BATCHES: u64 = 120;
/// Names held by all perf maps together.
pub const BUDGET_BYTES: usize = 256 << 20;

struct Entry {
    map: PerfMap,
    /// Frames of the map's entries, made on first use.
    frames: Vec<Option<Frame>>,
    ns_pid: u32,
    /// The file as it was when refused: not tried (nor counted) again
    /// until it changes.
    refused: Option<Stamp>,
    bytes: usize,
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

    /// Drops every frame made so far (the symbolizer's name budget ran
    /// out); maps stay and make their frames again on use.
    pub fn clear_frames(&mut self) {
        for e in self.maps.values_mut() {
            e.frames.iter_mut().for_each(|f| *f = None);
        }
    }

    /// The frame for `addr` in `pid`, if its perf map names it; `make`
    /// turns an entry's name into its frame (once per entry and map read).
    pub fn find(&mut self, pid: u32, addr: u64, make: impl FnOnce(&str) -> Frame) -> Option<Frame> {
        let batch = self.batch;
        let entry = self.maps.entry(pid).or_insert_with(|| Entry {
            map: PerfMap::default(),
            frames: Vec::new(),
            ns_pid: procinfo::Status::read(pid).map_or(pid, |s| s.ns_pid),
            refused: None,
            bytes: 0,
            checked: 0,
            used: batch,
        });
        entry.used = batch;
        if entry.checked != batch {
            entry.checked = batch;
            let now = perfmap::stamp(pid, entry.ns_pid);
            if now != entry.map.read_stamp() && (now.is_none() || now != entry.refused) {
                // A process without a perf map (or a refused one) keeps
                // what it had.
                match PerfMap::read(pid, entry.ns_pid) {
                    Ok(map) => {
                        entry.frames = vec![None; map.entry_count()];
                        entry.bytes = map.name_bytes();
                        entry.map = map;
                        self.enforce_budget(pid);
                    }
                    Err(err) => {
                        if err.reason().is_some() {
                            entry.refused = now;
                        }
                        tracing::debug!(pid, "perf map: {err}");
                    }
                }
            }
        }
        let entry = self.maps.get_mut(&pid)?;
        let i = entry.map.index_of(addr)?;
        let slot = &mut entry.frames[i];
        Some(slot.get_or_insert_with(|| make(entry.map.name(i))).clone())
    }

    /// Drops the least recently used maps other than `keep`'s while all
    /// maps hold more than [`BUDGET_BYTES`] of names.
    fn enforce_budget(&mut self, keep: u32) {
        let mut total: usize = self.maps.values().map(|e| e.bytes).sum();
        while total > BUDGET_BYTES {
            let Some((&oldest, e)) = self
                .maps
                .iter()
                .filter(|(pid, _)| **pid != keep)
                .min_by_key(|(_, e)| e.used)
            else {
                return;
            };
            total -= e.bytes;
            tracing::debug!(pid = oldest, "perf map dropped: over the JIT name budget");
            self.maps.remove(&oldest);
        }
    }
}
