//! Thread timelines as a Perfetto trace: a process track, a track per
//! thread (named), a slice per state interval (SLICE_BEGIN/END, names
//! interned), and a flow arrow from each waker (an instant on its track) to
//! the slice its wakee starts. Packets are encoded one by one into the
//! output, never held as a list.

pub mod proto;

use std::collections::{BTreeMap, HashMap};

use super::{
    record::Clocks,
    timeline::{Timelines, Wake},
};
use crate::{profile::model::state::State, untrusted::text::clean_to};
use proto::*;

/// The one packet sequence of the trace.
const SEQUENCE: u32 = 1;
/// Longest thread or process name kept (bytes): names are untrusted.
const NAME_MAX: usize = 64;
/// Interned names: the states (iid = state + 1), then these.
const IID_WAKES: u64 = State::COUNT as u64 + 1;
const IID_WOKEN: u64 = State::COUNT as u64 + 2;
/// Bytes a timeline event may take in the trace, at most: a slice's begin
/// and end packets and a wake's instant, ~32 bytes each (56 bytes an
/// event measured on a lock convoy).
pub const BYTES_PER_EVENT: usize = 100;

/// Names of the process and its threads (untrusted: cut and cleaned here).
#[derive(Debug, Clone, Default)]
pub struct Names {
    pub process: String,
    pub threads: HashMap<u32, String>,
}

fn process_uuid(pid: u32) -> u64 {
    1 << 40 | u64::from(pid)
}

fn thread_uuid(tid: u32) -> u64 {
    2 << 40 | u64::from(tid)
}

/// What happens at one instant on one track, in the order written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mark {
    /// A slice ends before the next one on its track begins.
    End,
    Begin {
        state: u32,
        flow: u64,
    },
    Wakes {
        flow: u64,
    },
    Woken {
        flow: u64,
    },
}

fn packet(ts: Option<u64>) -> TracePacket {
    TracePacket {
        timestamp: ts,
        timestamp_clock_id: ts.map(|_| CLOCK_MONOTONIC),
        trusted_packet_sequence_id: Some(SEQUENCE),
        ..TracePacket::default()
    }
}

fn write(out: &mut Vec<u8>, p: &TracePacket) {
    // `Trace` is `repeated TracePacket packet = 1`: its encoding is the
    // packets' encodings, each as field 1.
    prost::encoding::message::encode(1, p, out);
}

/// The trace of `pid`'s `timelines`.
pub fn encode(pid: u32, timelines: &Timelines, names: &Names, clocks: Clocks) -> Vec<u8> {
    let mut out = Vec::new();
    let mut snapshot = packet(None);
    snapshot.clock_snapshot = Some(ClockSnapshot {
        clocks: [
            (CLOCK_BOOTTIME, clocks.boottime),
            (CLOCK_MONOTONIC, clocks.monotonic),
            (CLOCK_REALTIME, clocks.realtime),
        ]
        .map(|(id, ts)| Clock {
            clock_id: Some(id),
            timestamp: Some(ts),
        })
        .to_vec(),
        primary_trace_clock: Some(CLOCK_BOOTTIME),
    });
    write(&mut out, &snapshot);
    write(&mut out, &descriptors_packet(pid, None, names));
    for &tid in timelines.threads.keys() {
        write(&mut out, &descriptors_packet(pid, Some(tid), names));
    }
    let mut interned = packet(Some(timelines.start));
    interned.sequence_flags = Some(SEQ_INCREMENTAL_STATE_CLEARED);
    interned.interned_data = Some(InternedData {
        event_names: State::ALL
            .iter()
            .map(|s| (*s as u64 + 1, s.name()))
            .chain([(IID_WAKES, "wakes"), (IID_WOKEN, "woken")])
            .map(|(iid, name)| EventName {
                iid: Some(iid),
                name: Some(name.to_string()),
            })
            .collect(),
    });
    write(&mut out, &interned);
    for (ts, tid, mark) in marks(timelines) {
        write(&mut out, &event_packet(ts, tid, mark));
    }
    out
}

/// The process's track (`tid` none) or a thread's.
fn descriptors_packet(pid: u32, tid: Option<u32>, names: &Names) -> TracePacket {
    let mut p = packet(None);
    let pid_i = pid as i32;
    p.track_descriptor = Some(match tid {
        None => TrackDescriptor {
            uuid: Some(process_uuid(pid)),
            process: Some(ProcessDescriptor {
                pid: Some(pid_i),
                process_name: Some(clean_to(&names.process, NAME_MAX).into_owned()),
            }),
            ..TrackDescriptor::default()
        },
        Some(tid) => TrackDescriptor {
            uuid: Some(thread_uuid(tid)),
            parent_uuid: Some(process_uuid(pid)),
            thread: Some(ThreadDescriptor {
                pid: Some(pid_i),
                tid: Some(tid as i32),
                thread_name: names
                    .threads
                    .get(&tid)
                    .map(|n| clean_to(n, NAME_MAX).into_owned()),
            }),
            ..TrackDescriptor::default()
        },
    });
    p
}

fn event_packet(ts: u64, tid: u32, mark: Mark) -> TracePacket {
    let mut p = packet(Some(ts));
    p.sequence_flags = Some(SEQ_NEEDS_INCREMENTAL_STATE);
    let mut e = TrackEvent {
        track_uuid: Some(thread_uuid(tid)),
        ..TrackEvent::default()
    };
    match mark {
        Mark::End => e.r#type = Some(TYPE_SLICE_END),
        Mark::Begin { state, flow } => {
            e.r#type = Some(TYPE_SLICE_BEGIN);
            e.name_iid = Some(u64::from(state) + 1);
            e.terminating_flow_ids.extend((flow != 0).then_some(flow));
        }
        Mark::Wakes { flow } => {
            e.r#type = Some(TYPE_INSTANT);
            e.name_iid = Some(IID_WAKES);
            e.flow_ids.push(flow);
        }
        Mark::Woken { flow } => {
            e.r#type = Some(TYPE_INSTANT);
            e.name_iid = Some(IID_WOKEN);
            e.terminating_flow_ids.push(flow);
        }
    }
    p.track_event = Some(e);
    p
}

/// Every slice boundary and wake, in time order.
fn marks(t: &Timelines) -> Vec<(u64, u32, Mark)> {
    // Flow ids from 1, by wakee and time; a wake that starts no slice of
    // its wakee (it was runnable already) ends on a `woken` instant.
    let mut flows: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    let mut marks = Vec::new();
    for (i, Wake { ts, waker, wakee }) in t.wakes.iter().enumerate() {
        let flow = i as u64 + 1;
        flows.insert((*wakee, *ts), flow);
        marks.push((*ts, *waker, Mark::Wakes { flow }));
    }
    for (&tid, line) in &t.threads {
        for i in &line.intervals {
            let flow = flows.remove(&(tid, i.start)).unwrap_or(0);
            let state = i.state as u32;
            marks.push((i.start, tid, Mark::Begin { state, flow }));
            marks.push((i.end, tid, Mark::End));
        }
    }
    for ((wakee, ts), flow) in flows {
        marks.push((ts, wakee, Mark::Woken { flow }));
    }
    // At one instant: ends before begins (slices tile), instants after.
    marks.sort_by_key(|&(ts, tid, mark)| (ts, mark, tid));
    marks
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::trace::timeline::{Interval, ThreadLine};

    fn line(parts: &[(u64, u64, State)]) -> ThreadLine {
        ThreadLine {
            intervals: parts
                .iter()
                .map(|&(start, end, state)| Interval { start, end, state })
                .collect(),
            exited: false,
        }
    }

    #[test]
    fn slices_flows_and_names_round_trip() {
        let mut t = Timelines {
            start: 100,
            end: 300,
            ..Timelines::default()
        };
        t.threads
            .insert(1, line(&[(100, 200, State::Cpu), (200, 300, State::Futex)]));
        t.threads.insert(
            2,
            line(&[(100, 150, State::Futex), (150, 300, State::Runqueue)]),
        );
        t.wakes.push(Wake {
            ts: 150,
            waker: 1,
            wakee: 2,
        });
        let names = Names {
            process: "app".into(),
            threads: [(1, "main".to_string()), (2, "bad\nname;".to_string())].into(),
        };
        let bytes = encode(7, &t, &names, Clocks::default());
        let trace = Trace::decode(bytes.as_slice()).unwrap();
        let events: Vec<&TrackEvent> = trace
            .packet
            .iter()
            .filter_map(|p| p.track_event.as_ref())
            .collect();
        assert_eq!(events.len(), 8 + 1);
        let begin = events
            .iter()
            .find(|e| e.terminating_flow_ids == [1])
            .unwrap();
        assert_eq!(begin.track_uuid, Some(thread_uuid(2)));
        assert_eq!(begin.name_iid, Some(State::Runqueue as u64 + 1));
        let thread_names: Vec<String> = trace
            .packet
            .iter()
            .filter_map(|p| {
                p.track_descriptor
                    .as_ref()?
                    .thread
                    .as_ref()?
                    .thread_name
                    .clone()
            })
            .collect();
        assert_eq!(thread_names, ["main", "bad name:"]);
        // At 200 thread 1's cpu slice ends before its futex one begins.
        let at_200: Vec<i32> = trace
            .packet
            .iter()
            .filter(|p| p.timestamp == Some(200))
            .filter_map(|p| p.track_event.as_ref()?.r#type)
            .collect();
        assert_eq!(at_200, [TYPE_SLICE_END, TYPE_SLICE_BEGIN]);
    }
}
