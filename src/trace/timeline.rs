//! From a recording's events to each thread's timeline: the intervals it
//! spent in each state, tiling the window from when the thread is known
//! (the window's start, or its creation) to the window's end (or its
//! exit), and the wakeups between the process's own threads.

use std::collections::BTreeMap;

use crate::{
    bpf::abi::{trace_kind, TraceEvent, INTERRUPT_TID},
    collect::convert::state_from_raw,
    profile::model::state::State,
};

/// One stretch of a thread in one state, `[start, end)` in ns
/// (CLOCK_MONOTONIC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub start: u64,
    pub end: u64,
    pub state: State,
}

/// A wakeup (or creation) of `wakee` by `waker`, both threads of the
/// traced process, at `ts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wake {
    pub ts: u64,
    pub waker: u32,
    pub wakee: u32,
}

/// A thread's intervals, in time order, gapless.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadLine {
    pub intervals: Vec<Interval>,
    /// It exited within the window (its last interval ends there).
    pub exited: bool,
}

/// Every thread's timeline over `[start, end]`.
#[derive(Debug, Clone, Default)]
pub struct Timelines {
    pub start: u64,
    pub end: u64,
    pub threads: BTreeMap<u32, ThreadLine>,
    pub wakes: Vec<Wake>,
    /// Wakeups of the process's threads by another process's thread or an
    /// interrupt: no arrow is drawn (the waker has no track).
    pub outside_wakes: u64,
}

/// Where a thread is while the events are replayed.
#[derive(Debug, Clone, Copy)]
struct Now {
    state: State,
    since: u64,
}

/// Replays `events` (in any order) over `[start, end]`. A thread's state
/// is known from its first event: the snapshot taken as the recording
/// started (the state it was in and since when), or its creation; a
/// thread first seen by another event starts there.
pub fn build(pid: u32, mut events: Vec<TraceEvent>, start: u64, end: u64) -> Timelines {
    // Records of different CPUs reach the ring out of order.
    events.sort_by_key(|e| e.ts);
    let mut now: BTreeMap<u32, Now> = BTreeMap::new();
    let mut out = Timelines {
        start,
        end,
        ..Timelines::default()
    };
    for e in events.iter().filter(|e| e.ts <= end) {
        let Some(state) = state_from_raw(e.state) else {
            continue;
        };
        let line = out.threads.entry(e.tid).or_default();
        if line.exited {
            continue;
        }
        let previous = now.get(&e.tid).copied();
        if let Some(p) = previous {
            close(line, p, e.ts, start);
        }
        if e.kind == trace_kind::EXIT {
            line.exited = e.ts >= start;
            now.remove(&e.tid);
            continue;
        }
        // What was closed up to here continues (merged) if unchanged.
        now.insert(e.tid, Now { state, since: e.ts });
        let woken = e.kind == trace_kind::WAKEUP || e.kind == trace_kind::NEW;
        if woken && e.ts >= start {
            if e.waker_pid == pid && e.waker_tid != INTERRUPT_TID && e.waker_tid != 0 {
                out.wakes.push(Wake {
                    ts: e.ts,
                    waker: e.waker_tid,
                    wakee: e.tid,
                });
            } else {
                out.outside_wakes += 1;
            }
        }
    }
    for (tid, n) in now {
        if let Some(line) = out.threads.get_mut(&tid) {
            close(line, n, end, start);
        }
    }
    out.threads.retain(|_, l| !l.intervals.is_empty());
    // A waker must have a track for its arrow to start on.
    let known = |tid: &u32| out.threads.contains_key(tid);
    out.wakes.retain(|w| known(&w.waker) && known(&w.wakee));
    out
}

/// Ends the stretch `n` at `at`, keeping its part from `start` on; a
/// stretch in the state the last one ended in extends it.
fn close(line: &mut ThreadLine, n: Now, at: u64, start: u64) {
    let from = n.since.max(start);
    if at <= from {
        return;
    }
    match line.intervals.last_mut() {
        Some(last) if last.state == n.state && last.end == from => last.end = at,
        _ => line.intervals.push(Interval {
            start: from,
            end: at,
            state: n.state,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ts: u64, tid: u32, kind: u32, state: State) -> TraceEvent {
        TraceEvent {
            ts,
            tid,
            kind,
            state: state as u32,
            ..TraceEvent::default()
        }
    }

    fn woken(ts: u64, tid: u32, waker_pid: u32, waker_tid: u32) -> TraceEvent {
        TraceEvent {
            waker_pid,
            waker_tid,
            ..ev(ts, tid, trace_kind::WAKEUP, State::Runqueue)
        }
    }

    fn tiles(line: &ThreadLine, from: u64, to: u64) {
        let mut at = from;
        for i in &line.intervals {
            assert_eq!(i.start, at, "{line:?}");
            assert!(i.end > i.start);
            at = i.end;
        }
        assert_eq!(at, to, "{line:?}");
    }

    #[test]
    fn snapshots_and_switches_tile_the_window() {
        use trace_kind::*;
        let events = vec![
            ev(300, 2, SWITCH_IN, State::Cpu),
            woken(250, 2, 7, 1),
            ev(50, 1, SNAPSHOT, State::Cpu),
            ev(20, 2, SNAPSHOT, State::Futex),
            ev(200, 1, SWITCH_OUT, State::Sleep),
            ev(400, 1, SWITCH_IN, State::Cpu), // no wakeup seen: still tiles
            ev(450, 2, SWITCH_OUT, State::Runqueue),
            ev(2000, 2, SWITCH_IN, State::Cpu), // after the window
        ];
        let t = build(7, events, 100, 1000);
        tiles(&t.threads[&1], 100, 1000);
        tiles(&t.threads[&2], 100, 1000);
        let states: Vec<State> = t.threads[&2].intervals.iter().map(|i| i.state).collect();
        assert_eq!(
            states,
            [State::Futex, State::Runqueue, State::Cpu, State::Runqueue]
        );
        assert_eq!(
            t.wakes,
            [Wake {
                ts: 250,
                waker: 1,
                wakee: 2
            }]
        );
    }

    #[test]
    fn new_threads_start_and_exits_end_their_line() {
        use trace_kind::*;
        let events = vec![
            ev(0, 1, SNAPSHOT, State::Cpu),
            TraceEvent {
                waker_pid: 7,
                waker_tid: 1,
                ..ev(300, 3, NEW, State::Runqueue)
            },
            ev(310, 3, SWITCH_IN, State::Cpu),
            ev(600, 3, EXIT, State::Sleep),
            ev(700, 3, SWITCH_OUT, State::Sleep), // its last switch: ignored
            woken(800, 1, 9, 5),                  // another process's waker
        ];
        let t = build(7, events, 100, 1000);
        tiles(&t.threads[&3], 300, 600);
        assert!(t.threads[&3].exited);
        tiles(&t.threads[&1], 100, 1000);
        assert_eq!(t.wakes.len(), 1);
        assert_eq!(t.outside_wakes, 1);
    }

    #[test]
    fn repeated_states_merge() {
        use trace_kind::*;
        let events = vec![
            ev(10, 1, SNAPSHOT, State::Runqueue),
            ev(10, 1, WAKEUP, State::Runqueue),
            ev(500, 1, SWITCH_IN, State::Cpu),
        ];
        let t = build(7, events, 100, 1000);
        assert_eq!(t.threads[&1].intervals.len(), 2);
        tiles(&t.threads[&1], 100, 1000);
    }
}
