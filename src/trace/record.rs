//! One recording: point BPF at the process, take the snapshot of where its
//! threads are, read the ring buffer for the asked time, stop. Bounded:
//! at most [`Limits::events`] events are kept; past it the window ends at
//! the last event kept and the rest are counted as cut.

use std::{
    os::fd::{AsFd, AsRawFd},
    time::{Duration, Instant},
};

use crate::bpf::{
    abi::{trace_kind, trace_target, TraceEvent},
    TraceMaps,
};

use super::{queue::Stop, TraceError};

/// How much one recording may keep.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Events kept (32 bytes each in memory, ~120 bytes at most in the trace).
    pub events: usize,
}

impl Limits {
    /// As many events as fit [`super::MAX_TRACE_BYTES`] (~1 million: 32 MB
    /// while recording, ~150 MB at the peak of encoding). A lock convoy on
    /// a busy host sends ~70,000 a second.
    pub const DEFAULT: Limits = Limits {
        events: super::MAX_TRACE_BYTES / super::perfetto::BYTES_PER_EVENT,
    };
}

/// What a recording got.
#[derive(Debug, Clone, Default)]
pub struct Recording {
    pub pid: u32,
    /// The window, in ns of CLOCK_MONOTONIC (bpf_ktime_get_ns's clock):
    /// from when every thread's state was known to when the recording
    /// stopped (or was cut).
    pub start: u64,
    pub end: u64,
    pub events: Vec<TraceEvent>,
    /// Events past [`Limits::events`], left out (the window ends before them).
    pub cut: u64,
    /// Events BPF could not send: the ring buffer was full.
    pub lost: u64,
    /// The clocks read together as the recording started.
    pub clocks: Clocks,
}

/// CLOCK_MONOTONIC, CLOCK_BOOTTIME and CLOCK_REALTIME read together, in ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clocks {
    pub monotonic: u64,
    pub boottime: u64,
    pub realtime: u64,
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Now on bpf_ktime_get_ns's clock.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

impl Clocks {
    pub fn now() -> Clocks {
        Clocks {
            monotonic: monotonic_ns(),
            boottime: clock_ns(libc::CLOCK_BOOTTIME),
            realtime: clock_ns(libc::CLOCK_REALTIME),
        }
    }
}

/// Keeps events up to a bound; what comes later is counted as cut.
#[derive(Debug)]
pub struct Bounded {
    limit: usize,
    events: Vec<TraceEvent>,
    cut: u64,
}

impl Bounded {
    pub fn new(limit: usize) -> Bounded {
        Bounded {
            limit,
            events: Vec::new(),
            cut: 0,
        }
    }

    /// Keeps `e` if there is room; false once full (the caller stops).
    pub fn push(&mut self, e: TraceEvent) -> bool {
        if self.events.len() >= self.limit {
            self.cut += 1;
            return false;
        }
        self.events.push(e);
        true
    }

    pub fn is_full(&self) -> bool {
        self.events.len() >= self.limit
    }

    /// The window's end once recording stops at `stopped`: there, or at the
    /// last event kept if some were cut (what came after is unknown). The
    /// snapshot's stamps are when states began, not events of the window,
    /// so they do not end it.
    fn end(&self, stopped: u64) -> u64 {
        if self.cut == 0 {
            return stopped;
        }
        self.events
            .iter()
            .filter(|e| e.kind != trace_kind::SNAPSHOT)
            .map(|e| e.ts)
            .max()
            .unwrap_or(stopped)
            .min(stopped)
    }

    /// The events kept and how many were cut.
    pub fn finish(self) -> (Vec<TraceEvent>, u64) {
        (self.events, self.cut)
    }
}

/// Waits until the ring buffer has data or `timeout` passes.
fn wait_readable(maps: &TraceMaps, timeout: Duration) {
    let mut fd = libc::pollfd {
        fd: maps.events.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack; the fd outlives the call.
    unsafe { libc::poll(&mut fd, 1, timeout.as_millis().max(1) as i32) };
}

/// Reads what the ring holds into `kept`; false once `kept` is full.
fn read_ring(maps: &mut TraceMaps, kept: &mut Bounded) -> bool {
    while let Some(item) = maps.events.next() {
        if let Some(e) = TraceEvent::from_bytes(&item) {
            if !kept.push(e) {
                return false;
            }
        }
    }
    !kept.is_full()
}

fn set(maps: &mut TraceMaps, index: u32, value: u32) -> Result<(), TraceError> {
    maps.target
        .set(index, value, 0)
        .map_err(TraceError::Control)
}

/// Records `pid`'s threads for `length`, or until `stop` is set (blocking:
/// run on a thread of its own). The target is cleared however the
/// recording ends.
pub fn record(
    maps: &mut TraceMaps,
    pid: u32,
    length: Duration,
    limits: Limits,
    stop: &Stop,
) -> Result<Recording, TraceError> {
    // Whatever a previous recording left unread is not this one's.
    while maps.events.next().is_some() {}
    set(maps, trace_target::LOST, 0)?;
    set(maps, trace_target::TGID, pid)?;
    // Switches are reported from before the snapshot on, so that none
    // after it is missed; detached when the link drops.
    let result = match crate::bpf::iter::attach_tp_btf(maps.switch.as_fd()) {
        Ok(link) => {
            let recorded = run(maps, pid, length, limits, stop);
            drop(link);
            recorded
        }
        Err(e) => Err(TraceError::Attach(e)),
    };
    let cleared = set(maps, trace_target::TGID, 0);
    let mut recording = result?;
    cleared?;
    // Events sent before the target was cleared but not yet read: past
    // the window's end (kept out by it), or cut when the bound was hit.
    while maps.events.next().is_some() {
        if recording.cut > 0 {
            recording.cut += 1;
        }
    }
    recording.lost = u64::from(maps.target.get(&trace_target::LOST, 0).unwrap_or(0));
    Ok(recording)
}

fn run(
    maps: &mut TraceMaps,
    pid: u32,
    length: Duration,
    limits: Limits,
    stop: &Stop,
) -> Result<Recording, TraceError> {
    let mut kept = Bounded::new(limits.events);
    let mut snapshot = Vec::new();
    maps.snapshot
        .run(&mut snapshot)
        .map_err(TraceError::Snapshot)?;
    // Every thread's state is known from here on.
    let clocks = Clocks::now();
    let started = Instant::now();
    // Looked at every 20 ms at most: a stop ends the recording that soon.
    while started.elapsed() < length && !stop.is_set() {
        let left = length.saturating_sub(started.elapsed());
        wait_readable(maps, left.min(Duration::from_millis(20)));
        if !read_ring(maps, &mut kept) {
            break;
        }
    }
    let stopped = monotonic_ns();
    read_ring(maps, &mut kept);
    let end = kept.end(stopped);
    let (events, cut) = kept.finish();
    Ok(Recording {
        pid,
        start: clocks.monotonic,
        end,
        events,
        cut,
        lost: 0,
        clocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ts: u64, kind: u32) -> TraceEvent {
        TraceEvent {
            ts,
            kind,
            ..TraceEvent::default()
        }
    }

    #[test]
    fn past_the_bound_events_are_cut_and_the_window_ends_at_the_last_kept() {
        let mut b = Bounded::new(3);
        assert!(b.push(ev(5, trace_kind::SNAPSHOT)));
        assert!(b.push(ev(100, trace_kind::SWITCH_IN)));
        assert!(b.push(ev(200, trace_kind::SWITCH_OUT)));
        assert!(b.is_full());
        assert!(!b.push(ev(300, trace_kind::SWITCH_IN)));
        assert!(!b.push(ev(400, trace_kind::SWITCH_IN)));
        assert_eq!(b.end(1000), 200);
        let (events, cut) = b.finish();
        assert_eq!((events.len(), cut), (3, 2));
    }

    #[test]
    fn without_a_cut_the_window_ends_when_recording_stopped() {
        let mut b = Bounded::new(3);
        assert!(b.push(ev(100, trace_kind::SWITCH_IN)));
        assert_eq!(b.end(1000), 1000);
        assert_eq!(b.finish().1, 0);
    }
}
