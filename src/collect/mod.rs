//! Draining the BPF aggregation maps into raw records.
//!
//! Parity double-buffering: programs write to the buffer named by
//! `buffer_index`; the drainer flips it, lets in-flight programs finish, then
//! reads and empties the buffer nobody writes to any more. No event that
//! arrives during a drain is lost or counted twice.

use std::{
    sync::Arc,
    thread,
    time::{Duration, Instant, SystemTime},
};

use thiserror::Error;

use crate::bpf::{
    abi::{comm_str, Stat, State, NO_STACK},
    Buffer, ProbeMaps,
};

/// How long programs that read the old buffer index may still be running.
/// BPF programs run for microseconds; this is generous.
const FLIP_GRACE: Duration = Duration::from_millis(5);

/// Instruction pointers, leaf first, as the kernel records them.
pub type RawStack = Arc<[u64]>;

/// One aggregated row of a drained buffer.
#[derive(Debug, Clone)]
pub struct RawRecord {
    pub pid: u32,
    pub tid: u32,
    pub state: State,
    /// Thread name at the time of the event.
    pub comm: String,
    pub user_stack: Option<RawStack>,
    pub kernel_stack: Option<RawStack>,
    pub ns: u64,
    pub count: u64,
}

/// Counter deltas since the previous drain, indexed like [`Stat::ALL`].
pub type StatDeltas = [u64; Stat::COUNT];

/// Everything one drain produced.
#[derive(Debug, Clone)]
pub struct RawBatch {
    /// When the drained interval ended.
    pub end: SystemTime,
    /// Length of the drained interval.
    pub interval: Duration,
    pub records: Vec<RawRecord>,
    pub stats: StatDeltas,
    /// Rows whose stack id was missing from the stack map when read.
    pub missing_stacks: u64,
    /// How long the drain itself took.
    pub drain_time: Duration,
}

/// Errors talking to the BPF maps.
#[derive(Debug, Error)]
pub enum CollectError {
    #[error("flipping buffer_index: {0}")]
    Flip(#[source] aya::maps::MapError),
    #[error("reading {what}: {source}")]
    Read {
        what: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
}

/// Owns the maps and turns them into [`RawBatch`]es.
pub struct Drainer {
    maps: ProbeMaps,
    active: u32,
    last_stats: StatDeltas,
    last_drain: SystemTime,
}

impl Drainer {
    /// Takes the maps; programs start out writing to buffer 0.
    pub fn new(maps: ProbeMaps) -> Self {
        Drainer {
            maps,
            active: 0,
            last_stats: [0; Stat::COUNT],
            last_drain: SystemTime::now(),
        }
    }

    /// Flips the buffers and returns what the now idle one held.
    pub fn drain(&mut self) -> Result<RawBatch, CollectError> {
        let started = Instant::now();
        let idle = self.active;
        self.active ^= 1;
        self.maps
            .buffer_index
            .set(0, self.active, 0)
            .map_err(CollectError::Flip)?;
        let end = SystemTime::now();
        thread::sleep(FLIP_GRACE);

        let (records, missing_stacks) = drain_buffer(&mut self.maps.buffers[idle as usize])?;
        let stats = self.stat_deltas()?;
        let interval = end.duration_since(self.last_drain).unwrap_or_default();
        self.last_drain = end;
        Ok(RawBatch {
            end,
            interval,
            records,
            stats,
            missing_stacks,
            drain_time: started.elapsed(),
        })
    }

    fn stat_deltas(&mut self) -> Result<StatDeltas, CollectError> {
        let mut deltas = [0; Stat::COUNT];
        for stat in Stat::ALL {
            let per_cpu =
                self.maps
                    .stats
                    .get(&(stat as u32), 0)
                    .map_err(|source| CollectError::Read {
                        what: "stats",
                        source,
                    })?;
            let total: u64 = per_cpu.iter().sum();
            let i = stat as usize;
            deltas[i] = total.saturating_sub(self.last_stats[i]);
            self.last_stats[i] = total;
        }
        Ok(deltas)
    }
}

/// Reads every row and stack of one buffer, then empties it.
fn drain_buffer(buf: &mut Buffer) -> Result<(Vec<RawRecord>, u64), CollectError> {
    let read = |source| CollectError::Read {
        what: "counts map",
        source,
    };
    let rows: Vec<_> = buf.counts.iter().collect::<Result<_, _>>().map_err(read)?;
    for (key, _) in &rows {
        // A key can only vanish if someone else drains: nothing to count.
        let _ = buf.counts.remove(key);
    }

    let mut stacks = std::collections::HashMap::<i32, Option<RawStack>>::new();
    let mut missing = 0;
    let mut stack = |id: i32, missing: &mut u64| -> Option<RawStack> {
        if id == NO_STACK {
            return None;
        }
        let found = stacks.entry(id).or_insert_with(|| {
            buf.stacks.get(&(id as u32), 0).ok().map(|trace| {
                trace
                    .frames()
                    .iter()
                    .map(|f| f.ip)
                    .collect::<Vec<_>>()
                    .into()
            })
        });
        if found.is_none() {
            *missing += 1;
        }
        found.clone()
    };
    let mut records = Vec::with_capacity(rows.len());
    for (key, value) in rows {
        let Some(state) = State::from_raw(key.state) else {
            continue;
        };
        records.push(RawRecord {
            pid: key.pid,
            tid: key.tid,
            state,
            comm: comm_str(&key.comm),
            user_stack: stack(key.user_stack_id, &mut missing),
            kernel_stack: stack(key.kernel_stack_id, &mut missing),
            ns: value.ns,
            count: value.count,
        });
    }

    // Also clear stacks no row refers to (their row was dropped: map full).
    let ids: Vec<u32> = buf.stacks.stack_ids().filter_map(Result::ok).collect();
    for id in ids {
        let _ = buf.stacks.remove(&id);
    }
    Ok((records, missing))
}
