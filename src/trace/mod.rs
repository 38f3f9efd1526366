//! Exact thread timelines on demand (`/trace`): every state change of one
//! process's threads for a few seconds, as a Perfetto trace. One recording
//! at a time (the BPF side has one target): the others wait their turn in
//! a [`queue`] of one request per user, root first.
//!
//! [`record`] reads the BPF ring buffer (bounded), [`timeline`] turns the
//! events into gapless per-thread intervals, [`perfetto`] encodes them.

pub mod perfetto;
pub mod queue;
pub mod record;
pub mod timeline;

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use serde::Serialize;
use thiserror::Error;

use crate::bpf::TraceMaps;
use perfetto::Names;
use queue::{Queue, Stop};
use record::Limits;

/// Longest recording.
pub const MAX_SECONDS: u64 = 30;
/// Largest trace (bytes): the event bound follows from it.
pub const MAX_TRACE_BYTES: usize = 100 << 20;

/// Why a recording could not be made.
#[derive(Debug, Error)]
pub enum TraceError {
    #[error("a trace is being recorded already (one at a time): retry when it ends")]
    Busy,
    #[error("setting the trace target: {0}")]
    Control(#[source] aya::maps::MapError),
    #[error("taking the threads' snapshot: {0}")]
    Snapshot(#[source] std::io::Error),
    #[error("attaching the switch hook: {0}")]
    Attach(#[source] std::io::Error),
    #[error("the recording was cancelled: its client hung up")]
    Cancelled,
}

/// A trace ready to serve, with what it holds.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub bytes: Vec<u8>,
    /// The window, in ns of CLOCK_MONOTONIC, and its start on the wall
    /// clock (Unix ns).
    pub start: u64,
    pub end: u64,
    pub start_unix_ns: u64,
    pub threads: usize,
    pub slices: usize,
    pub wakes: usize,
    pub events: usize,
    /// Events left out past the bound (the window was shortened).
    pub cut: u64,
    /// Events the kernel could not send (ring buffer full).
    pub lost: u64,
    /// Ended early: root asked for a recording.
    pub preempted: bool,
}

/// Recordings made and what they held, since start.
#[derive(Debug, Default)]
pub struct TraceStats {
    traces: AtomicU64,
    events: AtomicU64,
    cut: AtomicU64,
    lost: AtomicU64,
    busy: AtomicU64,
    waited: AtomicU64,
    refused_queued: AtomicU64,
    refused_wait: AtomicU64,
    cancelled: AtomicU64,
    preempted: AtomicU64,
}

/// [`TraceStats`] at one moment (for `/healthz` and `/metrics`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct TraceReport {
    /// Traces served.
    pub traces: u64,
    /// State changes recorded into them.
    pub events_recorded: u64,
    /// Events left out past a trace's bound.
    pub events_cut: u64,
    /// Events the kernel dropped: the ring buffer was full.
    pub events_lost: u64,
    /// Requests refused because a recording was running.
    pub refused_busy: u64,
    /// Requests that waited for another's recording to end.
    pub waited: u64,
    /// Requests refused: their user had one running or waiting already,
    /// or the queue was full.
    pub refused_queued: u64,
    /// Requests that got no turn within the queue's wait bound.
    pub refused_wait: u64,
    /// Recordings cancelled (or requests that left the queue) because
    /// their client hung up.
    pub cancelled: u64,
    /// Users' recordings ended early for root's.
    pub preempted: u64,
    /// Requests recording or waiting now.
    pub queued: u64,
}

/// What happened to a request in the queue, counted in [`TraceStats`].
#[derive(Debug, Clone, Copy)]
pub enum QueueEvent {
    Waited,
    RefusedQueued,
    RefusedWait,
    Cancelled,
}

impl TraceStats {
    pub fn report(&self) -> TraceReport {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TraceReport {
            traces: get(&self.traces),
            events_recorded: get(&self.events),
            events_cut: get(&self.cut),
            events_lost: get(&self.lost),
            refused_busy: get(&self.busy),
            waited: get(&self.waited),
            refused_queued: get(&self.refused_queued),
            refused_wait: get(&self.refused_wait),
            cancelled: get(&self.cancelled),
            preempted: get(&self.preempted),
            queued: 0,
        }
    }

    pub fn count(&self, event: QueueEvent) {
        let counter = match event {
            QueueEvent::Waited => &self.waited,
            QueueEvent::RefusedQueued => &self.refused_queued,
            QueueEvent::RefusedWait => &self.refused_wait,
            QueueEvent::Cancelled => &self.cancelled,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Makes recordings with the BPF trace maps, one at a time, in the turns
/// its [`Queue`] gives.
pub struct Recorder {
    maps: Mutex<Option<TraceMaps>>,
    pub stats: TraceStats,
    pub queue: Arc<Queue>,
}

/// Hands the maps back however the recording ends.
struct Lease<'a> {
    slot: &'a Mutex<Option<TraceMaps>>,
    maps: Option<TraceMaps>,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = self.maps.take();
    }
}

impl Recorder {
    /// What it did, and how many requests it has now.
    pub fn report(&self) -> TraceReport {
        TraceReport {
            queued: self.queue.len() as u64,
            ..self.stats.report()
        }
    }

    pub fn new(maps: TraceMaps) -> Recorder {
        Recorder {
            maps: Mutex::new(Some(maps)),
            stats: TraceStats::default(),
            queue: Arc::new(Queue::default()),
        }
    }

    /// Records `pid` for `length` (at most [`MAX_SECONDS`]) and encodes the
    /// trace; `names` gives the process's and its threads' names once the
    /// threads are known. Blocks for the whole recording, or until `stop`:
    /// preempted, it serves what it recorded; cancelled, nothing.
    pub fn record(
        &self,
        pid: u32,
        length: Duration,
        stop: &Stop,
        names: impl FnOnce(&[u32]) -> Names,
    ) -> Result<Trace, TraceError> {
        let taken = self.maps.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(maps) = taken else {
            self.stats.busy.fetch_add(1, Ordering::Relaxed);
            return Err(TraceError::Busy);
        };
        let mut lease = Lease {
            slot: &self.maps,
            maps: Some(maps),
        };
        let Some(maps) = lease.maps.as_mut() else {
            return Err(TraceError::Busy);
        };
        let length = length.min(Duration::from_secs(MAX_SECONDS));
        let rec = record::record(maps, pid, length, Limits::DEFAULT, stop)?;
        drop(lease);
        if stop.cancelled() {
            self.stats.count(QueueEvent::Cancelled);
            return Err(TraceError::Cancelled);
        }
        let preempted = stop.preempted();
        if preempted {
            self.stats.preempted.fetch_add(1, Ordering::Relaxed);
        }
        let events = rec.events.len();
        let lines = timeline::build(pid, rec.events, rec.start, rec.end);
        let tids: Vec<u32> = lines.threads.keys().copied().collect();
        let names = names(&tids);
        let bytes = perfetto::encode(pid, &lines, &names, rec.clocks);
        let stats = &self.stats;
        stats.traces.fetch_add(1, Ordering::Relaxed);
        stats.events.fetch_add(events as u64, Ordering::Relaxed);
        stats.cut.fetch_add(rec.cut, Ordering::Relaxed);
        stats.lost.fetch_add(rec.lost, Ordering::Relaxed);
        Ok(Trace {
            bytes,
            start: rec.start,
            end: rec.end,
            start_unix_ns: rec.clocks.realtime,
            threads: lines.threads.len(),
            slices: lines.threads.values().map(|l| l.intervals.len()).sum(),
            wakes: lines.wakes.len(),
            events,
            cut: rec.cut,
            lost: rec.lost,
            preempted,
        })
    }
}
