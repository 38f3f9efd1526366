//! `/trace`: a lock convoy recorded for a few seconds, the Perfetto trace
//! decoded by a wire-format reader of its own (below: field numbers from
//! Perfetto's official protos, not the daemon's prost structs), then
//! checked: every thread's slices tile the window, their sums match
//! `/threads` over the same slices of the store within 2 % of the wall
//! time, the convoy's futex handoffs have flow arrows, threads are named.

use std::{collections::HashMap, io::Read, time::Duration};

use serde_json::Value;

use crate::support::{
    rows::{json_at, within},
    *,
};

/// Field numbers, as in github.com/google/perfetto `protos/perfetto/`:
/// `trace/trace.proto` (`repeated TracePacket packet = 1`),
/// `trace/trace_packet.proto` (`timestamp = 8`, `clock_snapshot = 6`,
/// `track_event = 11`, `interned_data = 12`, `track_descriptor = 60`,
/// `timestamp_clock_id = 58`), `common/builtin_clock.proto` (MONOTONIC 3,
/// REALTIME 1), `trace/clock_snapshot.proto` (`clocks = 1`; Clock
/// `clock_id = 1`, `timestamp = 2`), `trace/track_event/track_descriptor.proto`
/// (`uuid = 1`, `thread = 4`), `.../thread_descriptor.proto` (`tid = 2`,
/// `thread_name = 5`), `.../track_event.proto` (`type = 9` with
/// SLICE_BEGIN 1, SLICE_END 2, INSTANT 3; `name_iid = 10`,
/// `track_uuid = 11`, `flow_ids = 47`, `terminating_flow_ids = 48`),
/// `trace/interned_data/interned_data.proto` (`event_names = 2`; EventName
/// `iid = 1`, `name = 2`).
mod wire {
    /// A field's value: varint, fixed64 or bytes (fixed32 never occurs).
    #[derive(Debug, Clone, Copy)]
    pub enum V<'a> {
        Int(u64),
        Bytes(&'a [u8]),
    }

    fn varint(b: &[u8], i: &mut usize) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = b[*i];
            *i += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return v;
            }
        }
        panic!("varint too long");
    }

    /// The fields of one message, in order.
    pub fn fields(b: &[u8]) -> Vec<(u64, V<'_>)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let key = varint(b, &mut i);
            let v = match key & 7 {
                0 => V::Int(varint(b, &mut i)),
                1 => {
                    let v = u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
                    i += 8;
                    V::Int(v)
                }
                2 => {
                    let len = varint(b, &mut i) as usize;
                    i += len;
                    V::Bytes(&b[i - len..i])
                }
                t => panic!("wire type {t} at {i}"),
            };
            out.push((key >> 3, v));
        }
        out
    }

    pub fn int(f: &[(u64, V<'_>)], n: u64) -> Option<u64> {
        f.iter().find_map(|(k, v)| match v {
            V::Int(x) if *k == n => Some(*x),
            _ => None,
        })
    }

    pub fn ints(f: &[(u64, V<'_>)], n: u64) -> Vec<u64> {
        f.iter()
            .filter_map(|(k, v)| match v {
                V::Int(x) if *k == n => Some(*x),
                _ => None,
            })
            .collect()
    }

    pub fn msg<'a>(f: &[(u64, V<'a>)], n: u64) -> Option<&'a [u8]> {
        f.iter().find_map(|(k, v)| match v {
            V::Bytes(b) if *k == n => Some(*b),
            _ => None,
        })
    }

    pub fn msgs<'a>(f: &[(u64, V<'a>)], n: u64) -> Vec<&'a [u8]> {
        f.iter()
            .filter_map(|(k, v)| match v {
                V::Bytes(b) if *k == n => Some(*b),
                _ => None,
            })
            .collect()
    }
}

/// One track event as decoded.
#[derive(Debug, Clone)]
struct Event {
    ts: u64,
    kind: u64,
    track: u64,
    name: String,
    flows: Vec<u64>,
    ends_flows: Vec<u64>,
}

#[derive(Debug, Default)]
struct Decoded {
    /// CLOCK_REALTIME - CLOCK_MONOTONIC, from the clock snapshot.
    realtime_offset: i128,
    /// Thread tracks: uuid -> (tid, name).
    threads: HashMap<u64, (u64, String)>,
    events: Vec<Event>,
}

fn decode(bytes: &[u8]) -> Decoded {
    use wire::*;
    let mut d = Decoded::default();
    let mut names: HashMap<u64, String> = HashMap::new();
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
    for packet in msgs(&fields(bytes), 1) {
        let p = fields(packet);
        if let Some(snap) = msg(&p, 6) {
            let clocks: HashMap<u64, u64> = msgs(&fields(snap), 1)
                .into_iter()
                .map(|c| {
                    let c = fields(c);
                    (int(&c, 1).unwrap(), int(&c, 2).unwrap())
                })
                .collect();
            d.realtime_offset = i128::from(clocks[&1]) - i128::from(clocks[&3]);
        }
        if let Some(td) = msg(&p, 60) {
            let td = fields(td);
            if let Some(thread) = msg(&td, 4) {
                let t = fields(thread);
                let name = msg(&t, 5).map(text).unwrap_or_default();
                d.threads
                    .insert(int(&td, 1).unwrap(), (int(&t, 2).unwrap(), name));
            }
        }
        if let Some(interned) = msg(&p, 12) {
            for n in msgs(&fields(interned), 2) {
                let n = fields(n);
                names.insert(int(&n, 1).unwrap(), text(msg(&n, 2).unwrap()));
            }
        }
        if let Some(te) = msg(&p, 11) {
            assert_eq!(int(&p, 58), Some(3), "timestamps on CLOCK_MONOTONIC");
            let e = fields(te);
            d.events.push(Event {
                ts: int(&p, 8).unwrap(),
                kind: int(&e, 9).unwrap(),
                track: int(&e, 11).unwrap(),
                name: int(&e, 10)
                    .map(|iid| names[&iid].clone())
                    .unwrap_or_default(),
                flows: ints(&e, 47),
                ends_flows: ints(&e, 48),
            });
        }
    }
    d
}

const STATES: [&str; 6] = ["cpu", "runqueue", "futex", "io", "sleep", "throttled"];

/// Each thread track's slices, checked to tile `[start, end]` (ns).
fn slices_tiling(d: &Decoded, start: u64, end: u64) -> HashMap<u64, Vec<(u64, u64, String)>> {
    let mut open: HashMap<u64, (u64, String)> = HashMap::new();
    let mut out: HashMap<u64, Vec<(u64, u64, String)>> = HashMap::new();
    for e in &d.events {
        let tid = d.threads[&e.track].0;
        match e.kind {
            1 => {
                assert!(STATES.contains(&e.name.as_str()), "slice named {e:?}");
                let previous = out.get(&tid).and_then(|s| s.last()).map(|s| s.1);
                assert!(
                    open.insert(tid, (e.ts, e.name.clone())).is_none(),
                    "overlap: {e:?}"
                );
                match previous {
                    Some(p) => assert_eq!(p, e.ts, "gap or overlap on {tid}: {e:?}"),
                    None => assert!(e.ts >= start, "{e:?}"),
                }
            }
            2 => {
                let (from, name) = open
                    .remove(&tid)
                    .unwrap_or_else(|| panic!("end without begin: {e:?}"));
                assert!(e.ts > from, "{e:?}");
                out.entry(tid).or_default().push((from, e.ts, name));
            }
            3 => {}
            k => panic!("event type {k}"),
        }
    }
    assert!(open.is_empty(), "slices left open: {open:?}");
    for (tid, s) in &out {
        assert!(s.last().unwrap().1 <= end, "{tid} past the window");
    }
    out
}

/// Time of `slices` in each state within `[from, until]` (ns), in µs.
fn sums(slices: &[(u64, u64, String)], from: u64, until: u64) -> HashMap<String, f64> {
    let mut sums = HashMap::new();
    for (a, b, state) in slices {
        let overlap = (*b).min(until).saturating_sub((*a).max(from));
        *sums.entry(state.clone()).or_insert(0.0) += overlap as f64 / 1000.0;
    }
    sums
}

/// GET `/trace`: status, headers (lower-case names) and body.
fn record(url: &str, query: &str) -> (u16, HashMap<String, String>, Vec<u8>) {
    let r = match ureq::get(&format!("{url}/trace?{query}"))
        .timeout(Duration::from_secs(120))
        .call()
    {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("/trace?{query}: {e}"),
    };
    let headers = r
        .headers_names()
        .into_iter()
        .map(|n| {
            let v = r.header(&n).unwrap_or_default().to_string();
            (n.to_lowercase(), v)
        })
        .collect();
    let status = r.status();
    let mut bytes = Vec::new();
    r.into_reader().read_to_end(&mut bytes).unwrap();
    (status, headers, bytes)
}

#[test]
fn a_lock_convoy_traced_tiles_its_window_and_matches_threads() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    let w = Workload::start(&workload("convoy"), &["4"]);
    let pid = w.pid;
    // Its threads are known to the store (full names) and accounted
    // before recording: the main thread, blocked in pause() since it
    // started, shows in the store's latest slice (the engine's first
    // seconds of such a thread are not what is compared here).
    within(Duration::from_secs(30), || {
        let t = json_at(url, &format!("/timeline?pid={pid}&seconds=3"));
        let rows = t["rows"].as_array()?;
        let main = rows.iter().find(|r| r["name"] == "convoy")?;
        let sleep = main["cells"].as_array()?.last()?[4].as_u64()?;
        let named = rows.iter().any(|r| r["name"] == "convoy-3");
        (named && sleep >= 500).then_some(())
    })
    .expect("the convoy accounted in /timeline");

    let (status, h, bytes) = record(url, &format!("pid={pid}&seconds=6"));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let disposition = &h["content-disposition"];
    assert!(
        disposition.starts_with(&format!("attachment; filename=wallscope-{pid}-"))
            && disposition.ends_with(".perfetto-trace"),
        "{disposition}"
    );
    assert_eq!(h["x-wallscope-trace-cut"], "0");
    eprintln!(
        "trace: {} lost, {}",
        h["x-wallscope-trace-lost"], h["x-wallscope-trace-slices"]
    );
    let window = &h["x-wallscope-trace-window-ns"];
    let (start, end) = window.split_once('-').unwrap();
    let (start, end): (u64, u64) = (start.parse().unwrap(), end.parse().unwrap());
    assert!(end - start >= 5_900_000_000, "{window}");

    let d = decode(&bytes);
    let names: Vec<&str> = d.threads.values().map(|(_, n)| n.as_str()).collect();
    for name in ["convoy-0", "convoy-1", "convoy-2", "convoy-3", "napper"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    let slices = slices_tiling(&d, start, end);
    let tid_of = |name: &str| {
        d.threads
            .values()
            .find(|(_, n)| n == name)
            .map(|(t, _)| *t)
            .unwrap()
    };
    let convoy: Vec<u64> = (0..4).map(|i| tid_of(&format!("convoy-{i}"))).collect();
    let mut count = 0;
    for &tid in convoy.iter().chain([tid_of("napper")].iter()) {
        let s = &slices[&tid];
        // Known from the window's start: the snapshot.
        assert_eq!(s.first().unwrap().0, start, "{tid}");
        assert_eq!(s.last().unwrap().1, end, "{tid}");
        count += s.len();
    }

    // Flow arrows: a convoy thread's `wakes` instant to another convoy
    // thread's runqueue slice (the futex handoff).
    let ends: HashMap<u64, &Event> = d
        .events
        .iter()
        .flat_map(|e| e.ends_flows.iter().map(move |f| (*f, e)))
        .collect();
    let tid = |e: &Event| d.threads[&e.track].0;
    let handoffs = d
        .events
        .iter()
        .filter(|e| e.kind == 3 && e.name == "wakes" && convoy.contains(&tid(e)))
        .filter_map(|e| Some((e, *ends.get(e.flows.first()?)?)))
        .filter(|(a, b)| convoy.contains(&tid(b)) && tid(a) != tid(b) && a.ts == b.ts)
        .count();
    assert!(handoffs >= 10, "{handoffs} handoffs with a flow arrow");

    // The store's slices that lie within the trace's window, on the wall clock.
    let wall = |mono: u64| (i128::from(mono) + d.realtime_offset) / 1_000_000;
    let (from_ms, until_ms) = (wall(start) as u64, wall(end) as u64);
    let columns = within(Duration::from_secs(20), || {
        let t = json_at(url, &format!("/timeline?pid={pid}&seconds=60"));
        let cols: Vec<(u64, u64)> = t["columns"]
            .as_array()?
            .iter()
            .map(|c| {
                (
                    c["start_ms"].as_u64().unwrap(),
                    c["end_ms"].as_u64().unwrap(),
                )
            })
            .collect();
        cols.iter().any(|c| c.1 > until_ms).then_some(cols)
    })
    .expect("the store's slices past the trace");
    let inside: Vec<&(u64, u64)> = columns
        .iter()
        .filter(|c| c.0 >= from_ms && c.1 <= until_ms)
        .collect();
    assert!(inside.len() >= 3, "{inside:?} within {from_ms}..{until_ms}");
    let (f, u) = (inside[0].0, inside.last().unwrap().1);
    let report = json_at(
        url,
        &format!(
            "/threads?pid={pid}&from={}.{:03}&until={}.{:03}",
            f / 1000,
            f % 1000,
            u / 1000,
            u % 1000
        ),
    );
    let to_mono = |ms: u64| (i128::from(ms) * 1_000_000 - d.realtime_offset) as u64;
    let (mf, mu) = (to_mono(f), to_mono(u));
    let wall_us = (u - f) as f64 * 1000.0;
    let mut worst = (0.0f64, String::new());
    for row in report["threads"].as_array().unwrap() {
        let t = row["tid"].as_u64().unwrap();
        let Some(s) = slices.get(&t) else { continue };
        let traced = sums(s, mf, mu);
        let line: Vec<String> = STATES
            .iter()
            .map(|st| {
                let a = traced.get(*st).copied().unwrap_or(0.0) / 1000.0;
                format!("{st} {a:.0}/{:.0}", us(row, &format!("{st}_us")) / 1000.0)
            })
            .collect();
        eprintln!(
            "{t} {} (trace/threads ms): {}",
            row["name"],
            line.join(", ")
        );
        for state in STATES {
            let a = traced.get(state).copied().unwrap_or(0.0);
            let b = us(row, &format!("{state}_us"));
            let diff = (a - b).abs() / wall_us;
            if diff > worst.0 {
                worst = (
                    diff,
                    format!("{t} {state}: trace {a:.0} us, /threads {b:.0} us"),
                );
            }
        }
    }
    eprintln!(
        "trace: {} slices on the 5 named threads, {handoffs} handoff flows, worst state difference vs /threads {:.3} % of {:.0} ms ({})",
        count,
        worst.0 * 100.0,
        wall_us / 1000.0,
        worst.1
    );
    assert!(worst.0 <= 0.02, "{}", worst.1);
    drop(w);
}

#[test]
fn trace_refuses_bad_requests_and_queues_a_second_recording() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let url = daemon();
    for (q, status, word) in [
        ("seconds=5", 400, "`pid`"),
        ("pid=1&seconds=0", 400, "`seconds`"),
        ("pid=1&seconds=31", 400, "`seconds`"),
        ("pid=4000000&seconds=1", 404, "4000000"),
    ] {
        let (s, body) = get(&format!("{url}/trace?{q}"));
        assert_eq!(s, status, "{q}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v["error"].as_str().unwrap().contains(word), "{q}: {body}");
    }
    // Two recordings at once: the second waits for the first (BPF has one
    // target), and both are served (a user's second one would be refused:
    // see security_shares).
    let trace = |url: &str| json_at(url, "/healthz")["trace"].clone();
    let waited = trace(url)["waited"].as_u64().unwrap_or(0);
    let me = std::process::id();
    let first = std::thread::spawn(move || record(daemon(), &format!("pid={me}&seconds=4")));
    let running = within(Duration::from_secs(30), || {
        (trace(url)["queued"].as_u64().unwrap_or(0) > 0).then_some(())
    });
    assert!(running.is_some(), "the first recording never started");
    let (s, _, body) = record(url, &format!("pid={me}&seconds=1"));
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    let (s, _, body) = first.join().unwrap();
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    assert!(
        trace(url)["waited"].as_u64().unwrap_or(0) > waited,
        "{}",
        trace(url)
    );
}
