use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::*;
use crate::profile::{
    model::{
        spans::{SpanRecord, SpanSample, SpanSlice, SpanTime, TraceId},
        store::Store,
        Slice,
    },
    report::host_facts::Empty,
};

const PID: u32 = 40;

fn at(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
}

fn id(n: u64) -> SpanId {
    SpanId::from_raw(n).unwrap()
}

/// A span `n` of trace `trace`, route `route`: each `(tid, state, ms,
/// stack)` one thread's time and stack row.
struct Plan {
    n: u64,
    trace: u8,
    route: &'static str,
    rows: Vec<(u32, State, u64, &'static str)>,
}

fn slice(start: u64, plans: &[Plan]) -> Slice {
    let mut slice = Slice::empty(at(start), at(start + 1));
    slice.processes.insert(PID, "shop".into());
    let mut spans = SpanSlice::default();
    for p in plans {
        spans.records.push(SpanRecord {
            pid: PID,
            span: id(p.n),
            trace: TraceId([p.trace; 16]),
            flags: 1,
            attrs: vec![("http_route".into(), p.route.into())],
            attrs_cut: false,
        });
        for (tid, state, ms, stack) in &p.rows {
            let mut ns = [0; State::COUNT];
            ns[*state as usize] = ms * 1_000_000;
            spans.times.push(SpanTime {
                pid: PID,
                tid: *tid,
                span: id(p.n),
                ns,
                first_ns: 1_000,
                last_ns: 1_000 + ms * 1_000_000,
            });
            let frames: Vec<Arc<str>> = stack.split(';').map(Arc::from).collect();
            spans.samples.push(SpanSample {
                pid: PID,
                tid: *tid,
                span: id(p.n),
                state: *state,
                stack: frames.into(),
                ns: ms * 1_000_000,
                count: 1,
            });
        }
    }
    slice.spans = spans;
    slice
}

fn store() -> Snapshot {
    let mut store = Store::new(Duration::from_secs(600));
    store.push(slice(
        0,
        &[
            Plan {
                n: 1,
                trace: 0xa,
                route: "/cart",
                rows: vec![
                    (41, State::Cpu, 30, "main;cart"),
                    (42, State::Futex, 200, "main;cart;lock"),
                ],
            },
            Plan {
                n: 2,
                trace: 0xb,
                route: "/pay",
                rows: vec![
                    (41, State::Io, 100, "main;pay;recv"),
                    (41, State::Cpu, 5, "main;pay"),
                ],
            },
        ],
    ));
    store.push(slice(
        1,
        &[Plan {
            n: 3,
            trace: 0xa,
            route: "/cart",
            rows: vec![(43, State::Runqueue, 50, "main;cart")],
        }],
    ));
    store.snapshot()
}

fn asked(sort: SortBy, spans: SpanMatch) -> Asked {
    Asked {
        pid: PID,
        window: Window::between(at(0), at(2)),
        sort,
        limit: None,
        spans,
    }
}

fn ids(r: &SpansReport) -> Vec<String> {
    r.spans.iter().map(|s| s.span_id.clone()).collect()
}

fn sum(s: &StatesUs) -> u64 {
    s.cpu + s.runqueue + s.throttled + s.futex + s.io + s.sleep
}

#[test]
fn wall_is_the_sum_of_states_and_spans_sort_by_wall_or_a_state() {
    let store = store();
    let list = |sort| {
        list(
            &store,
            &Empty,
            &asked(sort, SpanMatch::default()),
            &Sight::all(),
        )
        .unwrap()
        .body
    };
    let r = list(SortBy::Wall);
    assert_eq!(ids(&r), [id(1).hex(), id(2).hex(), id(3).hex()]);
    assert_eq!(r.process.as_deref(), Some("shop"));
    for s in &r.spans {
        assert_eq!(s.wall_us, sum(&s.states_us), "{s:?}");
    }
    let first = &r.spans[0];
    assert_eq!((first.wall_us, first.states_us.futex), (230_000, 200_000));
    assert_eq!(first.threads, [41, 42]);
    assert_eq!(first.trace_id, "0a".repeat(16));
    assert_eq!(first.attrs["http_route"], "/cart");
    assert_eq!(first.top_stacks[0].stack, "main;cart;lock");
    assert_eq!(first.top_stacks[0].state, "futex");
    assert!(first.first_seen <= first.last_seen);
    assert_eq!(ids(&list(SortBy::State(State::Io)))[0], id(2).hex());
    assert_eq!(ids(&list(SortBy::State(State::Runqueue)))[0], id(3).hex());
}

#[test]
fn filters_keep_only_matching_spans_and_limit_cuts() {
    let store = store();
    let run = |spans: SpanMatch, limit| {
        let mut a = asked(SortBy::Wall, spans);
        a.limit = limit;
        list(&store, &Empty, &a, &Sight::all()).unwrap().body
    };
    let by_route = SpanMatch {
        attrs: vec![("http_route".into(), "/cart".into())],
        ..SpanMatch::default()
    };
    assert_eq!(ids(&run(by_route, None)), [id(1).hex(), id(3).hex()]);
    let by_trace = SpanMatch {
        trace: Some(TraceId([0xb; 16])),
        ..SpanMatch::default()
    };
    assert_eq!(ids(&run(by_trace, None)), [id(2).hex()]);
    let none = SpanMatch {
        attrs: vec![("http_route".into(), "/nope".into())],
        ..SpanMatch::default()
    };
    assert!(run(none, None).spans.is_empty());
    let cut = run(SpanMatch::default(), Some(1));
    assert_eq!(
        (cut.spans.len(), cut.spans_total, cut.rows_omitted),
        (1, 3, 2)
    );
}

#[test]
fn one_span_in_full_with_its_threads_and_timeline() {
    let store = store();
    let window = Window::between(at(0), at(2));
    let d = detail(&store, &Empty, (PID, id(1)), window, &Sight::all())
        .unwrap()
        .body;
    let tids: Vec<u32> = d.by_thread.iter().map(|t| t.tid).collect();
    assert_eq!(tids, [41, 42]);
    let threads: u64 = d.by_thread.iter().map(|t| t.wall_us).sum();
    assert_eq!(threads, d.span.wall_us);
    assert_eq!(d.stacks.len(), 2);
    assert!(d
        .timeline
        .starts_with(&format!("/timeline?pid={PID}&from=")));
    let missing = detail(&store, &Empty, (PID, id(9)), window, &Sight::all());
    assert!(matches!(missing, Err(Refusal::NotFound(_))));
    assert!(text::render_detail_text(&d).contains("main;cart;lock"));
}

#[test]
fn an_unknown_pid_is_not_found() {
    let store = store();
    let mut a = asked(SortBy::Wall, SpanMatch::default());
    a.pid = 99;
    assert!(matches!(
        list(&store, &Empty, &a, &Sight::all()),
        Err(Refusal::NotFound(_))
    ));
}

#[test]
fn sort_names_parse() {
    for name in SortBy::NAMES {
        assert!(SortBy::parse(name).is_some(), "{name}");
    }
    assert_eq!(SortBy::parse("futex"), Some(SortBy::State(State::Futex)));
    assert_eq!(SortBy::parse("gpu"), None);
}
