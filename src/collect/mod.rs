//! Draining the BPF maps into raw records.
//!
//! Parity double-buffering: programs write to the buffer named by
//! `control[Buffer]`; the drainer flips it, lets in-flight programs finish,
//! then reads and empties the buffer nobody writes to any more. No event that
//! arrives during a drain is lost or counted twice.
//!
//! Stack maps are not drained: off-CPU rows refer to stacks taken long before
//! (see `bpf/stacks.bpf.h`). They rotate through generations instead, and
//! a stack is read from the kernel once per generation.

mod batch;
pub mod convert;
mod fold;
mod merge;
pub mod spans;
mod stacks;
pub mod walks;

use std::{
    sync::Arc,
    thread,
    time::{Duration, Instant, SystemTime},
};

use thiserror::Error;

use crate::bpf::{
    abi::{
        comm_str, is_merged_tid, Control, HistKey, LiveThread, Stat, ThreadTotals, INTERRUPT_TID,
        WAKEUP_STATE,
    },
    ProbeMaps,
};
use crate::profile::model::{
    counters::{RawThread, ThreadCounters},
    kind::MERGED_THREADS,
    spans::{SpanId, SpanTime},
    state::{Hist, State},
    HistOwner, KeptOff, Sleeps, StatDeltas,
};
use stacks::StackCache;

/// How long programs that read the old buffer index may still be running.
/// BPF programs run for microseconds; this is generous.
const FLIP_GRACE: Duration = Duration::from_millis(5);

/// Instruction pointers, leaf first, as the kernel records them.
pub type RawStack = Arc<[u64]>;

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// Time in a state: sampled CPU, or an off-CPU interval.
    Time(State),
    /// Wakeups this thread sent to `peer_tid`; `ns` is how long the wakees
    /// had been asleep.
    Wakeup { peer_pid: u32, peer_tid: u32 },
}

/// One aggregated row of a drained buffer.
#[derive(Debug, Clone)]
pub struct RawRecord {
    pub pid: u32,
    pub tid: u32,
    pub kind: RecordKind,
    /// Thread name at the time of the event.
    pub comm: String,
    /// Syscall the thread was in (off-CPU rows and wakers).
    pub syscall: Option<u32>,
    pub user_stack: Option<RawStack>,
    pub kernel_stack: Option<RawStack>,
    pub ns: u64,
    pub count: u64,
    /// The OpenTelemetry span the thread was in (time rows only).
    pub span: Option<SpanId>,
}

impl RawRecord {
    /// Whether the row is a wakeup raised in interrupt context: its waker
    /// is no thread (pid 0, [`INTERRUPT_TID`]), whatever it interrupted.
    pub fn from_interrupt(&self) -> bool {
        self.pid == 0 && self.tid == INTERRUPT_TID
    }
}

/// Who woke a thread last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waker {
    Thread {
        pid: u32,
        tid: u32,
    },
    /// A hard or soft interrupt (a timer, a device).
    Interrupt,
}

/// A thread that was off-CPU (or runnable, waiting) when the drain looked,
/// from the drain-time task iterator. Its time so far is already in the
/// batch's records and totals.
#[derive(Debug, Clone)]
pub struct RawLive {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// State of its current phase (never [`State::Cpu`]).
    pub state: State,
    /// How long it has been in `state` when the drain looked.
    pub in_state: Duration,
    /// Syscall it blocked in.
    pub syscall: Option<u32>,
    pub user_stack: Option<RawStack>,
    pub kernel_stack: Option<RawStack>,
    /// Who woke it last (before this phase), if a wakeup was seen.
    pub waker: Option<Waker>,
}

/// Everything one drain produced.
#[derive(Debug, Clone)]
pub struct RawBatch {
    /// When the drained interval ended.
    pub end: SystemTime,
    /// Length of the drained interval.
    pub interval: Duration,
    pub records: Vec<RawRecord>,
    pub threads: Vec<RawThread>,
    pub runq_hists: Vec<(HistOwner, Hist)>,
    pub kept_off: Vec<KeptOff>,
    /// Blocked intervals that ended, per thread that had any.
    pub sleeps: Vec<Sleeps>,
    /// Threads off-CPU when the drain looked, longest first.
    pub live: Vec<RawLive>,
    /// Each thread's exact time per span in the drained interval.
    pub span_times: Vec<SpanTime>,
    /// Records of the spans first seen since the last drain.
    pub span_records: Vec<spans::RawSpanRecord>,
    pub stats: StatDeltas,
    /// Rows whose stack id was missing from the stack map when read.
    pub missing_stacks: u64,
    /// How long the drain itself took.
    pub drain_time: Duration,
}

impl RawBatch {
    /// Estimated heap bytes: the rows, their names and their own stacks
    /// (stacks shared with the collector's cache counted in each row: it
    /// errs high).
    pub fn estimated_bytes(&self) -> u64 {
        let stack = |s: &Option<RawStack>| s.as_ref().map_or(0, |s| s.len() * 8);
        let records: usize = self
            .records
            .iter()
            .map(|r| {
                std::mem::size_of::<RawRecord>()
                    + r.comm.capacity()
                    + stack(&r.user_stack)
                    + stack(&r.kernel_stack)
            })
            .sum();
        let live: usize = self
            .live
            .iter()
            .map(|l| {
                std::mem::size_of::<RawLive>()
                    + l.comm.capacity()
                    + stack(&l.user_stack)
                    + stack(&l.kernel_stack)
            })
            .sum();
        (records
            + live
            + self.threads.capacity() * std::mem::size_of::<RawThread>()
            + self.runq_hists.capacity() * std::mem::size_of::<(HistOwner, Hist)>()
            + self.kept_off.capacity() * std::mem::size_of::<KeptOff>()
            + self.sleeps.capacity() * std::mem::size_of::<Sleeps>()
            + self.span_times.capacity() * std::mem::size_of::<SpanTime>()
            + self
                .span_records
                .iter()
                .map(|r| std::mem::size_of::<spans::RawSpanRecord>() + r.attrs.capacity())
                .sum::<usize>()) as u64
    }
}

/// Errors talking to the BPF maps.
#[derive(Debug, Error)]
pub enum CollectError {
    #[error("writing the control map: {0}")]
    Control(#[source] aya::maps::MapError),
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
    stacks: StackCache,
    last_stats: StatDeltas,
    last_drain: SystemTime,
    /// The task iterator's output, kept between drains.
    live_buf: Vec<u8>,
    walk_costs: walks::WalkCosts,
}

impl Drainer {
    /// Rows of each counts map (`bpf::counts_entries`).
    pub fn counts_entries(&self) -> u32 {
        self.maps.counts_entries
    }

    /// Takes the maps; programs start out writing to buffer 0, generation 0.
    /// The first drain's interval starts at `since` (see
    /// [`crate::bpf::Probes::recording_since`]).
    pub fn new(maps: ProbeMaps, since: SystemTime) -> Self {
        Drainer {
            maps,
            active: 0,
            stacks: StackCache::default(),
            last_stats: [0; Stat::COUNT],
            last_drain: since,
            live_buf: Vec::new(),
            walk_costs: walks::WalkCosts::default(),
        }
    }

    /// Reads what stack walks cost since the last call; the counts since
    /// start (a failed read is logged and leaves them as they were).
    pub fn walk_costs(&mut self) -> &walks::WalkCosts {
        match self.maps.walk_cost.get(&0, 0) {
            Ok(per_cpu) => self.walk_costs.add(&per_cpu),
            Err(e) => tracing::warn!("reading walk costs: {e}"),
        }
        &self.walk_costs
    }

    /// Flips the buffers and returns what the now idle one held.
    pub fn drain(&mut self) -> Result<RawBatch, CollectError> {
        let started = Instant::now();
        // Ongoing phases are accounted into the active buffer first, so
        // the drained buffer holds every thread's time up to now.
        let live_rows = self.run_live();
        let idle = self.active;
        self.active ^= 1;
        self.maps
            .control
            .set(Control::Buffer as u32, self.active, 0)
            .map_err(CollectError::Control)?;
        let end = SystemTime::now();
        thread::sleep(FLIP_GRACE);

        let buf = &mut self.maps.buffers[idle as usize];
        let rows = take_all(&mut buf.counts, "counts map")?;
        self.maps
            .counts_used
            .set(idle, 0, 0)
            .map_err(CollectError::Control)?;
        let threads = take_all(&mut buf.threads, "threads map")?;
        let hists = take_all(&mut buf.runq_hist, "runqueue histograms")?;
        let culprits = take_all(&mut buf.culprits, "runqueue culprits")?;
        let span_times = take_all(&mut buf.span_times, "span times")?;
        let span_records = take_all(&mut self.maps.span_records, "span records")?;

        let mut missing_stacks = 0;
        let mut records = Vec::with_capacity(rows.len());
        for (key, value) in rows {
            let kind = if key.state == WAKEUP_STATE {
                RecordKind::Wakeup {
                    peer_pid: key.peer_pid,
                    peer_tid: key.peer_tid,
                }
            } else {
                match convert::state_from_raw(key.state) {
                    Some(state) => RecordKind::Time(state),
                    None => continue, // not in the contract: nothing to attribute it to
                }
            };
            let user_stack = self.stack(key.stack_gen, key.user_stack_id, &mut missing_stacks);
            let kernel_stack = self.stack(key.stack_gen, key.kernel_stack_id, &mut missing_stacks);
            records.push(RawRecord {
                pid: key.pid,
                tid: key.tid,
                kind,
                comm: if is_merged_tid(key.tid) {
                    MERGED_THREADS.to_string()
                } else {
                    comm_str(&key.comm)
                },
                syscall: key.syscall.checked_sub(1),
                user_stack,
                kernel_stack,
                ns: value.ns,
                count: value.count,
                span: SpanId::from_raw(key.span),
            });
        }
        let mut live = Vec::with_capacity(live_rows.len());
        for row in &live_rows {
            let Some(state) = convert::state_from_raw(row.state) else {
                continue;
            };
            let user_stack = self.stack(row.stack_gen, row.user_stack_id, &mut missing_stacks);
            let kernel_stack = self.stack(row.stack_gen, row.kernel_stack_id, &mut missing_stacks);
            live.push(RawLive {
                pid: row.pid,
                tid: row.tid,
                comm: comm_str(&row.comm),
                state,
                in_state: Duration::from_nanos(row.now_ns.saturating_sub(row.since_ns)),
                syscall: row.syscall.checked_sub(1),
                user_stack,
                kernel_stack,
                waker: waker(row.waker_pid, row.waker_tid),
            });
        }
        live.sort_by_key(|l| std::cmp::Reverse(l.in_state));
        let stats = self.stat_deltas()?;
        self.stacks.maybe_rotate(
            &mut self.maps.stacks,
            &mut self.maps.control,
            stats[Stat::StacksStored as usize],
        )?;
        let interval = end.duration_since(self.last_drain).unwrap_or_default();
        self.last_drain = end;
        let sleeps = threads
            .iter()
            .filter(|(_, t)| t.sleep_slots.iter().any(|n| *n > 0))
            .map(|(tid, t)| Sleeps {
                pid: t.pid,
                tid: *tid,
                slots: t.sleep_slots,
            })
            .collect();
        Ok(RawBatch {
            end,
            interval,
            records,
            threads: threads
                .into_iter()
                .map(|(tid, t)| raw_thread(tid, &t))
                .collect(),
            sleeps,
            runq_hists: hists
                .into_iter()
                .filter_map(|(k, h)| Some((hist_owner(&k)?, convert::hist(&h))))
                .collect(),
            kept_off: culprits
                .into_iter()
                .map(|(k, ns)| KeptOff {
                    pid: k.pid,
                    tid: k.tid,
                    by: k.culprit,
                    ns,
                })
                .collect(),
            live,
            span_times: span_times
                .iter()
                .filter_map(|(k, t)| spans::span_time(k, t))
                .collect(),
            span_records: span_records
                .iter()
                .filter_map(|(k, r)| spans::RawSpanRecord::from_bpf(k, r))
                .collect(),
            stats,
            missing_stacks,
            drain_time: started.elapsed(),
        })
    }

    /// Stack `id` of generation `gen`; one gone from its map counts in
    /// `missing`.
    fn stack(&mut self, gen: u32, id: i32, missing: &mut u64) -> Option<RawStack> {
        let found = self.stacks.get(&self.maps.stacks, gen, id);
        *missing += u64::from(found.is_err());
        found.ok().flatten()
    }

    /// Runs the drain-time task iterator: its records, or none where the
    /// kernel refused it or a run failed (logged; the drain goes on).
    fn run_live(&mut self) -> Vec<LiveThread> {
        let Some(iter) = &self.maps.live else {
            return Vec::new();
        };
        self.live_buf.clear();
        if let Err(e) = iter.run(&mut self.live_buf) {
            tracing::warn!("task iterator: {e}");
            return Vec::new();
        }
        self.live_buf
            .chunks_exact(std::mem::size_of::<LiveThread>())
            .filter_map(LiveThread::from_bytes)
            .collect()
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

/// Reads and deletes every row of a hash map.
fn take_all<K: aya::Pod, V: aya::Pod>(
    map: &mut aya::maps::HashMap<aya::maps::MapData, K, V>,
    what: &'static str,
) -> Result<Vec<(K, V)>, CollectError> {
    batch::take_all(map).map_err(|source| CollectError::Read {
        what,
        source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_lookup_and_delete_batch",
            io_error: source,
        }),
    })
}

/// The one place the BPF row's counters become the model's.
fn raw_thread(tid: u32, t: &ThreadTotals) -> RawThread {
    RawThread {
        tid,
        pid: t.pid,
        comm: comm_str(&t.comm),
        counters: ThreadCounters {
            ns: t.ns,
            switches_voluntary: t.switches_voluntary,
            switches_involuntary: t.switches_involuntary,
            wakeups_sent: t.wakeups_sent,
            wakeups_received: t.wakeups_received,
        },
    }
}

fn waker(pid: u32, tid: u32) -> Option<Waker> {
    match (pid, tid) {
        (0, INTERRUPT_TID) => Some(Waker::Interrupt),
        (_, 0) => None,
        (pid, tid) => Some(Waker::Thread { pid, tid }),
    }
}

fn hist_owner(key: &HistKey) -> Option<HistOwner> {
    match key.kind {
        crate::bpf::abi::HIST_PROCESS => Some(HistOwner::Process(key.id as u32)),
        crate::bpf::abi::HIST_CGROUP => Some(HistOwner::Cgroup(key.id)),
        crate::bpf::abi::HIST_PROCESS_THROTTLED => Some(HistOwner::ProcessThrottled(key.id as u32)),
        crate::bpf::abi::HIST_CGROUP_THROTTLED => Some(HistOwner::CgroupThrottled(key.id)),
        _ => None,
    }
}
