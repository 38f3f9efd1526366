//! Per-process perf maps for JIT frames, re-read when the file changes
//! (checked at most once per batch per process). Each entry's frame is
//! made once per map read: a busy JVM's stacks are mostly JIT frames.
//!
//! Maps are kept per process (pid and start time), so a reused pid never
//! gets the previous process's map, and forgotten by the process table's
//! rule (see [`crate::process::Subscription`]).
//!
//! Bounds: all maps together hold at most
//! [`budget_bytes`] of names (least recently used maps are dropped first;
//! each is at most [`super::parse::MAX_BYTES`]).
//!
//! Reading is budgeted per process: [`READ_BYTES_PER_S`] on average, in
//! bursts of up to [`READ_BURST_BYTES`], and at most [`READ_STEP_BYTES`]
//! in one batch. An append-only map costs only what was appended; a
//! rewritten one is read anew aside while the last read serves; a map
//! rewritten faster than its budget allows keeps its last read (its
//! process's JIT frames go stale, counted `perf_map`/`budget`) and
//! nobody else's symbolization waits for it.
//!
//! The CPU time of that work (a process's per-batch look at its map and
//! the reading, the frame made for an entry) is its user's to pay
//! ([`crate::budget::cpu`]): a user past their budget gets no read and no
//! new frame ([`OVER_BUDGET`]) until it refills; frames already made are
//! handed out free.

use std::{
    sync::{Arc, LazyLock},
    time::Instant,
};

use rustc_hash::FxHashMap;

use super::parse::{self as perfmap, PerfMap, Progress, Stamp};
use crate::{
    budget::cpu,
    process::{ProcKey, ProcessTable},
    profile::model::Frame,
    untrusted::{
        self,
        refusals::{Reason, What},
    },
};

/// Names held by all perf maps together: the budget's `perf_map_names`
/// part.
pub fn budget_bytes() -> usize {
    crate::budget::bytes(crate::budget::Part::PerfMapNames)
}
/// Perf-map bytes read per second per process, on average.
pub const READ_BYTES_PER_S: f64 = (1 << 20) as f64;
/// Most perf-map bytes one process's budget holds: a fresh map of a few
/// MiB is read at once (in steps).
pub const READ_BURST_BYTES: f64 = (16 << 20) as f64;
/// Most perf-map bytes read for one process in one batch: a larger map is
/// read over several batches.
pub const READ_STEP_BYTES: u64 = 2 << 20;
/// The frame of an entry not named because its user was over their CPU
/// budget.
pub const OVER_BUDGET: &str = "[perf-map over budget]";
static OVER_BUDGET_FRAME: LazyLock<Frame> = LazyLock::new(|| Frame::from(OVER_BUDGET));

/// A process's perf-map read budget: a token bucket that may go into
/// debt by one read (a read is allowed once the bucket holds what it
/// should cost, or is full).
struct ReadBudget {
    tokens: f64,
    at: Instant,
}

impl ReadBudget {
    fn new() -> Self {
        ReadBudget {
            tokens: READ_BURST_BYTES,
            at: Instant::now(),
        }
    }

    /// Whether a read of about `bytes` may go now.
    fn allows(&mut self, bytes: u64) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * READ_BYTES_PER_S;
        self.tokens = (self.tokens + refill).min(READ_BURST_BYTES);
        self.at = now;
        self.tokens >= (bytes as f64).min(READ_BURST_BYTES)
    }

    fn spend(&mut self, bytes: u64) {
        self.tokens -= bytes as f64;
    }
}

struct Entry {
    map: PerfMap,
    /// Frames of the map's entries, made on first use.
    frames: Vec<Option<Frame>>,
    ns_pid: u32,
    /// The process's effective user, who pays for the work.
    uid: u32,
    /// The file as it was when refused: not tried (nor counted) again
    /// until it changes.
    refused: Option<Stamp>,
    /// The file read anew after a rewrite, while `map` still serves.
    building: Option<PerfMap>,
    /// The file as it was when last put off for the read budget (counted
    /// once per change).
    deferred: Option<Stamp>,
    budget: ReadBudget,
    bytes: usize,
    checked: u64,
    used: u64,
}

impl Entry {
    /// Reads on in process `key`'s perf map (stamped `now`), one step of at
    /// most [`READ_STEP_BYTES`] within its read budget: appends into the map
    /// in use, a rewritten file into a map built aside (the old one serves
    /// lookups until the new one is read whole).
    fn read_on(&mut self, key: ProcKey, now: Option<Stamp>) {
        let pid = key.pid;
        let size = now.map_or(0, |(size, _)| size);
        let read = self.building.as_ref().unwrap_or(&self.map).read_offset();
        let cost = size.checked_sub(read).unwrap_or(size).min(READ_STEP_BYTES);
        if !self.budget.allows(cost) {
            if self.deferred != now {
                self.deferred = now;
                untrusted::refusals::count_for(What::PerfMap, Reason::Budget, pid);
            }
            return;
        }
        let ns_pid = self.ns_pid;
        let step = match self.building.as_mut() {
            Some(next) => next.update(key, ns_pid, READ_STEP_BYTES, true),
            None => match self.map.update(key, ns_pid, READ_STEP_BYTES, false) {
                Ok(Progress::Rewritten) => {
                    let next = self.building.insert(PerfMap::default());
                    next.update(key, ns_pid, READ_STEP_BYTES, true)
                }
                other => other.inspect(|_| {
                    self.frames = vec![None; self.map.entry_count()];
                }),
            },
        };
        match step {
            Ok(Progress::Read { bytes, done }) => {
                self.budget.spend(bytes);
                if done {
                    if let Some(next) = self.building.take() {
                        self.map = next;
                        self.frames = vec![None; self.map.entry_count()];
                    }
                }
                self.bytes =
                    self.map.name_bytes() + self.building.as_ref().map_or(0, PerfMap::name_bytes);
            }
            Ok(Progress::Rewritten) => {}
            Err(err) => {
                // A process without a perf map (or a refused one) keeps
                // what it had.
                self.building = None;
                if err.reason().is_some() {
                    self.refused = now;
                }
                tracing::debug!(pid, "perf map: {err}");
            }
        }
    }
}

/// Perf maps by process.
pub struct JitMaps {
    maps: FxHashMap<ProcKey, Entry>,
    batch: u64,
    /// Where a process's namespace pid and user come from.
    table: Arc<ProcessTable>,
}

impl JitMaps {
    /// No maps yet, of the processes of `table`.
    pub fn new(table: Arc<ProcessTable>) -> Self {
        JitMaps {
            maps: FxHashMap::default(),
            batch: 0,
            table,
        }
    }

    /// Starts a batch.
    pub fn begin_batch(&mut self) {
        self.batch += 1;
    }

    /// Drops `key`'s map.
    pub fn forget(&mut self, key: ProcKey) {
        self.maps.remove(&key);
    }

    /// Keeps the maps of the processes `keep` says.
    pub fn retain(&mut self, keep: &dyn Fn(ProcKey) -> bool) {
        self.maps.retain(|k, _| keep(*k));
    }

    /// Bytes of names the maps hold (those read aside for a rewritten map
    /// included), within [`budget_bytes`].
    pub fn bytes(&self) -> usize {
        self.maps.values().map(|e| e.bytes).sum()
    }

    /// Drops every frame made so far (the symbolizer's name budget ran
    /// out); maps stay and make their frames again on use.
    pub fn clear_frames(&mut self) {
        for e in self.maps.values_mut() {
            e.frames.iter_mut().for_each(|f| *f = None);
        }
    }

    /// The frame for `addr` in process `key`, if its perf map names it;
    /// `make` turns an entry's name into its frame (once per entry and map
    /// read).
    pub fn find(
        &mut self,
        key: ProcKey,
        addr: u64,
        make: impl FnOnce(&str) -> Frame,
    ) -> Option<Frame> {
        let batch = self.batch;
        let pid = key.pid;
        let table = &self.table;
        let entry = self.maps.entry(key).or_insert_with(|| {
            let facts = table.facts(key);
            Entry {
                map: PerfMap::default(),
                frames: Vec::new(),
                ns_pid: facts.as_ref().map_or(pid, |f| f.ns_pid),
                uid: facts.as_ref().map_or(cpu::UNKNOWN_USER, |f| f.euid),
                refused: None,
                building: None,
                deferred: None,
                budget: ReadBudget::new(),
                bytes: 0,
                checked: 0,
                used: batch,
            }
        });
        entry.used = batch;
        let uid = entry.uid;
        if entry.checked != batch {
            entry.checked = batch;
            let Some(_unit) = cpu::admit(uid, pid, What::PerfMap) else {
                return self.lookup(key, addr, make);
            };
            let now = perfmap::stamp(pid, entry.ns_pid);
            let behind = entry.building.is_some() || now != entry.map.read_stamp();
            if behind && (now.is_none() || now != entry.refused) {
                entry.read_on(key, now);
                self.enforce_budget(key);
            }
        }
        self.lookup(key, addr, make)
    }

    fn lookup(
        &mut self,
        key: ProcKey,
        addr: u64,
        make: impl FnOnce(&str) -> Frame,
    ) -> Option<Frame> {
        let entry = self.maps.get_mut(&key)?;
        let i = entry.map.index_of(addr)?;
        let slot = &mut entry.frames[i];
        if let Some(frame) = slot {
            return Some(frame.clone());
        }
        let Some(_unit) = cpu::admit(entry.uid, key.pid, What::PerfMap) else {
            return Some(OVER_BUDGET_FRAME.clone());
        };
        Some(slot.insert(make(entry.map.name(i))).clone())
    }

    /// Drops the least recently used maps other than `keep`'s while all
    /// maps hold more than [`budget_bytes`] of names.
    fn enforce_budget(&mut self, keep: ProcKey) {
        let mut total: usize = self.maps.values().map(|e| e.bytes).sum();
        while total > budget_bytes() {
            let Some((&oldest, e)) = self
                .maps
                .iter()
                .filter(|(key, _)| **key != keep)
                .min_by_key(|(_, e)| e.used)
            else {
                return;
            };
            total -= e.bytes;
            tracing::debug!(
                pid = oldest.pid,
                "perf map dropped: over the JIT name budget"
            );
            self.maps.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_budget_allows_one_big_read_then_waits_for_its_refill() {
        let mut budget = ReadBudget::new();
        assert!(budget.allows(64 << 20), "a full bucket allows any read");
        budget.spend(32 << 20);
        assert!(!budget.allows(4096), "in debt: even a small append waits");
        budget.at -= std::time::Duration::from_secs(17);
        assert!(budget.allows(1 << 20), "the debt repaid at the rate");
        assert!(!budget.allows(4 << 20));
    }
}
