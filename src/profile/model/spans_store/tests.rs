use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::*;
use crate::profile::model::{
    spans::{SpanRecord, SpanSample, SpanTime, TraceId},
    state::State,
};

fn at(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
}

fn span(n: u64) -> SpanId {
    SpanId::from_raw(n + 1).unwrap()
}

/// `count` spans from `first`, each with one thread's 1 ms on the CPU
/// and one stack row, `route` their attribute.
fn slice(first: u64, count: u64, route: &str) -> SpanSlice {
    let mut s = SpanSlice::default();
    for n in first..first + count {
        s.records.push(SpanRecord {
            pid: 7,
            span: span(n),
            trace: TraceId([1; 16]),
            flags: 1,
            attrs: vec![("http_route".into(), route.into())],
            attrs_cut: false,
        });
        let mut ns = [0; State::COUNT];
        ns[State::Cpu as usize] = 1_000_000;
        s.times.push(SpanTime {
            pid: 7,
            tid: 70,
            span: span(n),
            ns,
            first_ns: 10,
            last_ns: 20,
        });
        s.samples.push(SpanSample {
            pid: 7,
            tid: 70,
            span: span(n),
            state: State::Cpu,
            stack: Arc::from(vec![Arc::from("main"), Arc::from("serve")]),
            ns: 1_000_000,
            count: 1,
        });
    }
    s
}

fn held_cpu_ns(store: &SpanStore) -> u64 {
    let view = store.view();
    let kept: u64 = (view.buckets.iter())
        .flat_map(|b| &b.times)
        .map(|t| t.ns[State::Cpu as usize])
        .sum();
    let folded: u64 = (view.aggregates.rows.values())
        .map(|a| a.ns[State::Cpu as usize])
        .sum();
    kept + folded
}

#[test]
fn a_million_span_ids_a_minute_stay_within_the_bound_and_are_counted() {
    let max = 2 << 20;
    let mut store = SpanStore::new(Duration::from_secs(600), max);
    let per_s = 1_000_000 / 60 + 1;
    let mut pushed = 0;
    for s in 0..60 {
        let route = if s % 2 == 0 { "/a" } else { "/b" };
        store.push(at(s), at(s + 1), slice(pushed, per_s, route));
        pushed += per_s;
        assert!(store.bytes() <= max, "{} > {max} at {s}", store.bytes());
    }
    let stats = store.stats();
    assert!(
        stats.aggregated_spans > 0 && stats.refused_rows > 0,
        "{stats:?}"
    );
    // Every span is known by id, folded or refused; no time counted twice.
    let known = stats.spans as u64 + stats.aggregated_spans;
    assert!(known <= pushed, "{known} > {pushed}");
    assert!(held_cpu_ns(&store) <= pushed * 1_000_000);
    let routes: Vec<_> = (store.view().aggregates.rows.keys())
        .map(|(_, a)| a.first().map(|(_, v)| v.to_string()))
        .collect();
    assert!(routes.contains(&Some("/a".into())), "{routes:?}");
}

#[test]
fn under_the_bound_nothing_is_dropped_and_past_it_old_spans_fold_by_attributes() {
    let mut probe = SpanStore::new(Duration::from_secs(600), DEFAULT_MAX_BYTES);
    probe.push(at(0), at(1), slice(0, 3, "/a"));
    let one = probe.bytes();
    let mut store = SpanStore::new(Duration::from_secs(600), one + one / 2);
    store.push(at(0), at(1), slice(0, 3, "/a"));
    assert_eq!(
        (store.stats().spans, store.stats().aggregated_spans),
        (3, 0)
    );
    store.push(at(1), at(2), slice(3, 3, "/b"));
    let view = store.view();
    assert_eq!(view.buckets.len(), 1);
    let a = (view.aggregates.rows.iter())
        .find(|((_, attrs), _)| &*attrs[0].1 == "/a")
        .map(|(_, row)| row.clone())
        .unwrap();
    assert_eq!((a.spans, a.ns[State::Cpu as usize]), (3, 3_000_000));
    let stats = store.stats();
    assert_eq!((stats.spans, stats.aggregated_spans), (3, 3));
    assert_eq!((stats.aggregated_rows, stats.refused_rows), (6, 0));
    assert_eq!(held_cpu_ns(&store), 6_000_000);
    assert!(store.bytes() <= one + one / 2);
}

#[test]
fn past_the_retention_spans_are_forgotten() {
    let mut store = SpanStore::new(Duration::from_secs(10), DEFAULT_MAX_BYTES);
    store.push(at(0), at(1), slice(0, 3, "/a"));
    store.push(at(5), at(6), slice(3, 2, "/b"));
    store.push(at(11), at(12), SpanSlice::default());
    let view = store.view();
    assert_eq!((view.buckets.len(), view.stats.spans), (1, 2));
    assert!(view.aggregates.rows.is_empty());
    assert_eq!(view.aggregates.bytes(), 0);
}

#[test]
fn a_span_seen_again_keeps_its_record_until_its_last_bucket_folds() {
    let mut store = SpanStore::new(Duration::from_secs(10), DEFAULT_MAX_BYTES);
    store.push(at(0), at(1), slice(0, 1, "/a"));
    let mut again = slice(0, 1, "/a");
    again.records.clear();
    store.push(at(5), at(6), again);
    store.push(at(12), at(13), SpanSlice::default());
    let view = store.view();
    assert_eq!(view.buckets.len(), 1);
    assert!(view.buckets[0].records.contains_key(&(7, span(0))));
    assert_eq!(store.stats().aggregated_spans, 0);
}

/// `slice` of another process.
fn slice_of(pid: u32, first: u64, count: u64, route: &str) -> SpanSlice {
    let mut s = slice(first, count, route);
    s.records.iter_mut().for_each(|r| r.pid = pid);
    s.times.iter_mut().for_each(|t| t.pid = pid);
    s.samples.iter_mut().for_each(|x| x.pid = pid);
    s
}

fn spans_held_of(store: &SpanStore, pid: u32) -> usize {
    let view = store.view();
    let ids: std::collections::HashSet<_> = (view.buckets.iter())
        .flat_map(|b| &b.times)
        .filter(|t| t.pid == pid)
        .map(|t| t.span)
        .collect();
    ids.len()
}

#[test]
fn a_process_that_floods_spans_ages_out_its_own_not_the_others() {
    let mut store = SpanStore::new(Duration::from_secs(600), 2 << 20);
    // A quiet service: 20 spans a second; beside it, 20,000 a second.
    for sec in 0..30 {
        let mut push = slice_of(8, sec * 20, 20, "/quiet");
        let flood = slice_of(9, 1_000_000 + sec * 20_000, 20_000, "/flood");
        push.records.extend(flood.records);
        push.times.extend(flood.times);
        push.samples.extend(flood.samples);
        store.push(at(sec), at(sec + 1), push);
        assert!(store.bytes() <= 2 << 20, "{} bytes", store.bytes());
    }
    // Every span of the quiet one is still known by id; the flood's
    // oldest were folded (counted).
    assert_eq!(spans_held_of(&store, 8), 30 * 20);
    assert!(spans_held_of(&store, 9) < 30 * 20_000);
    let stats = store.stats();
    assert!(stats.aggregated_spans + stats.refused_rows > 0, "{stats:?}");
}

#[test]
fn a_stack_many_rows_share_is_counted_once() {
    // Clones, for equal capacities.
    let distinct = slice(0, 100, "/a").clone();
    let mut shared = distinct.clone();
    let one = shared.samples[0].stack.clone();
    for s in &mut shared.samples {
        s.stack = one.clone();
    }
    let bytes = |spans: SpanSlice| {
        let mut store = SpanStore::new(Duration::from_secs(600), DEFAULT_MAX_BYTES);
        store.push(at(0), at(1), spans);
        let view = store.view();
        view.buckets[0].bytes
    };
    let (d, s) = (bytes(distinct), bytes(shared));
    let stack = crate::profile::model::size::stack_bytes(&one);
    assert_eq!(d - s, 99 * stack, "{d} B with 100 stacks, {s} B with one");
}
